"""Dataset files (ShareGPT, OpenAI messages, plain prompts) and token counting without a tokenizer download.

The ``/tokenize`` tests run against a real aiohttp server on 127.0.0.1 that answers in the shape of
SGLang's ``TokenizeResponse`` (``sglang/srt/entrypoints/openai/serving_tokenize.py``, 0.5.9 and 0.5.23),
with a whitespace tokenizer so the expected counts are obvious.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.util import free_port
from workers.benchmark import tokens as tok
from workers.benchmark.dataset import conversation_of, load_dataset
from workers.errors import BenchbotError


def _write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def _sharegpt(i: int, words: int = 40, reply_words: int = 20) -> dict[str, Any]:
    return {
        "id": f"c{i}",
        "conversations": [
            {"from": "human", "value": " ".join(["ask"] * words) + f" number {i}"},
            {"from": "gpt", "value": " ".join(["say"] * reply_words)},
            {"from": "human", "value": "and a second turn that is not used"},
        ],
    }


# --- reading files ----------------------------------------------------------------------------------------


def test_sharegpt_jsonl_file_is_read_first_turn_pair(tmp_path):
    path = _write_jsonl(tmp_path / "share.jsonl", [_sharegpt(i) for i in range(5)])
    ds = load_dataset(path)
    assert len(ds) == 5 and ds.skipped == 0 and ds.counted_by == tok.APPROX
    first = ds.items[0]
    assert first.line == 1
    assert first.messages == (("user", " ".join(["ask"] * 40) + " number 0"),)
    assert first.reply == " ".join(["say"] * 20)
    assert first.input_tokens == tok.approx_tokens(first.prompt_text)
    assert first.reply_tokens == tok.approx_tokens(first.reply)
    assert first.chat_messages() == [{"role": "user", "content": first.messages[0][1]}]


def test_openai_messages_plain_prompts_and_system_turns(tmp_path):
    records = [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Describe"},
                        {"type": "image_url", "image_url": {"url": "x"}},
                        {"type": "text", "text": "this."},
                    ],
                },
                {"role": "assistant", "content": "A cat."},
            ]
        },
        {"prompt": "Write a haiku.", "completion": "Autumn moonlight"},
        {"prompt": "No reply here."},
    ]
    ds = load_dataset(_write_jsonl(tmp_path / "oai.jsonl", records))
    a, b, c = ds.items
    assert a.messages == (("system", "Be brief."), ("user", "Describe\nthis."))
    assert a.prompt_text == "Be brief.\n\nDescribe\nthis."
    assert a.reply == "A cat."
    assert (b.messages, b.reply) == ((("user", "Write a haiku."),), "Autumn moonlight")
    assert c.reply is None and c.reply_tokens is None


def test_json_array_file_as_sharegpt_ships(tmp_path):
    path = tmp_path / "ShareGPT_V3.json"
    path.write_text(json.dumps([_sharegpt(i) for i in range(3)]), encoding="utf-8")
    ds = load_dataset(path)
    assert [c.line for c in ds.items] == [1, 2, 3]


def test_unusable_records_are_skipped_and_counted(tmp_path):
    records = [
        _sharegpt(0),
        {"conversations": [{"from": "gpt", "value": "I speak first"}, {"from": "human", "value": "hi"}]},
        {"conversations": [{"from": "human", "value": "   "}]},
        {"conversations": [{"from": "narrator", "value": "once upon"}]},
        {"text": "unknown shape"},
        [1, 2, 3],
        _sharegpt(1),
    ]
    ds = load_dataset(_write_jsonl(tmp_path / "mixed.jsonl", records))
    assert len(ds) == 2 and ds.skipped == 5
    assert ds.skip_samples == (
        "line 2: the conversation starts with the assistant",
        "line 3: the first user turn has no text",
        'line 4: unknown speaker "narrator"',
        'line 5: no "conversations", "messages" or "prompt" field',
        "line 6: not a JSON object",
    )


def test_max_records_stops_early(tmp_path):
    ds = load_dataset(_write_jsonl(tmp_path / "d.jsonl", [_sharegpt(i) for i in range(50)]), max_records=7)
    assert len(ds) == 7


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "does not exist"),
        (b"", "is empty"),
        (b'{"prompt": "ok"}\n{"prompt": \n', r"line 2 of dataset file bad\.jsonl is not valid JSON"),
        (b"\xff\xfe\x00garbage", "is not UTF-8"),
        (b'{"text": "a"}\n{"text": "b"}\n', 'has no usable conversations .line 1: no "conversations"'),
        (b"[1, 2", "starts like a JSON array but is not valid JSON"),
    ],
)
def test_bad_files_fail_with_a_friendly_error(tmp_path, content, needle):
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(BenchbotError, match=needle):
        load_dataset(path)


def test_a_directory_is_not_a_dataset(tmp_path):
    with pytest.raises(BenchbotError, match="is not a file"):
        load_dataset(tmp_path)


def test_conversation_of_reports_why():
    with pytest.raises(ValueError, match="no user turn"):
        conversation_of({"messages": [{"role": "system", "content": "x"}]})
    with pytest.raises(ValueError, match='"messages" is not a list'):
        conversation_of({"messages": "hello"})


# --- sampling ---------------------------------------------------------------------------------------------


def test_sampling_is_deterministic_and_uses_every_prompt_before_repeating(tmp_path):
    ds = load_dataset(_write_jsonl(tmp_path / "d.jsonl", [_sharegpt(i) for i in range(10)]))
    a = ds.sample(25, seed=4)
    assert [c.line for c in a] == [c.line for c in ds.sample(25, seed=4)]
    assert [c.line for c in a] != [c.line for c in ds.sample(25, seed=5)]
    assert sorted(c.line for c in a[:10]) == list(range(1, 11))  # a full pass before any repeat
    assert sorted(c.line for c in a[10:20]) == list(range(1, 11))


def test_sampling_filters_by_length_and_reply(tmp_path):
    records = [_sharegpt(i, words=10 * (i + 1)) for i in range(6)] + [{"prompt": "short, no reply"}]
    ds = load_dataset(_write_jsonl(tmp_path / "d.jsonl", records))
    lo, hi = ds.items[2].input_tokens, ds.items[4].input_tokens
    chosen = ds.sample(30, seed=1, input_range=(lo, hi))
    assert {c.line for c in chosen} == {3, 4, 5}
    assert all(c.reply_tokens for c in ds.sample(30, seed=1, need_reply=True))
    with pytest.raises(BenchbotError, match=r"no conversation in d\.jsonl has a prompt of 100000-200000 tokens"):
        ds.sample(3, seed=1, input_range=(100000, 200000))


# --- token counts -----------------------------------------------------------------------------------------


def test_approximation_is_four_bytes_a_token():
    assert tok.approx_tokens("") == 1
    assert tok.approx_tokens("abcd") == 1
    assert tok.approx_tokens("abcde") == 2
    assert tok.approx_tokens("é" * 4) == 2  # 8 UTF-8 bytes
    msgs = [{"role": "system", "content": "abcd"}, {"role": "user", "content": "abcdefgh"}]
    assert tok.approx_chat_tokens(msgs) == (1 + 4) + (2 + 4) + 3


class TokenizeServer:
    """A real HTTP server on 127.0.0.1 answering ``POST /tokenize`` like SGLang (whitespace tokens)."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.bodies: list[dict[str, Any]] = []
        self.port = free_port()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        if self.status != 200:
            return web.json_response({"object": "error", "message": "nope"}, status=self.status)
        prompts = body["prompt"]
        ids = [[hash(w) % 1000 for w in p.split()] for p in prompts]
        return web.json_response({"tokens": ids, "count": [len(x) for x in ids], "max_model_len": 32768})

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/tokenize", self._tokenize)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> TokenizeServer:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def tokenize_server() -> Iterator[TokenizeServer]:
    with TokenizeServer() as server:
        yield server


def test_server_counts_tokens_in_batches_behind_the_gate(tokenize_server, tmp_path):
    ds = load_dataset(_write_jsonl(tmp_path / "d.jsonl", [_sharegpt(i, words=i + 1) for i in range(5)]))
    gate_calls = []
    counts = asyncio.run(
        tok.server_token_counts(tokenize_server.url, ds.texts(), batch=2, gate=lambda: gate_calls.append(1), model="m")
    )
    assert counts.counts == tuple(i + 1 + 2 for i in range(5))  # "ask" x (i+1), "number", str(i)
    assert counts.max_model_len == 32768
    assert len(tokenize_server.bodies) == 3 and len(gate_calls) == 3
    assert tokenize_server.bodies[0] == {"prompt": ds.texts()[:2], "add_special_tokens": False, "model": "m"}
    exact = ds.with_token_counts(counts.counts, [20] * 5)
    assert [c.input_tokens for c in exact.items] == list(counts.counts)
    assert exact.counted_by == tok.SERVER


def test_a_gate_that_refuses_stops_before_any_request(tokenize_server):
    def refuse() -> None:
        raise BenchbotError("lease lost")

    with pytest.raises(BenchbotError, match="lease lost"):
        asyncio.run(tok.server_token_counts(tokenize_server.url, ["a b"], gate=refuse))
    assert tokenize_server.bodies == []


def test_server_without_tokenize_gets_a_clear_error():
    with TokenizeServer(status=404) as server, pytest.raises(BenchbotError, match="has no /tokenize endpoint"):
        asyncio.run(tok.server_token_counts(server.url, ["a b"]))
    with pytest.raises(BenchbotError, match="could not ask"):
        asyncio.run(tok.server_token_counts(f"http://127.0.0.1:{free_port()}", ["a"]))


def test_tokenize_response_is_checked():
    assert tok.parse_tokenize_response({"count": 3, "max_model_len": -1}, 1) == tok.ServerCounts((3,), None)
    with pytest.raises(BenchbotError, match="has 1 counts for 2 prompts"):
        tok.parse_tokenize_response({"count": [1]}, 2)
    with pytest.raises(BenchbotError, match="no token counts"):
        tok.parse_tokenize_response({"error": "x"}, 1)


# --- hostile files (issue 25 item 7) --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"prompt": "ok"}\n{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "line 2 .* nested too deeply"),
        (b'[{"prompt": "ok"}, ' + b"[" * 100_000 + b"]" * 100_000 + b"]", "element 2 is nested too deeply"),
        (b'[{"prompt": "ok"}] {"prompt": "x"}', "something follows the closing"),
        (b'[{"prompt": "ok"} {"prompt": "x"}]', "expected ',' or ']' after element 1"),
    ],
)
def test_deeply_nested_or_broken_records_fail_with_a_friendly_error(tmp_path, content, needle):
    """A nested line used to end the job with "internal error: RecursionError"."""
    path = tmp_path / "deep.jsonl"
    path.write_bytes(content)
    with pytest.raises(BenchbotError, match=needle):
        load_dataset(path)


@pytest.mark.parametrize("as_array", [False, True])
def test_a_10mb_prompt_is_skipped_as_too_large_and_counted(tmp_path, as_array):
    """No model takes a 10 MB prompt; sent, every request of the level failed (issue 25 item 7)."""
    huge = {"prompt": "word " * (2 * 2**20)}
    records = [_sharegpt(1), huge, _sharegpt(2)]
    path = tmp_path / "huge.json"
    if as_array:
        path.write_text(json.dumps(records), encoding="utf-8")
    else:
        _write_jsonl(path, records)
    dataset = load_dataset(path)
    assert [c.line for c in dataset.items] == [1, 3] and dataset.skipped == 1
    assert "line 2: a record of 10.0 MiB; one may be at most 1 MiB" in dataset.skip_samples[0]
    only = tmp_path / "only.jsonl"
    _write_jsonl(only, [huge])
    with pytest.raises(BenchbotError, match=r"no usable conversations .line 1: a record of 10\.0 MiB"):
        load_dataset(only)


def test_a_large_json_array_is_parsed_a_record_at_a_time_so_other_threads_keep_running(tmp_path):
    """A 60 MB array used to be one ``json.loads`` holding the GIL for a second or more: the job's lease
    heartbeat (a thread of the same process) starved and the lease was lost (issue 25 item 7)."""
    import time

    path = tmp_path / "big.json"
    with path.open("w", encoding="utf-8") as f:
        f.write("[")
        for i in range(60_000):
            f.write(("," if i else "") + json.dumps(_sharegpt(i, words=150, reply_words=60)))
        f.write("]")
    assert path.stat().st_size > 55 * 2**20
    gaps: list[float] = []
    done = threading.Event()

    def tick() -> None:  # what the heartbeat needs: to run now and then
        last = time.monotonic()
        while not done.is_set():
            time.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        dataset = load_dataset(path)
    finally:
        done.set()
        ticker.join(timeout=5)
    assert len(dataset) == 60_000
    assert len(gaps) > 10 and max(gaps) < 0.3, f"another thread was held off for {max(gaps):.2f} s"
