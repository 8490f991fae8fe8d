"""Issue 11 end to end: launches compiled for the SGLang the host runs, and a loading engine owning its port.

Real workers, real Redis, the simulator imitating a recorded SGLang version (0.5.9 or 0.5.23, chosen by
``BENCHBOT_SIM_SGLANG_VERSION`` in the host's env). What runs is read from /proc and from the server.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.integration.harness import BenchbotHost, first
from tests.util import wait_until
from workers.jobs import events, queue

pytestmark = pytest.mark.slow


def _host(redis_url: str, tmp_path: Path, version: str, workers: int = 1, **kw: object) -> BenchbotHost:
    return BenchbotHost(redis_url, tmp_path, workers=workers, sim_env={"BENCHBOT_SIM_SGLANG_VERSION": version}, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("version", "mamba_flag"), [("0.5.9", "--mamba-scheduler-strategy"), ("0.5.23", "--mamba-radix-cache-strategy")]
)
def test_nextn_is_compiled_for_the_hosts_version_and_every_result_names_it(
    redis_url: str, tmp_path: Path, version: str, mamba_flag: str
) -> None:
    with _host(redis_url, tmp_path, version) as h:
        terminal, seen = h.launch_ok("alice", "/launch nextn cutlass cudnn then bench 1 in=32 out=8 n=2")
        ready = first(seen, events.READY).data
        assert ready["engine"] == {"version": version, "checked_against": "recorded"}
        argv = ready["launch"]["argv"]
        assert argv[argv.index(mamba_flag) + 1] == "extra_buffer" and ready["launch"]["version"] == version
        assert ready["config"]["server"]["version"] == version
        assert f"(SGLang {version})" in terminal.data["bench"]["table"]
        status = h.run("bob", "/status")
        assert f"engine: sglang {version}" in status.text, status.text


def test_a_flag_the_hosts_version_lacks_is_refused_before_anything_stops_or_starts(
    redis_url: str, tmp_path: Path
) -> None:
    with _host(redis_url, tmp_path, "0.5.23") as h:
        h.launch_ok("alice", "/launch cutlass cudnn")
        running = h.engine_pids()
        for line, words in (
            (
                "/launch cutlass cudnn --cuda-graph-max-bs 16",
                ("--cuda-graph-max-bs is ambiguous in SGLang 0.5.23", "--cuda-graph-max-bs-decode"),
            ),
            (
                "/launch cutlass --mamba-scheduler-strategy extra_buffer",
                ("SGLang 0.5.23 has no option --mamba-scheduler-strategy", "--mamba-radix-cache-strategy"),
            ),
        ):
            reply = h.run("bob", line)
            terminal, seen = h.wait(reply.job_id)
            assert terminal.type == "failed", terminal.data
            assert terminal.data["diagnosis"]["category"] == "config_error"
            assert all(w in terminal.data["message"] for w in words), terminal.data["message"]
            assert not any(e.data.get("phase") in ("stop", "spawn") for e in seen)
            assert h.engine_pids() == running  # alice's engine still serves, nothing new was spawned


def test_a_host_whose_version_cannot_be_learnt_is_refused_what_some_release_rejects_not_guessed(
    redis_url: str, tmp_path: Path
) -> None:
    """Issue 21 item 3: the probe fails (its version command exits 1), so the worker knows no release; the base
    ``nextn`` emits ``--mamba-scheduler-strategy``, which 0.5.20+ reject: refused, naming them and why."""
    with BenchbotHost(redis_url, tmp_path, workers=1, host_engine='version_command = ["false"]\n') as h:
        reply = h.run("alice", "/launch nextn cutlass cudnn")
        terminal, seen = h.wait(reply.job_id)
        assert terminal.type == "failed", terminal.data
        assert terminal.data["diagnosis"]["category"] == "config_error"
        message = terminal.data["message"]
        assert "--mamba-scheduler-strategy extra_buffer is refused by SGLang 0.5.20-0.5.23" in message, message
        assert "0.5.9-0.5.19 accept it" in message and "version is unknown" in message, message
        assert not any(e.data.get("phase") in ("stop", "spawn") for e in seen) and h.engine_pids() == []
        _, seen = h.launch_ok("alice", "/launch cutlass cudnn")  # flags every recorded release accepts
        assert first(seen, events.READY).data["engine"] == {"version": None, "checked_against": "none"}


def test_a_slow_loading_engine_is_loading_in_status_and_a_second_launch_waits_instead_of_spawning(
    redis_url: str, tmp_path: Path
) -> None:
    # two workers: the second launch is taken at once and has to wait for the host's lease, in line
    with _host(redis_url, tmp_path, "0.5.9", workers=2, launch_timeout_s=60) as h:
        first_launch = h.run("alice", "/launch cutlass cudnn --sim-load-s 6 --sim-startup-s 7")
        wait_until(lambda: h.engine_pids(), timeout=30, what="alice's engine process")

        def loading_with_weights() -> object:
            status = h.run("carol", "/status")
            fresh = status.data["hosts"][0]["fresh"] or {}
            # while it loads, its schedulers take GPU memory: the weights arrive before any listener
            return status if fresh.get("state") == "loading" and (fresh.get("owner_gpu_mib") or 0) > 0 else None

        status = wait_until(loading_with_weights, timeout=5, interval=0.2, what="/status to show it loading")
        fresh = status.data["hosts"][0]["fresh"]
        assert fresh["managed"] is True and fresh["launched_by"]["user"] == "alice"
        assert "LOADING" in status.text and "launched by @alice" in status.text
        assert "GPU memory held by this engine" in status.text

        most = [0]
        stop = threading.Event()

        def count() -> None:
            while not stop.is_set():
                most[0] = max(most[0], len(h.engine_pids()))
                stop.wait(0.05)

        watcher = threading.Thread(target=count, daemon=True)
        watcher.start()
        try:
            second = h.run("bob", "/launch cutlass cudnn")
            assert second.ok and second.data["ahead"] == 1, second.text
            wait_until(
                lambda: any(e.data.get("phase") == "waiting" for e in events.job_events(h.r, second.job_id)),
                timeout=10,
                what="bob's launch to wait for the host",
            )
            terminal, _ = h.wait(first_launch.job_id, timeout=60)
            assert terminal.type == "succeeded", terminal.data
            terminal, seen = h.wait(second.job_id, timeout=60)
            assert terminal.type == "succeeded", terminal.data
            assert first(seen, events.READY).data["replaced"]["config"]["launched_by"]["user"] == "alice"
        finally:
            stop.set()
            watcher.join()
        assert most[0] == 1, "two engines ran on one port at the same time"
        assert queue.list_jobs(h.r, "gpu-1") == []
