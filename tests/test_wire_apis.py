"""The table of wire APIs: the only place the client names an API, byte-identical bodies, unknown names refused.

The round trip of every entry (its body sent, its stream read) against the real simulator is in
tests/test_bench_shapes.py, beside the simulator that module already runs.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from workers.benchmark import wire_apis
from workers.benchmark.lengths import Fixed
from workers.benchmark.prompts import Prompt, plan_prompts
from workers.benchmark.settings import ClientSettings
from workers.benchmark.spec import APIS, BenchSpec
from workers.benchmark.stream import RawResponse, record_from_raw
from workers.errors import BenchbotError

BENCHMARK = Path(wire_apis.__file__).parent
WORKERS = BENCHMARK.parent
IDS = Prompt(0, 3, 5, True, token_ids=(1001, 1002, 1003))
TEXT = Prompt(1, 4, 6, False, text="hello there you all")
MESSAGES = Prompt(2, 9, 7, False, messages=(("system", "be brief"), ("user", "the and for")))
OPENAI_TAIL = (
    '"temperature":0,"ignore_eos":true,"stream":true,'
    '"stream_options":{"include_usage":true,"continuous_usage_stats":true}}'
)
SGLANG_HEAD = '{"sampling_params":{"max_new_tokens":%d,"temperature":0,"ignore_eos":true},"stream":true,'

#: What the client sent before the table (main at the time of the change), byte for byte.
GOLDEN = {
    ("generate", IDS): SGLANG_HEAD % 5 + '"input_ids":[1001,1002,1003]}',
    ("generate", TEXT): SGLANG_HEAD % 6 + '"text":"hello there you all"}',
    ("generate", MESSAGES): SGLANG_HEAD % 7 + '"text":"be brief\\n\\nthe and for"}',
    ("completions", IDS): '{"model":"m-1","prompt":[1001,1002,1003],"max_tokens":5,' + OPENAI_TAIL,
    ("completions", TEXT): '{"model":"m-1","prompt":"hello there you all","max_tokens":6,' + OPENAI_TAIL,
    ("completions", MESSAGES): '{"model":"m-1","prompt":"be brief\\n\\nthe and for","max_tokens":7,' + OPENAI_TAIL,
    ("chat", TEXT): '{"model":"m-1","messages":[{"role":"user","content":"hello there you all"}],"max_tokens":6,'
    + OPENAI_TAIL,
    ("chat", MESSAGES): '{"model":"m-1","messages":[{"role":"system","content":"be brief"},'
    '{"role":"user","content":"the and for"}],"max_tokens":7,' + OPENAI_TAIL,
}


@pytest.mark.parametrize(("api", "prompt"), list(GOLDEN), ids=lambda v: v if isinstance(v, str) else f"p{v.index}")
def test_each_entrys_body_is_byte_identical_to_the_client_before_the_table(api: str, prompt: Prompt) -> None:
    assert wire_apis.wire_api(api).encode_body(prompt, "m-1") == GOLDEN[api, prompt].encode()


def test_unknown_api_is_refused_by_name_with_the_known_ones_everywhere_it_can_enter() -> None:
    known = "generate, completions, chat"
    assert APIS == tuple(wire_apis.WIRE_APIS) == ("generate", "completions", "chat")
    with pytest.raises(BenchbotError, match=f'unknown API "grpc": use one of {known}$'):
        wire_apis.wire_api("grpc")
    with pytest.raises(BenchbotError, match=f'unknown API "chat-ish": use one of {known}$'):
        ClientSettings(BenchSpec(levels=(1,), api="chat-ish"))
    with pytest.raises(BenchbotError, match='unknown API "Chat"'):
        plan_prompts(1, 0, api="Chat", input_len=Fixed(4), output_len=Fixed(4))
    with pytest.raises(BenchbotError, match='unknown API "v1"'):
        record_from_raw(RawResponse(0, 1, ((1, b"data: [DONE]\n\n"),)), "v1", 4)


def _names_outside_the_table(path: Path) -> list[str]:
    """Every string literal in ``path`` that is an API's name or path (docstrings are whole sentences)."""
    words = {name for name in wire_apis.WIRE_APIS} | {api.path for api in wire_apis.WIRE_APIS.values()}
    tree = ast.parse(path.read_text())
    return [
        f"{path.relative_to(WORKERS)} {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in words
    ]


def test_the_table_is_the_only_place_in_the_clients_that_names_an_api() -> None:
    """The bench client and the eval runner speak the APIs only through the table."""
    found = [
        hit
        for package in (BENCHMARK, WORKERS / "evaluation")
        for path in sorted(package.glob("*.py"))
        if path.name != "wire_apis.py"
        for hit in _names_outside_the_table(path)
    ]
    # The names outside: which API each uses when none is asked for (defaults, not branches).
    assert found == ["benchmark/spec.py 'generate'", "evaluation/runner.py 'chat'"]
    # ...and the check sees a name where one is written: the table itself is full of them.
    assert len(_names_outside_the_table(BENCHMARK / "wire_apis.py")) >= 2 * len(wire_apis.WIRE_APIS)


def test_each_reader_counts_its_own_apis_events_and_not_anothers() -> None:
    events = {
        "generate": {"text": "ab", "meta_info": {"prompt_tokens": 3, "completion_tokens": 2}},
        "completions": {"choices": [{"text": "ab"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
        "chat": {"choices": [{"delta": {"content": "ab"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    }
    for name, api in wire_apis.WIRE_APIS.items():
        for other, event in events.items():
            reading = api.read_event(json.loads(json.dumps(event)), 0)
            if other == name:
                assert reading == (2, 3, True, None, None), name
            else:
                assert reading[2] is False, (name, other)  # another API's event carries no output here


def test_every_engines_default_bench_api_is_a_table_entry() -> None:
    """A plain /bench on an engine uses its driver's API (``workers/jobs/bench_run.py``): it must be in the table."""
    from workers.engines.registry import drivers

    defaults = {type(d).__name__: d.default_bench_api for d in drivers()}
    assert len(defaults) >= 3 and set(defaults.values()) <= set(wire_apis.WIRE_APIS), defaults
