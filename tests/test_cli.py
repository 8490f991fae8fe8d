"""``benchbot say`` as scripts use it: a real subprocess, a real Redis, exit codes and the ``--json`` shape.

Refusals must change nothing (no RQ key appears); jobs run by real workers on a simulated host
(``tests/integration/harness.py``) must report failure with exit code 1 and draw valid PNGs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from bot.commands import COMMANDS
from tests.factories import make_run
from workers.results import store

REPO = Path(__file__).resolve().parents[1]
JSON_KEYS = {"schema", "ok", "kind", "text", "job_id", "data", "files", "events", "plots", "runs", "exit_code"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def say(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python -m bot.cli say ARGS`` in the repo with ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", "say", "--as", "alice", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def cli_env(redis_url: str, redis_client: redis.Redis, state_dir: Path) -> dict[str, str]:
    """The environment of a script talking to this test's Redis, with a private state dir."""
    env = {k: v for k, v in os.environ.items() if k != "BENCHBOT_CONFIG"}
    env.update({"REDIS_URL": redis_url, "BENCHBOT_STATE_DIR": str(state_dir)})
    return env


def _job_keys(r: redis.Redis) -> list[bytes]:
    """Anything a queued job would have written: RQ queues/jobs, job sequence, job events."""
    return sorted(r.keys("rq:*") + r.keys("benchbot:seq:job") + r.keys("benchbot:events*") + r.keys("benchbot:job:*"))


def test_help_lists_every_command_with_its_description(cli_env):
    done = say(cli_env, "/help")
    assert done.returncode == 0, done.stderr
    for spec in COMMANDS.values():
        line = next((ln for ln in done.stdout.splitlines() if ln.strip().startswith(f"/{spec.name} ")), None)
        assert line is not None, f"/help does not list /{spec.name}"
        assert spec.summary in line


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("/launch nextn cudnn; rm -rf /", "';' is not allowed"),
        ("/bench 0,8", "concurrency levels start at 1"),
        ("/launch nextnn", 'did you mean "nextn"'),
    ],
)
def test_bad_input_exits_2_with_a_clear_message_and_enqueues_nothing(cli_env, redis_client, line, expected):
    done = say(cli_env, line)
    assert done.returncode == 2
    assert expected in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert _job_keys(redis_client) == []


def test_refusal_json_has_the_full_schema_1_shape(cli_env, redis_client):
    done = say(cli_env, "--json", "/bench 0,8")
    assert done.returncode == 2
    out = json.loads(done.stdout)
    assert set(out) == JSON_KEYS
    assert out["schema"] == 1 and out["ok"] is False and out["kind"] == "error"
    assert "concurrency levels start at 1" in out["text"]
    assert out["job_id"] is None and out["events"] == [] and out["plots"] == [] and out["exit_code"] == 2
    assert _job_keys(redis_client) == []


def test_help_json_shape(cli_env):
    done = say(cli_env, "--json", "/help")
    assert done.returncode == 0
    out = json.loads(done.stdout)
    assert set(out) == JSON_KEYS
    assert out["ok"] is True and out["kind"] == "help" and out["exit_code"] == 0
    assert isinstance(out["data"], dict) and out["files"] == [] and out["events"] == []
    assert "/launch" in out["text"]


def test_a_fresh_process_on_a_fresh_state_dir_prints_nothing_on_stderr(tmp_path: Path) -> None:
    """Issue 36 item 8: success is silent on stderr (asyncssh + cryptography 51 printed ten DSA warnings),
    from the first call that starts the embedded Redis to a `--json` reply a script captures with 2>&1."""
    from workers import redis_conn

    drop = {"REDIS_URL", "BENCHBOT_CONFIG", "PYTHONWARNINGS"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["BENCHBOT_STATE_DIR"] = str(tmp_path / "state")
    try:
        for args in (("--json", "/help"), ("/queue",)):
            done = subprocess.run(
                [sys.executable, "-m", "bot.cli", "say", "--as", "a", *args],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0 and done.stdout, done.stdout + done.stderr
            assert done.stderr == "", done.stderr
    finally:
        redis_conn.stop_redis_server(tmp_path / "state" / "redis")


def test_compare_json_writes_pngs_to_out_dir(cli_env, redis_client, tmp_path):
    """Plots drawn by the front end land in ``--out`` (no worker needed: /compare reads stored runs)."""
    for run_id, label in (("r1", "cutlass cudnn"), ("r2", "nextn cudnn")):
        store.save_run(redis_client, make_run(run_id, label=label))
    out_dir = tmp_path / "pngs"
    done = say(cli_env, "--json", "--out", str(out_dir), "/compare r1 r2")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out) == JSON_KEYS and out["kind"] == "compare" and out["exit_code"] == 0
    assert out["plots"] == out["files"] and out["plots"]
    for path in map(Path, out["plots"]):
        assert path.parent == out_dir and path.read_bytes().startswith(PNG_MAGIC)
    assert "r1" in out["text"] and "r2" in out["text"]
    assert _job_keys(redis_client) == []


# ------------------------------------------------------------------ jobs run by real workers


@pytest.mark.slow
def test_wait_json_prints_valid_pngs_and_a_failed_job_exits_1(redis_url: str, tmp_path: Path):
    from tests.integration.harness import BenchbotHost

    (tmp_path / "host").mkdir()
    with BenchbotHost(redis_url, tmp_path / "host") as host:
        state = tmp_path / "state"
        env = {**host.env, "BENCHBOT_STATE_DIR": str(state)}
        done = say(env, "--wait", "--json", "/launch cutlass cudnn then bench 1,4 in=64 out=16 n=8", timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        out = json.loads(done.stdout)
        assert set(out) == JSON_KEYS
        assert out["ok"] is True and out["kind"] == "queued" and out["job_id"] and out["exit_code"] == 0
        types = [e["type"] for e in out["events"]]
        assert types[0] == "queued" and "ready" in types and types[-1] == "succeeded"
        assert all(e["job"] == out["job_id"] for e in out["events"])
        assert out["events"][-1]["data"]["run_id"]
        # the per-level metrics as data, not only the table string
        (run,) = out["runs"]
        assert run["id"] == out["events"][-1]["data"]["run_id"]
        assert [lv["concurrency"] for lv in run["levels"]] == [1, 4]
        assert all(lv["completed"] == 8 and lv["ttft_ms"]["p50"] > 0 for lv in run["levels"])
        assert out["plots"], out
        for path in map(Path, out["plots"]):
            assert path.parent == state / "plots"
            assert path.read_bytes().startswith(PNG_MAGIC)

        done = say(env, "--wait", "/launch trtllm cudnn", timeout=120)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "FAILED" in done.stdout and "diagnosis:" in done.stdout
        assert "plots:" not in done.stdout


def test_benchbot_and_every_subcommand_explain_themselves():
    from bot.cli import build_parser

    parser = build_parser()
    top = parser.format_help()
    subcommands = ["say", "console", "worker", "slack", "sim", "runs", "redis", "config", "deploy", "demo"]
    for name in subcommands:
        assert name in top
    for name in subcommands:
        result = subprocess.run(
            [sys.executable, "-m", "bot.cli", name, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: benchbot {name}"), result.stdout[:200]


def test_config_check_names_each_hosts_engine_and_which_hosts_have_their_own(cli_env):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bot.cli",
            "--config",
            str(REPO / "deploy" / "benchbot.example.toml"),
            "config",
            "check",
        ],
        cwd=REPO,
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    engines = {lines[i].split(":")[0].split()[-1]: lines[i + 1] for i, ln in enumerate(lines) if "  host " in ln}
    assert set(engines) == {"gpu-1", "gpu-2", "sim", "gpu-3"}
    assert "(its own [hosts.gpu-3.engine]): vllm `/opt/vllm/bin/vllm serve`" in engines["gpu-3"]
    assert "  vLLM presets: cutlass, cudnn, mtp, customar" in lines
    assert "`python3 -m sglang.launch_server`" in engines["gpu-1"] and "its own" not in engines["gpu-1"]
    assert "(its own [hosts.sim.engine])" in engines["sim"] and "-m workers.sim.sglang`" in engines["sim"]


def test_every_subcommand_option_has_a_help_line():
    """`benchbot COMMAND --help` explains each argument and option, not only that it exists (issue 16.8)."""
    import argparse

    from bot.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [
        f"{name} {action.dest}"
        for name, parser in sub.choices.items()
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
    ]
    assert missing == []


def test_sim_nvidia_smi_help_is_usage_not_an_error():
    done = subprocess.run(
        [sys.executable, "-m", "bot.cli", "sim", "nvidia-smi", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert "--query-gpu" in done.stdout and done.stderr == ""
