"""Security through the full path: hostile engine values over SSH, secrets everywhere they could leak, access.

Signature checks (unsigned, wrongly signed, stale > 5 min -> 401) and the Slack access refusal are in
``tests/integration/test_slack.py``; quoting at the transport level is in ``tests/test_transport.py``.
Here the same promises are checked end to end: a config preset whose values hold ``;``, ``$(...)``,
backticks and quotes, launched over SSH by a real worker, reaches the engine verbatim and runs
nothing on the host (a canary file proves it); the grammar refuses the same characters typed by a
person; and the bot token, the signing secret and the engine's API key appear nowhere benchbot
writes: worker logs, Redis (events, observations, stored runs, RQ results), exports, Slack messages.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from bot.notifier import Notifier
from bot.slack_app import make_client
from bot.slack_standin import SlackHarness, SlackStandIn, signed_headers
from tests.integration.harness import CHANNEL, HOST, TRANSPORTS, VLLM_HOST_ENGINE, BenchbotHost, first, transport_server
from tests.sshd import asyncssh_server
from tests.util import wait_until
from workers.config import EMBEDDED_TOML, load_config, parse_config
from workers.host.transport import ENGINE_BASE_ENV, ENGINE_BASE_ENV_PREFIXES
from workers.jobs import events, queue
from workers.jobs.payloads import LaunchPayload
from workers.presets import LaunchIntent
from workers.results import export

pytestmark = pytest.mark.slow

BOT_TOKEN = "xoxb-9871-canarytoken-Zq4fT0ken"
SIGNING_SECRET = "s1gn1ng-secret-canary-7d1e0c"
API_KEY = "sk-engine-canary-3f9a0b77"
SECRETS = (BOT_TOKEN, SIGNING_SECRET, API_KEY)


def hostile_value(canary: Path) -> str:
    """Every way a shell could be tricked into running ``touch CANARY``; no newline (configs refuse them)."""
    c = str(canary)
    return f"x; touch {c}; $(touch {c}) `touch {c}` ' \" && touch {c} | touch {c} > {c}.2 \\' $HOME"


def dump_redis(r: redis.Redis) -> str:
    """Every value of every key, whatever its type: what an attacker with a Redis dump would read."""
    parts: list[str] = []
    for key in r.scan_iter(count=1000):
        kind = r.type(key).decode()
        if kind == "string":
            parts.append(repr(r.get(key)))
        elif kind == "hash":
            parts.append(repr(r.hgetall(key)))
        elif kind == "list":
            parts.append(repr(r.lrange(key, 0, -1)))
        elif kind == "set":
            parts.append(repr(r.smembers(key)))
        elif kind == "zset":
            parts.append(repr(r.zrange(key, 0, -1)))
        elif kind == "stream":
            parts.append(repr(r.xrange(key)))
        parts.append(key.decode(errors="replace"))
    return "\n".join(parts)


@pytest.fixture
def ssh_host(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[BenchbotHost, Path]]:
    """A simulated host reached over SSH, with an engine API key and Slack secrets in the workers' env."""
    monkeypatch.setenv("SLACK_BOT_TOKEN", BOT_TOKEN)
    monkeypatch.setenv("SLACK_SIGNING_SECRET", SIGNING_SECRET)
    monkeypatch.setenv("BENCHBOT_TEST_ENGINE_KEY", API_KEY)
    canary = tmp_path / "CANARY"
    (tmp_path / "ssh").mkdir()
    (tmp_path / "host").mkdir()
    with asyncssh_server(tmp_path / "ssh") as ssh:
        h = BenchbotHost(
            redis_url,
            tmp_path / "host",
            ssh=ssh,
            lease_ttl_s=5.0,
            workers=1,
            extra_toml=f'\n[presets.evil]\nflags = {{ "--served-model-name" = {json.dumps(hostile_value(canary))} }}\n',
        )
        text = h.config_path.read_text().replace(
            "launch_timeout_s =", 'api_key_env = "BENCHBOT_TEST_ENGINE_KEY"\nlaunch_timeout_s =', 1
        )
        h.config_path.write_text(text)
        h.config = load_config(str(h.config_path))
        h.dispatcher = type(h.dispatcher)(h.config, h.r, plots_dir=tmp_path / "host" / "plots")
        assert h.config.host(None).engine.api_key_env == "BENCHBOT_TEST_ENGINE_KEY"
        with h:
            yield h, canary


def test_hostile_values_reach_the_engine_verbatim_over_ssh_and_secrets_leak_nowhere(
    ssh_host: tuple[BenchbotHost, Path], tmp_path: Path
) -> None:
    h, canary = ssh_host
    events.ensure_group(h.r)
    with SlackStandIn() as standin:
        notifier = Notifier(
            h.r,
            make_client(BOT_TOKEN, standin.base_url),
            consumer="sec",
            default_channel="C-bench",
            plots_dir=tmp_path / "plots",
            progress_interval_s=0.1,
            thread_wait_s=0.5,
            block_ms=50,
        )
        notifier.start()
        try:
            # typed by a person: the grammar refuses shell characters and newlines, and enqueues nothing
            for line in (
                f"/launch cutlass --served-model-name $(touch {canary})",
                f"/launch cutlass --x `touch {canary}`",
                f"/launch cutlass --x a;touch {canary}",
                f"/launch cutlass\ntouch {canary}",
            ):
                reply = h.run("alice", line)
                assert not reply.ok and ("never runs shell commands" in reply.text or "one line" in reply.text)
            assert queue.list_jobs(h.r, HOST) == []
            # quotes and parentheses are legal in a value typed by a person: they arrive as one word
            typed = "a'b (c) {d} * ~ ? #"
            _, seen = h.launch_ok("alice", f'/launch cutlass cudnn --served-model-name "{typed}"')
            args = first(seen, events.READY).data["config"]["server"]["args"]
            assert args["served_model_name"] == typed
            # from the config (values may hold anything but control characters): verbatim too
            terminal, seen = h.launch_ok("alice", "/launch cutlass cudnn evil then bench 1 in=64 out=16 n=4")
            observed = first(seen, events.READY).data["config"]
            assert observed["server"]["args"]["served_model_name"] == hostile_value(canary)
            assert terminal.data["run_id"]
            wait_until(
                lambda: (
                    notifier.backlog == 0
                    and h.r.xpending(events.GLOBAL_STREAM, "notifier")["pending"] == 0
                    and len(standin.calls_to("chat.postMessage")) >= 2
                ),
                timeout=20,
                what="the notifier to post both jobs",
            )
        finally:
            notifier.stop()
        slack_bodies = "\n".join(c.raw.decode(errors="replace") for c in standin.calls)

    assert not canary.exists() and not Path(f"{canary}.2").exists(), "a hostile value ran on the SSH host"

    exported = io.StringIO()
    export.export_runs(h.r, "jsonl", exported)
    export.export_runs(h.r, "csv", exported)
    places = {
        "worker logs": h.worker_logs(tail=10**7),
        "redis (events, observations, runs, RQ results)": dump_redis(h.r),
        "exported results": exported.getvalue(),
        "slack messages": slack_bodies,
    }
    assert "served_model_name" in places["redis (events, observations, runs, RQ results)"]  # it did record
    assert "cutlass" in places["exported results"] and "@alice" in places["slack messages"]
    for where, text in places.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret[:8]}... leaked into {where}"


# --------------------------------------------------------------------------- access and replays over HTTP

ACCESS_TOML = EMBEDDED_TOML.replace(
    'default_host = "sim"',
    'default_host = "sim"\n[access]\nusers = ["alice", "bob", "root"]\nchannels = ["C0TEAM"]\nadmins = ["root"]\n'
    '[access.commands]\nstop = ["alice"]\n',
    1,
)


@pytest.fixture
def slack(redis_url: str, redis_client: redis.Redis, tmp_path: Path, state_dir: Path) -> Iterator[SlackHarness]:
    with SlackHarness(parse_config(ACCESS_TOML, "access.toml"), redis_url, tmp_path, notifier=False) as h:
        yield h


def _hooks(h: SlackHarness, n: int) -> list[str]:
    """The first ``n`` private answers, besides the note that no worker serves the host (no worker runs here)."""

    def answers() -> list[str]:
        return [c.body["text"] for c in h.webhooks() if not c.body["text"].startswith("no worker is serving ")]

    wait_until(lambda: len(answers()) >= n, what=f"{n} private answers")
    return answers()


def test_outsiders_wrong_channels_and_command_limits_are_refused_and_change_nothing(
    slack: SlackHarness, redis_client: redis.Redis
) -> None:
    slack.command("/launch", "cutlass", user="mallory")
    slack.command("/launch", "cutlass", user="alice", channel="C0RANDOM")
    slack.command("/stop", "", user="bob")
    # Answers to three different users travel on three per-user lanes: their order is not defined.
    texts = " | ".join(_hooks(slack, 3))
    assert "access list" in texts and "this channel" in texts and "only alice may stop" in texts
    assert redis_client.xlen(events.GLOBAL_STREAM) == 0 and queue.list_jobs(redis_client, "sim") == []
    assert not slack.standin.calls_to("chat.postMessage")


def test_cancelling_another_users_job_is_refused_but_an_admin_may(
    slack: SlackHarness, redis_client: redis.Redis
) -> None:
    slack.command("/launch", "cutlass", user="alice")
    job = wait_until(lambda: queue.list_jobs(redis_client, "sim"), what="alice's job")[0].job_id
    slack.command("/cancel", job, user="bob")
    assert "alice" in _hooks(slack, 1)[0] or "your own" in _hooks(slack, 1)[0]
    assert events.terminal_type(redis_client, job) is None and redis_client.get(queue.cancel_key(job)) is None
    slack.command("/cancel", job, user="root")
    wait_until(lambda: events.terminal_type(redis_client, job) == events.CANCELLED, what="the admin's cancel")


def test_a_captured_request_replayed_is_dropped_or_refused(slack: SlackHarness, redis_client: redis.Redis) -> None:
    body = slack.command_body("/launch", "cutlass", user="alice")
    headers = signed_headers(body)
    assert slack.post(body, headers).status == 200
    assert slack.post(body, headers).status == 200  # replayed within the window: same trigger_id, dropped
    wait_until(lambda: slack.app.benchbot.duplicates == 1, what="the replay to be recognised")
    old = signed_headers(body, timestamp=int(time.time()) - 301)
    assert slack.post(body, old).status == 401  # replayed after 5 min: refused by the signature check
    fresh_ts = {**old, "X-Slack-Request-Timestamp": str(int(time.time()))}
    assert slack.post(body, fresh_ts).status == 401  # an old signature under a new timestamp
    assert len(queue.list_jobs(redis_client, "sim")) == 1


# --------------------------------------------------------------------------- the engine's key and env on the host

HOST_ENV_NAMES = {"BENCHBOT_SIM_STARTUP_S", "BENCHBOT_SIM_STATE_DIR"}  # what the harness's host env names


def _proc_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _every_cmdline() -> str:
    """Every process's argv on this machine (where the SSH test servers also run their commands)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                found.append((entry / "cmdline").read_bytes().decode(errors="replace"))
    return "\n".join(found)


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_engine_api_key_reaches_the_engine_only_through_a_private_file(
    kind: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker holds the engine's key and Slack's token; after a real launch + bench through a real
    worker, the key is in no process's argv, not in the engine's env, log, Redis or the job's events,
    the engine's env is the basics plus what the config names, and the log is 0600 and scrubbed."""
    # Unique per run: the argv grep reads every process on the machine, other test runs' included.
    bot_token, api_key = f"xoxb-canary-{uuid.uuid4().hex}", f"sk-engine-canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("SLACK_BOT_TOKEN", bot_token)
    monkeypatch.setenv("BENCHBOT_TEST_ENGINE_KEY", api_key)
    with transport_server(kind, tmp_path / "ssh") as ssh:
        (tmp_path / "host").mkdir()
        h = BenchbotHost(redis_url, tmp_path / "host", ssh=ssh, workers=1)
        h.config_path.write_text(
            h.config_path.read_text().replace(
                "launch_timeout_s =", 'api_key_env = "BENCHBOT_TEST_ENGINE_KEY"\nlaunch_timeout_s =', 1
            )
        )
        h.config = load_config(str(h.config_path))
        h.dispatcher = type(h.dispatcher)(h.config, h.r, plots_dir=tmp_path / "host" / "plots")
        with h:
            terminal, seen = h.launch_ok("alice", "/launch cutlass cudnn then bench 1 in=64 out=16 n=4")
            assert terminal.data["run_id"], "the bench (it needs the key) ran"
            [engine] = h.engine_pids()
            assert httpx.get(f"http://127.0.0.1:{h.port}/v1/models").status_code == 401, "the key is enforced"
            cmdlines = _every_cmdline()
            engine_argv = Path(f"/proc/{engine}/cmdline").read_bytes().decode().split("\0")
            env = _proc_env(engine)
            logs = h.work / "logs"
            [log_file] = logs.glob(f"engine-{HOST}-job*.log")
            log_text = log_file.read_text()
            redis_text = dump_redis(h.r)
            worker_logs = h.worker_logs(tail=10**7)

    assert api_key not in cmdlines, "the key is on some process's argv"
    config_flag = engine_argv.index("--config")
    assert engine_argv[config_flag + 1] == str(logs / f".benchbot-fence-{h.port}-engine.yaml")
    assert not Path(engine_argv[config_flag + 1]).exists(), "the private config outlived the engine's start"
    assert api_key not in "\0".join(env.values()) and bot_token not in "\0".join(env.values())
    named = {k for k in env if k not in ENGINE_BASE_ENV and not k.startswith(ENGINE_BASE_ENV_PREFIXES)}
    assert named == HOST_ENV_NAMES, named
    assert "api_key='REDACTED'" in log_text, "the engine logs its server args (scrubbed)"
    assert api_key not in log_text
    assert oct(log_file.stat().st_mode & 0o777) == "0o600"
    assert oct((logs / f".benchbot-fence-{h.port}").stat().st_mode & 0o777) == "0o600"
    assert "served_model_name" in redis_text  # it did record the observation
    for where, text in {
        "redis": redis_text,
        "worker logs": worker_logs,
        "events": json.dumps([e.data for e in seen]),
    }.items():
        assert api_key not in text, f"the key leaked into {where}"


# --------------------------------------------------------------------------- engine options by what they do


def test_a_flag_that_names_code_a_file_or_a_model_spawns_nothing_for_a_member(redis_url: str, tmp_path: Path) -> None:
    """Issue 25, finding 2: the bot refuses a member's ``--worker-cls`` (vLLM) or ``--chat-template
    /etc/shadow`` (SGLang) and queues nothing; a job that reaches a worker anyway (an older bot, a
    hand-built payload) is refused by the worker before anything is stopped or started."""
    vllm = "vllm-1"
    with BenchbotHost(redis_url, tmp_path, workers=1, more_hosts={vllm: VLLM_HOST_ENGINE}) as h:
        h.launch_ok("alice", f"/launch cutlass --max-num-seqs 64 on {vllm}")  # a member's knob: it runs
        h.launch_ok("alice", "/launch cutlass cudnn")
        running = {host: h.engine_pids(host=host) for host in (HOST, vllm)}
        assert all(len(pids) == 1 for pids in running.values()), running
        cases = [
            (vllm, ("cutlass",), ("--worker-cls", "evil.Worker"), "names a class"),
            (vllm, ("cutlass",), ("--speculative-config", '{"model":"someone/else","method":"eagle"}'), 'key "model"'),
            (vllm, ("cutlass",), ("--chat-template", "/etc/shadow"), "names a file"),
            (HOST, ("cutlass", "cudnn"), ("--chat-template", "/etc/shadow"), "names a file"),
        ]
        for host, words, (flag, value), why in cases:
            reply = h.run("alice", f"/launch {' '.join(words)} {flag} '{value}' on {host}")
            assert not reply.ok and why in reply.text and "only an admin" in reply.text, reply.text
            assert queue.list_jobs(h.r, host) == []
        for host, words, flag_value, why in cases:
            payload = LaunchPayload(host, "alice", CHANNEL, launch=LaunchIntent(words, (flag_value,)))
            queued = queue.enqueue(
                h.r, host, "launch", payload.to_dict(), user="alice", channel=CHANNEL, summary="x", job_timeout_s=120
            )
            terminal, seen = h.wait(queued.job_id)
            assert terminal.type == "failed", terminal.data
            assert terminal.data["diagnosis"]["category"] == "config_error", terminal.data
            assert why in terminal.data["message"] and "Nothing was stopped or started" in terminal.data["message"]
            assert not any(e.data.get("phase") in ("stop", "spawn") for e in seen)
            assert {h_: h.engine_pids(host=h_) for h_ in (HOST, vllm)} == running  # nothing new, nothing stopped
