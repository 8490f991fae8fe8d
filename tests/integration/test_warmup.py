"""Issue 21 item 5, through real workers and the real simulator: a warming server is not running.

SGLang binds its port, answers ``/server_info`` at once and runs its warm-up request; ``/health`` says
503 until that has passed. Those seconds used to read as *running*: /status said so and a bench would
start on a server that was not serving yet. Ready means the health check passes; until then /status says
WARMING UP and no bench starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.harness import BenchbotHost
from tests.util import wait_until
from workers.results import store

pytestmark = pytest.mark.slow

MODEL = "nvidia/Qwen3.5-397B-A17B-NVFP4"


@pytest.fixture
def host(redis_url: str, tmp_path: Path) -> Iterator[BenchbotHost]:
    with BenchbotHost(redis_url, tmp_path, workers=1) as h:
        yield h


def start_warming_sim(host: BenchbotHost, warmup_s: float) -> subprocess.Popen[bytes]:
    """An unmanaged simulated SGLang on the host's port that listens at once and warms up for ``warmup_s``."""
    argv = [sys.executable, "-m", "workers.sim.sglang", "--model-path", MODEL, "--tp-size", "8"]
    argv += ["--quantization", "modelopt_fp4", "--port", str(host.port)]
    argv += ["--sim-load-s", "0", "--sim-startup-s", str(warmup_s)]
    env = {**os.environ, "BENCHBOT_SIM_STATE_DIR": str(host.work / "sim")}
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _get(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def test_a_warming_server_is_warming_up_in_status_and_no_bench_or_eval_starts_on_it(host: BenchbotHost) -> None:
    engine = start_warming_sim(host, warmup_s=300)
    try:
        base = f"http://127.0.0.1:{host.port}"
        wait_until(lambda: _get(base + "/server_info") == 200, timeout=30, what="the simulator to listen")
        assert _get(base + "/health") == 503  # as real SGLang during its warm-up

        status = host.run("alice", "/status")
        fresh = status.data["hosts"][0]["fresh"]
        assert fresh["state"] == "starting" and fresh["detail"].startswith("warming up"), fresh
        assert fresh["engine_kind"] == "sglang-sim" and fresh["summary"]  # what it will serve, already said
        assert "WARMING UP" in status.text and f"pid {engine.pid}" in status.text, status.text

        for line in ("/bench 1 in=32 out=8 n=2 any", "/bench 1 in=32 out=8 n=2"):
            reply = host.run("alice", line)
            assert reply.ok, reply.text
            terminal, seen = host.wait(reply.job_id)
            assert terminal.type == "failed" and "is warming up" in terminal.data["message"], (line, terminal.data)
            assert not any(e.data.get("phase") == "bench" for e in seen), line
        evaluation = host.run("alice", "/eval n=2 any")
        terminal, _ = host.wait(evaluation.job_id)
        assert terminal.type == "failed" and "is warming up" in terminal.data["message"], terminal.data
        assert store.list_runs(host.r) == []  # nothing measured, nothing stored
        assert engine.poll() is None  # and the warming server was left alone
    finally:
        if engine.poll() is None:
            os.killpg(engine.pid, signal.SIGKILL)
        engine.wait()


def test_a_launch_is_warming_up_until_its_health_check_passes_then_running(host: BenchbotHost) -> None:
    reply = host.run("alice", "/launch cutlass cudnn --sim-load-s 1 --sim-startup-s 8")
    assert reply.ok and reply.job_id, reply.text

    def warming() -> object:
        status = host.run("bob", "/status")
        fresh = status.data["hosts"][0]["fresh"] or {}
        return status if fresh.get("state") == "starting" else None

    status = wait_until(warming, timeout=20, interval=0.2, what="/status to show the launch warming up")
    fresh = status.data["hosts"][0]["fresh"]
    assert fresh["managed"] is True and fresh["detail"].startswith("warming up")
    assert "WARMING UP" in status.text and "launched by @alice" in status.text, status.text

    terminal, _ = host.wait(reply.job_id, timeout=60)
    assert terminal.type == "succeeded", terminal.data
    status = host.run("bob", "/status")
    assert status.data["hosts"][0]["fresh"]["state"] == "running" and "WARMING UP" not in status.text, status.text
