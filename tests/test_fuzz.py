"""Bad input, fuzzed end to end: the dispatcher against a real Redis, and structured config documents.

``tests/test_commands.py`` and ``tests/test_config.py`` already fuzz the parser and the loader in
isolation. Here the promise is the one that matters on a shared box: whatever a person types, the
dispatcher never raises, a refusal enqueues nothing and says why, and every job that *is* enqueued
carries a payload the worker can run (its launch rebuilds to the same argv, its levels are in bounds).
"""

from __future__ import annotations

import copy
import json
import string
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bot.dispatch import Dispatcher
from workers.benchmark.spec import BenchSpec
from workers.config import SEED_PRESETS_TOML, Config, parse_config
from workers.errors import BenchbotError, ConfigError
from workers.jobs import events, queue
from workers.presets import LaunchIntent, build_launch

CONFIG = parse_config(
    """
default_host = "gpu-1"
[engine]
command = ["python3", "-m", "sglang.launch_server"]
flags = { "--tp-size" = 8, "--disable-custom-all-reduce" = true }
[hosts.gpu-1]
[hosts.gpu-2]
port = 30001
[access]
users = ["alice", "bob", "root"]
channels = ["C1"]
admins = ["root"]
[limits]
max_levels = 4
max_concurrency = 512
max_requests = 5000
max_tokens = 8192
max_queued_per_user = 3
max_sweep_configs = 3
"""
    + SEED_PRESETS_TOML,
    "fuzz-dispatch.toml",
)

KINDS = {"launch", "bench", "stop", "sweep"}

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
        "/launch",
        "/bench",
        "/sweep",  # the job commands twice as often
        "nextn",
        "cudnn",
        "cutlass",
        "trtllm",
        "cutedsl",
        "customar",
        "mscclpp",
        "fp4-cutlass",
        "nope",
        "on",
        "gpu-1",
        "gpu-2",
        "gpu-9",
        "then",
        "bench",
        "any",
        ",",
        "tag",
        "baseline",
        "r1",
        "#1",
        "1",
        "1,4",
        "1,8,32",
        "0",
        "-1",
        "1,1",
        "1,2,4,8,16",
        "4096",
        "in=64",
        "out=16",
        "n=8",
        "n=2",
        "warmup=0",
        "in=0",
        "in=99999",
        "n=",
        "=",
        "--",
        "--served-model-name",
        "--chat-template",
        "x'y",
        '"a b"',
        "'it''s'",
        "--port",
        "1",
        "--tp-size",
        "2",
        "--model-path",
        "/m",
        "--Bad",
        "-x",
        "--enable-mscclpp",
        ";",
        "$(id)",
        "`id`",
        "|",
        "&&",
        ">",
        "\\",
        "\n",
        "\x00",
        "\x7f",
        "é",
        "🚀",
        "(",
        ")",
        "{",
        "}",
    ]
)
PRESET_WORDS = st.lists(
    st.sampled_from(["nextn", "cudnn", "cutlass", "trtllm", "customar", "mscclpp", "fp4-cutlass"]),
    min_size=1,
    max_size=2,
    unique=True,
)
FLAG_PAIRS = st.lists(
    st.sampled_from(
        [
            '--served-model-name "x\'y (z)"',
            "--chat-template 'a \"b\"'",
            "--enable-mscclpp",
            "--revision main",
            "--tp-size 4",
            "--port 1",
            "--x",
            "--mem-fraction-static 0.8",
        ]
    ),
    max_size=1,
)
LEVELS = st.lists(st.sampled_from([1, 2, 4, 8, 32, 512, 1, 4, 513, 0]), min_size=1, max_size=4).map(
    lambda xs: ",".join(map(str, xs))
)
BENCH_OPTS = st.lists(
    st.sampled_from(["in=64", "out=16", "n=600", "warmup=0", "in=9000", "any"]), max_size=3, unique=True
)
HOSTS = st.sampled_from(["", "", " on gpu-1", " on gpu-2", " on gpu-9"])
CONFIG_WORDS = st.builds(lambda p, f: " ".join([*p, *f]), PRESET_WORDS, FLAG_PAIRS)
BENCH_TAIL = st.builds(lambda lv, opts: " ".join([lv, *opts]), LEVELS, BENCH_OPTS)
SHAPED = st.one_of(
    st.builds(
        lambda c, h, b: f"/launch {c}{h}" + (f" then bench {b}" if b else ""),
        CONFIG_WORDS,
        HOSTS,
        st.one_of(st.none(), BENCH_TAIL),
    ),
    st.builds(lambda b, h: f"/bench {b}{h}", BENCH_TAIL, HOSTS),
    st.builds(
        lambda cs, b, h: f"/sweep {', '.join(cs)} bench {b}{h}",
        st.lists(CONFIG_WORDS, min_size=1, max_size=4),
        BENCH_TAIL,
        HOSTS,
    ),
    st.builds(lambda h: f"/stop{h}", HOSTS),
)


def _mutate(line: str, data: st.DataObject) -> str:
    """Sometimes splice a hostile or stray word into an otherwise well-formed command."""
    words = line.split(" ")
    if data.draw(st.integers(0, 3)) == 0:
        words.insert(data.draw(st.integers(1, len(words))), data.draw(WORDS))
    return " ".join(words)


LINES = st.one_of(
    SHAPED,
    SHAPED,
    SHAPED,
    SHAPED,
    st.lists(WORDS, min_size=1, max_size=12).map(" ".join),
    st.text(max_size=120),
    st.builds(
        lambda cmd, rest: f"{cmd} {rest}",
        st.sampled_from(["/launch", "/bench", "/sweep", "/cancel"]),
        st.text(alphabet=string.printable, max_size=80),
    ),
)
PEOPLE = st.sampled_from([("alice", "C1"), ("bob", "C1"), ("root", "C9"), ("mallory", "C1"), ("alice", "C9")])


def _rq_lengths(r: redis.Redis) -> int:
    return sum(int(r.llen(queue.host_queue(r, host).key)) for host in CONFIG.hosts)


def _queued_events(r: redis.Redis) -> int:
    return sum(1 for _, f in r.xrange(events.GLOBAL_STREAM) if json.loads(f[b"event"])["type"] == events.QUEUED)


def assert_valid_launch(data: dict[str, Any], host: str) -> None:
    """The launch in a payload is an intent the worker compiles into an argv of safe words."""
    intent = LaunchIntent.from_dict(data)
    assert intent.to_dict() == data
    spec = build_launch(CONFIG, CONFIG.host(host), intent.presets, intent.raw_flags)
    for part in spec.argv:
        assert isinstance(part, str) and part
        assert not any(ord(c) < 32 or c in "\x7f;$`|&<>\\" for c in part), part


def assert_valid_bench(data: dict[str, Any]) -> None:
    """Levels within the team's limits, request shape within bounds."""
    spec = BenchSpec.from_dict(data)
    limits = CONFIG.limits
    assert 1 <= len(spec.levels) <= limits.max_levels
    assert list(spec.levels) == sorted(set(spec.levels))
    assert all(1 <= level <= limits.max_concurrency for level in spec.levels)
    assert 1 <= spec.input_len <= limits.max_tokens and 1 <= spec.output_len <= limits.max_tokens
    if spec.num_requests is not None:
        assert max(spec.levels) <= spec.num_requests <= limits.max_requests


def assert_valid_payload(payload: dict[str, Any], user: str, channel: str) -> None:
    """What the worker will run: a schema-1 payload of a known kind whose parts all rebuild."""
    assert payload["schema"] == 1 and payload["kind"] in KINDS
    assert payload["user"] == user and payload["channel"] == channel
    host = payload["host"]
    assert host in CONFIG.hosts
    if payload["kind"] == "launch":
        assert_valid_launch(payload["launch"], host)
        if payload.get("bench") is not None:
            assert_valid_bench(payload["bench"])
    elif payload["kind"] == "bench":
        assert_valid_bench(payload["bench"])
    elif payload["kind"] == "sweep":
        assert 1 <= len(payload["configs"]) <= CONFIG.limits.max_sweep_configs
        for launch in payload["configs"]:
            assert_valid_launch(launch, host)
        assert_valid_bench(payload["bench"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=LINES, who=PEOPLE, data=st.data())
def test_dispatcher_never_raises_never_enqueues_an_invalid_job(
    redis_client: redis.Redis, raw: str, who: tuple[str, str], data: st.DataObject
) -> None:
    user, channel = who
    line = _mutate(raw, data)
    redis_client.flushdb()
    dispatcher = Dispatcher(CONFIG, redis_client, observe_timeout_s=0.05)
    reply = dispatcher.handle(user, channel, line)  # any exception fails the test: that is the point
    assert isinstance(reply.text, str) and reply.text.strip()
    assert "Traceback" not in reply.text and "internal error" not in reply.text
    event(reply.kind)
    if reply.ok and reply.kind == "queued":
        assert reply.job_id
        assert _rq_lengths(redis_client) == 1 and _queued_events(redis_client) == 1
        assert_valid_payload(queue.job_payload(redis_client, reply.job_id), user, channel)
    else:
        assert _rq_lengths(redis_client) == 0, f"{line!r} was answered {reply.kind} but enqueued a job"
        assert _queued_events(redis_client) == 0
        if not reply.ok:
            assert reply.kind in ("error", "denied")


def test_the_fuzz_strategy_reaches_both_outcomes(redis_client: redis.Redis) -> None:
    """Guard against a fuzz that only ever sees refusals: known lines enqueue, known bad ones do not."""
    dispatcher = Dispatcher(CONFIG, redis_client, observe_timeout_s=0.05)
    good = dispatcher.handle("alice", "C1", '/launch nextn cudnn --served-model-name "x\'y" then bench 1,4 n=8')
    assert good.ok and good.kind == "queued"
    assert_valid_payload(queue.job_payload(redis_client, good.job_id or ""), "alice", "C1")
    for line in ("/launch nextn $(id)", "/bench 1,2,4,8,16", "/sweep cutlass, trtllm, nextn, cudnn bench 1"):
        assert not dispatcher.handle("alice", "C1", line).ok
    assert not dispatcher.handle("mallory", "C1", "/stop").ok
    assert _rq_lengths(redis_client) == 1


def test_per_user_limit_refuses_with_a_message_and_enqueues_nothing(redis_client: redis.Redis) -> None:
    dispatcher = Dispatcher(CONFIG, redis_client, observe_timeout_s=0.05)
    for _ in range(CONFIG.limits.max_queued_per_user):
        assert dispatcher.handle("bob", "C1", "/stop").ok
    refused = dispatcher.handle("bob", "C1", "/stop")
    assert not refused.ok and "limit 3" in refused.text
    assert _rq_lengths(redis_client) == CONFIG.limits.max_queued_per_user


# --------------------------------------------------------------------------- structured config documents


def toml_value(value: Any) -> str:
    """A tiny TOML emitter for the fuzz (inline tables only): enough to reach the validator's every branch."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}" for k, v in value.items()) + "}"


SCALARS = st.one_of(
    st.integers(-3, 70000),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["sglang", "ssh", "local", "127.0.0.1", "--tp-size", "gpu-1", "x; id"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["--tp-size", "--x", "A", "bad key", "moe"]), inner, max_size=3),
    ),
    max_leaves=6,
)
BASE_DOCUMENT: dict[str, Any] = {
    "default_host": "gpu-1",
    "engine": {"command": ["python3", "-m", "sglang.launch_server"], "flags": {"--tp-size": 8}},
    "hosts": {"gpu-1": {"port": 30000}, "gpu-2": {"transport": "ssh", "ssh_target": "10.0.0.2"}},
    "presets": {
        "cutlass": {"group": "moe", "flags": {"--moe-runner-backend": "flashinfer_cutlass"}},
        "nextn": {"flags": {"--speculative-algorithm": "NEXTN"}, "env": {"SGLANG_ENABLE_SPEC_V2": "1"}},
        "customar": {"remove": ["--disable-custom-all-reduce"]},
    },
    "access": {"users": ["alice"], "admins": ["root"]},
    "limits": {"max_levels": 4},
}
#: Where a mutation lands: real keys of every section (and a few that do not exist).
KEY_PATHS = st.sampled_from(
    [
        ("default_host",),
        ("engine", "kind"),
        ("engine", "command"),
        ("engine", "model"),
        ("engine", "flags"),
        ("engine", "env"),
        ("engine", "api_key_env"),
        ("engine", "pass_env"),
        ("engine", "launch_timeout_s"),
        ("engine", "colour"),
        ("hosts", "gpu-1", "port"),
        ("hosts", "gpu-1", "transport"),
        ("hosts", "gpu-1", "env"),
        ("hosts", "gpu-1", "nvidia_smi"),
        ("hosts", "gpu-1", "log_dir"),
        ("hosts", "gpu-2", "ssh_target"),
        ("hosts", "gpu-2", "ssh_port"),
        ("hosts", "gpu-2", "ssh_key"),
        ("hosts", "gpu-2", "engine"),
        ("hosts", "gpu-2", "engine", "command"),
        ("hosts", "gpu-2", "engine", "model"),
        ("hosts", "gpu-2", "engine", "flags"),
        ("hosts", "gpu-2", "engine", "api_key_env"),
        ("hosts", "gpu-2", "engine", "pass_env"),
        ("hosts", "gpu-2", "engine", "colour"),
        ("hosts", "Bad Host"),
        ("hosts", "gpu-3"),
        ("presets", "cutlass", "flags"),
        ("presets", "cutlass", "group"),
        ("presets", "nextn", "env"),
        ("presets", "nextn", "conflicts"),
        ("presets", "nextn", "requires"),
        ("presets", "customar", "remove"),
        ("presets", "x"),
        ("presets", "Bad"),
        ("access", "users"),
        ("access", "channels"),
        ("access", "commands"),
        ("limits", "max_levels"),
        ("limits", "lease_ttl_s"),
        ("limits", "max_tokens"),
        ("limits", "nope"),
        ("extra",),
    ]
)
MUTATION_VALUES = st.one_of(
    VALUES,
    st.builds(dict),  # a new {} each draw: st.just({}) is one object, which two mutations could nest in itself
    st.sampled_from(
        [
            ["cutlass"],
            ["nextn"],
            ["x"],
            {"--x": True},
            {"--x": "a b"},
            {"A": "1"},
            ["--tp-size"],
            "API_KEY",
            8,
            0,
            3.5,
            "gpu-2",
        ]
    ),
)


def _mutated(mutations: list[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    document = json.loads(json.dumps(BASE_DOCUMENT))
    for path, value in mutations:
        node = document
        for key in path[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                break
        else:
            node[path[-1]] = copy.deepcopy(value)  # never the same object twice (a cycle would recurse forever)
    return document


DOCUMENT = st.lists(st.tuples(KEY_PATHS, MUTATION_VALUES), min_size=0, max_size=3).map(_mutated)


def _exercise(config: Config) -> None:
    """A config that loads must be usable: every host and preset builds a launch or refuses clearly."""
    config.host(None)
    for host in config.hosts.values():
        for preset in [*config.presets, None]:
            words = (preset,) if preset else ()
            try:
                spec = build_launch(config, host, words, ())
            except BenchbotError as exc:
                assert str(exc).strip()
                continue
            assert all(isinstance(p, str) for p in spec.argv) and spec.argv[0] == host.engine.command[0]


@settings(max_examples=250, deadline=None)
@given(DOCUMENT)
def test_structured_config_documents_load_or_fail_with_the_key(document: dict[str, Any]) -> None:
    text = "\n".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in document.items())
    try:
        config = parse_config(text, "fuzz.toml")
    except ConfigError as exc:
        event("refused")
        message = str(exc)
        assert message.startswith("fuzz.toml: ") and len(message) > len("fuzz.toml: ")
        assert "Traceback" not in message
        return
    event("loaded")
    _exercise(config)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('hosts = {"gpu-1" = {port = "x; id"}}', "hosts.gpu-1.port: expected an integer"),
        ('hosts = {"gpu-1" = {}}\nengine = {flags = {"--x" = "a\\nb"}}', 'engine.flags."--x"'),
        ('hosts = {"gpu-1" = {env = {"A B" = "1"}}}', "not a valid environment variable name"),
        ('hosts = {"gpu-1" = {}}\nengine = {api_key_env = "$(id)"}', "engine.api_key_env"),
    ],
)
def test_hostile_config_values_are_named_in_the_error(text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=r"^fuzz\.toml: ") as info:
        parse_config(text, "fuzz.toml")
    assert expected in str(info.value)
