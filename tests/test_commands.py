"""The command language: every command, every error, and a fuzz proving the parser never raises."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.commands import (
    COMMANDS,
    BenchRequest,
    CancelRequest,
    CompareRequest,
    HelpRequest,
    LaunchRequest,
    ParseError,
    QueueRequest,
    RunsRequest,
    StatusRequest,
    StopRequest,
    SweepRequest,
    help_text,
    parse,
    parse_command,
)
from workers.config import parse_config
from workers.presets import build_launch

CONFIG = parse_config(
    """
default_host = "gpu-1"
[engine]
flags = { "--tp-size" = 8, "--disable-custom-all-reduce" = true }
[hosts.gpu-1]
[hosts.gpu-2]
port = 30001
[limits]
max_levels = 4
max_concurrency = 512
"""
    + __import__("workers.config", fromlist=["SEED_PRESETS_TOML"]).SEED_PRESETS_TOML
)


def ok(text):
    result = parse(text, CONFIG)
    assert not isinstance(result, ParseError), result
    return result


def refused(text):
    result = parse(text, CONFIG)
    assert isinstance(result, ParseError), result
    return result.message


# ------------------------------------------------------------------ each command


def test_launch_with_presets_flags_host_and_then_bench():
    req = ok("/launch nextn cudnn --mem-fraction-static 0.85 --enable-metrics on gpu-2 then bench 1,8,32 out=64")
    assert isinstance(req, LaunchRequest)
    assert req.host == "gpu-2"
    assert req.config.presets == ("nextn", "cudnn")
    assert req.config.flags == (("--mem-fraction-static", "0.85"), ("--enable-metrics", True))
    assert req.then_bench.levels == (1, 8, 32) and req.then_bench.output_len == 64


def test_launch_defaults_to_the_default_host_and_quotes_group_values():
    req = ok('/launch cutlass --served-model-name "qwen big"')
    assert req.host == "gpu-1"
    assert req.config.flags == (("--served-model-name", "qwen big"),)


def test_bench_levels_options_host_and_any():
    req = ok("/bench 32,1, 8 in=512 out=128 n=64 warmup=2 on gpu-2 any")
    assert isinstance(req, BenchRequest)
    assert req.spec.levels == (1, 8, 32)
    assert (req.spec.input_len, req.spec.output_len, req.spec.num_requests, req.spec.warmup) == (512, 128, 64, 2)
    assert req.host == "gpu-2" and req.any_config


def test_bench_defaults():
    req = ok("bench 1")
    assert req.spec.input_len == 1024 and req.spec.output_len == 256
    assert req.spec.num_requests is None and req.spec.warmup is None and not req.any_config


def test_status_queue_stop_cancel_help():
    assert ok("/status") == StatusRequest(host=None)
    assert ok("/status gpu-2") == StatusRequest(host="gpu-2")
    assert ok("/queue on gpu-1") == QueueRequest(host="gpu-1")
    assert ok("/stop") == StopRequest(host="gpu-1")
    assert ok("/stop gpu-2") == StopRequest(host="gpu-2")
    assert ok("/cancel 17") == CancelRequest(job_id="17")
    assert ok("/cancel #17") == CancelRequest(job_id="17")
    assert ok("/cancel job-17") == CancelRequest(job_id="17")
    assert ok("/help") == HelpRequest(topic=None)
    assert ok("/help /launch") == HelpRequest(topic="launch")


def test_runs_list_filter_and_tag():
    assert ok("/runs") == RunsRequest(limit=10, filter=None)
    assert ok("/runs 5 nextn") == RunsRequest(limit=5, filter="nextn")
    assert ok("/runs tag r12 baseline") == RunsRequest(tag_run="r12", tag="baseline")
    assert ok("/runs tag 12 baseline").tag_run == "r12"


def test_compare_and_sweep():
    assert ok("/compare r3 r5, r7") == CompareRequest(run_ids=("r3", "r5", "r7"))
    req = ok("/sweep cutlass cudnn, nextn cudnn, nextn cudnn customar bench 1,8,32 on gpu-2")
    assert isinstance(req, SweepRequest)
    assert [c.presets for c in req.configs] == [
        ("cutlass", "cudnn"),
        ("nextn", "cudnn"),
        ("nextn", "cudnn", "customar"),
    ]
    assert req.spec.levels == (1, 8, 32) and req.host == "gpu-2"


def test_slack_form_gives_name_and_text_separately():
    assert parse_command("/bench", "1,8", CONFIG) == ok("/bench 1,8")


def test_every_parsed_launch_builds_a_valid_spec():
    req = ok("/launch nextn cudnn customar")
    spec = build_launch(CONFIG, CONFIG.hosts[req.host], req.config.presets, req.config.flags)
    assert "--disable-custom-all-reduce" not in spec.argv


# ------------------------------------------------------------------ friendly errors


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/launch nextnn", 'unknown preset "nextnn" (did you mean "nextn"?)'),
        ("/launch nextn on gpu-3", 'unknown host "gpu-3" (did you mean "gpu-'),
        ("/launch cutlass trtllm", '"cutlass" and "trtllm" are both moe presets'),
        ("/launch cudnn fp4-cutlass", "both fp4 presets"),
        ("/launch nextn cudnn; rm -rf /", "never runs shell commands: ';'"),
        ("/launch nextn --served-model-name $(reboot)", "never runs shell commands: '$'"),
        ("/launch nextn --x `id`", "'`'"),
        ("/launch nextn -x 1", "engine flags look like --lower-case-words"),
        ("/launch nextn --Bad-Flag 1", "engine flags look like --lower-case-words"),
        ("/launch nextn --a 'unterminated", "unbalanced quotes"),
        ("/launch", "say what to launch"),
        ("/launch nextn then stop", 'after "then" comes "bench LEVELS"'),
        ("/launch nextn --port 1", "set by benchbot from the host config"),
        ("/bench 0,8", "concurrency levels start at 1"),
        ("/bench -8", "at least 1, not -8"),
        ("/bench 1,1", "level 1 is given twice"),
        ("/bench one,two", '"one" is not a concurrency level'),
        ("/bench 1,2,4,8,16", "at most 4 concurrency levels"),
        ("/bench 1024", "above this team's maximum of 512"),
        ("/bench", "give the concurrency levels"),
        ("/bench 1,8 in=0", "in=0: a length is at least 1 token"),
        ("/bench 1,8 out=lots", "out=lots is not a length"),
        ("/bench 1,8 rate=2", "not both"),
        ("/bench 8 data=nowhere", "unknown dataset"),
        ("/bench 8 in=dataset", "needs a dataset"),
        ("/bench 8 api=chatt", 'did you mean "chat"'),
        ("/bench 4 duration=3s", "is for an open loop"),
        ("/bench rate=0", "more than zero"),
        ("/bench rate=5000 duration=1h", "above this team's maximum"),
        ("/bench 8 in=64 prefix=64", "shorter than the shortest prompt"),
        ("/bench 1,8 n=4", "n=4 is fewer requests than the highest concurrency (8)"),
        ("/bench 1,8 inn=5", 'unknown option "inn=" (did you mean "in="?)'),
        ("/bench 1,8 in=5 in=6", '"in=" is given twice'),
        ("/bench 1 fast", 'unexpected "fast"'),
        ("/cancel", "which job?"),
        ("/cancel seventeen", "job numbers look like"),
        ("/compare r1", "compare at least two runs"),
        ("/compare r1 r1", "a run is named twice"),
        ("/compare r1 x", '"x" is not a run id'),
        ("/runs tag r1 Bad Tag", "tag a run like"),
        ("/runs tag r1 BAD", "tags are lower-case words"),
        ("/sweep cutlass, nextn", 'a sweep ends with "bench LEVELS"'),
        ("/sweep cutlass,, nextn bench 1", "each configuration between commas"),
        ("/sweep cutlass, cutlass bench 1", "the same configuration is listed twice"),
        ("/status gpu-9", 'unknown host "gpu-9"'),
        ("/status gpu-1 extra", 'unexpected "extra"'),
        ("/help lanch", 'no command "/lanch" (did you mean "launch"?)'),
        ("/luanch nextn", 'no command "/luanch" (did you mean "launch"?)'),
        ("", "type a command"),
        ("/launch nextn\nrm -rf /", "a command is one line"),
        ("/launch nextn \x07", "control characters"),
        ("/launch " + "a" * 2000, "longer than 1000 characters"),
    ],
)
def test_bad_input_gets_a_clear_message(text, expected):
    assert expected in refused(text)


def test_help_lists_every_command_with_a_description_and_the_presets():
    text = help_text(None, CONFIG)
    for name, spec in COMMANDS.items():
        assert f"/{name}" in text and spec.summary in text
    for preset in CONFIG.presets:
        assert preset in text
    assert "/launch <presets...>" in help_text("launch", CONFIG)


# ------------------------------------------------------------------ the parser never raises


WORDS = st.sampled_from(
    [
        "/launch",
        "/bench",
        "/sweep",
        "/status",
        "/queue",
        "/cancel",
        "/stop",
        "/runs",
        "/compare",
        "/help",
        "nextn",
        "cudnn",
        "cutlass",
        "on",
        "then",
        "bench",
        "any",
        "gpu-1",
        "1,8,32",
        "0",
        "-1",
        ",",
        "tag",
        "r1",
        "in=5",
        "n=",
        "--flag",
        "--x",
        "'",
        '"',
        ";",
        "$(",
        "`",
        "\n",
        "\x00",
        "é",
        "🚀",
        "=",
        "--",
    ]
)


@settings(max_examples=3000, deadline=None)
@given(st.lists(WORDS, max_size=12).map(" ".join))
def test_parser_never_raises_on_command_like_strings(text):
    result = parse(text, CONFIG)
    assert (isinstance(result, ParseError) and result.message) or hasattr(result, "command")


@settings(max_examples=2000, deadline=None)
@given(st.text(max_size=200))
def test_parser_never_raises_on_arbitrary_text(text):
    result = parse(text, CONFIG)
    if isinstance(result, ParseError):
        assert result.message and "Traceback" not in result.message
        assert "could not understand" not in result.message  # no internal error path was taken


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from(list(COMMANDS)), st.text(max_size=120))
def test_slack_form_never_raises_and_valid_launches_always_build(name, text):
    result = parse_command(name, text, CONFIG)
    if isinstance(result, LaunchRequest):
        build_launch(CONFIG, CONFIG.hosts[result.host], result.config.presets, result.config.flags)
    elif isinstance(result, ParseError):
        assert "could not understand" not in result.message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/bench １,８", "is not a concurrency level"),
        ("/bench 1 n=１０", "n= must be a whole number"),
        ("/bench rate=２", "rate="),
        ("/bench rate=2 duration=１m", "duration="),
        ("/bench 1 in=１０２４", "in="),
        ("/bench 1 in=٥١٢-١٠٢٤", "in="),  # Arabic-Indic digits
        ("/bench slo ttft=500ms errors=５%", "errors="),
        ("/runs ５", "a filter is one word"),
        ("/cancel ３", "job numbers look like"),
        ("/compare r１ r2", "is not a run id"),
    ],
)
def test_only_ascii_digits_are_numbers(text, expected):
    """Issue 25 item 7: ``\\d`` and ``float()`` take fullwidth and other scripts' digits; the grammar must not."""
    assert expected in refused(text)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("/launch cutlass --served-model-name ab\u202etxt.exe", "U+202E"),  # right-to-left override
        ("/launch cutlass --served-model-name a\u2066b\u2069", "U+2066"),  # left-to-right isolate
        ("/launch cutlass --served-model-name a\u200bb", "U+200B"),  # zero-width space
        ("/bench 1 n=8\u2028in=64", "U+2028"),  # line separator
        ("/runs tag r1 base\u200dline", "U+200D"),
    ],
)
def test_bidi_overrides_and_other_invisible_characters_are_refused(text, code):
    message = refused(text)
    assert code in message and "invisible character" in message, message
