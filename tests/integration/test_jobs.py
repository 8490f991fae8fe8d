"""Issue 4 end to end: real workers, real Redis, the simulated host, locally and through real SSH servers.

Every test talks to benchbot the way a person does (a command line through the dispatcher) and reads
the job's story from its event stream; what runs on the host is checked from /proc, not from benchbot.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.harness import HOST, TRANSPORTS, BenchbotHost, first, transport_server
from tests.util import wait_until
from workers.engines.sglang.observation import describe_config
from workers.jobs import events, lease
from workers.observation import RunningConfig
from workers.sim.launcher import start_sim

BENCH = "1,4 in=64 out=16 n=8"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_launch_nextn_reports_ready_with_observed_nextn(redis_url: str, tmp_path: Path, transport: str) -> None:
    """Done-when 1: `/launch nextn cudnn` is READY, observed as NEXTN (argv) that the server calls EAGLE."""
    with (
        transport_server(transport, tmp_path / "ssh") as ssh,
        BenchbotHost(redis_url, tmp_path, workers=1, ssh=ssh) as h,
    ):
        terminal, seen = h.launch_ok("alice", "/launch nextn cudnn")
        config = first(seen, events.READY).data["config"]
        assert config["state"] == "running" and config["managed"] is True
        assert config["launched_by"]["user"] == "alice" and config["launched_by"]["job"] == terminal.job
        # the two truths: the process was started as NEXTN, the server reports EAGLE
        assert config["launch_args"]["--speculative-algorithm"] == "NEXTN"
        assert config["server"]["args"]["speculative_algorithm"] == "EAGLE"
        assert "NEXTN 3/1/4 (server reports EAGLE 3/1/4)" in config["summary"]
        assert first(seen, events.READY).data["diff"] == []  # NEXTN asked, EAGLE served: not a mismatch
        assert h.engine_pids() == [config["process"]["pid"]]
        assert terminal.data["config"]["fingerprint"] == config["fingerprint"]


def test_summary_names_the_algorithm_as_launched_only_when_the_server_renamed_it() -> None:
    """The label rule behind done-when 1, without processes: NEXTN asked + EAGLE served -> both named."""
    args = {
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "tp_size": 8,
    }
    assert "NEXTN 3/1/4 (server reports EAGLE 3/1/4)" in describe_config(args, {"--speculative-algorithm": "NEXTN"})
    assert "EAGLE 3/1/4, TP8" in describe_config(args, {"--speculative-algorithm": "EAGLE"})
    assert "EAGLE 3/1/4, TP8" in describe_config(args)  # no process seen: only what the server says
    rc = RunningConfig(host=HOST, port=1, observed_at=0.0, state="none", launch_args={"--tp-size": "8"})
    assert RunningConfig.from_dict(rc.to_dict()).launch_args == {"--tp-size": "8"}


FAILURE_MODES = [
    # FlashInfer's real words on SM120 (the simulator imitates SGLang 0.5.9 with FlashInfer's texts)
    ("/launch trtllm cudnn", "unsupported_gpu", "No supported CUDA architectures found for major versions [10]"),
    ("/launch cutlass --fp4-gemm-backend flashinfer_trtllm", "unsupported_gpu", "with capability 120"),
    ("/launch cutedsl cudnn", "garbage_output", None),
    (
        "/launch nextn cudnn --mamba-track-interval 2",
        "config_error",
        "must be greater than or equal to speculative_num_draft_tokens",
    ),
    ("/launch nextn cudnn --speculative-eagle-topk 2", "config_error", "Spec v2 currently only supports topk = 1"),
    ("/launch cutlass cudnn --mem-fraction-static 0.95", "oom", "out of memory"),
    # a start-up longer than the config's launch_timeout_s: never healthy in time
    ("/launch cutlass cudnn --sim-startup-s 60", "timeout", None),
]


@pytest.mark.slow
def test_failure_modes_end_in_their_diagnosis_and_leave_nothing_running(redis_url: str, tmp_path: Path) -> None:
    """Done-when 2: each simulated failure, through the real job path, ends in its category; nothing stays up."""
    with BenchbotHost(redis_url, tmp_path, workers=1, launch_timeout_s=6) as h:
        wrong = []
        for line, category, evidence in FAILURE_MODES:
            reply = h.run("carol", line)
            assert reply.ok and reply.job_id, (line, reply.text)
            terminal, seen = h.wait(reply.job_id)
            diagnosis = terminal.data.get("diagnosis") or {}
            spawned = [e for e in seen if e.data.get("phase") == "spawn"]
            left = h.engine_pids()  # the job is over: whatever it started must be gone already
            if terminal.type != "failed" or diagnosis.get("category") != category or left or not spawned:
                wrong.append((line, terminal.type, diagnosis.get("category"), terminal.data.get("message"), left))
            elif evidence and evidence not in (diagnosis.get("evidence") or "") + "\n".join(
                diagnosis.get("log_tail") or []
            ):
                wrong.append((line, "evidence missing", evidence, diagnosis))
        assert not wrong, wrong


def _started_worker(seen: list[events.Event]) -> str:
    return str(first(seen, events.STARTED).data["worker"])


@pytest.mark.slow
def test_sigkilled_worker_frees_the_host_and_its_half_started_server_is_handled(redis_url: str, tmp_path: Path) -> None:
    """Done-when 3: a worker SIGKILLed mid-launch; the lease frees in TTL + 5 s, the job fails, the next job
    runs on the other worker and replaces the server the dead job left (which /status attributes to it)."""
    ttl = 3.0
    with BenchbotHost(redis_url, tmp_path, workers=2, lease_ttl_s=ttl) as h:
        reply = h.run("alice", "/launch cutlass cudnn --sim-startup-s 8")
        dead_job = reply.job_id
        assert dead_job

        def spawned() -> list[events.Event]:
            return [e for e in events.job_events(h.r, dead_job) if e.data.get("phase") == "watch"]

        wait_until(spawned, timeout=30, what="the launch to spawn its server")
        victim_name = _started_worker(events.job_events(h.r, dead_job))
        victim = next(w for i, w in enumerate(h.workers, 1) if victim_name == f"test-worker-{i}")
        half_started = h.engine_pids()
        assert len(half_started) == 1
        killed_at = time.monotonic()
        h.kill_worker(victim)

        wait_until(lambda: lease.current_holder(h.r, HOST) is None, timeout=ttl + 5, what="the lease to free")
        freed_s = time.monotonic() - killed_at
        wait_until(lambda: events.is_terminal(h.r, dead_job), timeout=ttl + 8, what="the dead job's terminal event")
        reported_s = time.monotonic() - killed_at
        dead_events = events.job_events(h.r, dead_job)
        assert dead_events[-1].type == "failed", dead_events[-1]
        assert "worker died" in dead_events[-1].data.get("message", ""), dead_events[-1].data
        assert freed_s <= ttl + 5 and reported_s <= ttl + 8, (freed_s, reported_s)

        # the server the dead job started is still there, and /status says whose it is
        assert h.engine_pids() == half_started
        view = h.run("bob", "/status").data["hosts"][0]
        observed = view["fresh"]
        assert observed and observed["process"]["pid"] == half_started[0]
        assert observed["managed"] is True and observed["launched_by"]["job"] == dead_job
        assert f"job {dead_job}" in h.run("bob", "/status").text

        _, seen = h.launch_ok("bob", "/launch cutlass cudnn")
        survivor = next(f"test-worker-{i}" for i, w in enumerate(h.workers, 1) if w is not victim)
        assert _started_worker(seen) == survivor
        # handled: either stopped up front as an unverified leftover of the dead job, or replaced as its server
        replaced = first(seen, events.READY).data["replaced"]
        cleanup = [e.data["message"] for e in seen if e.data.get("phase") == "cleanup"]
        if replaced is None:
            assert cleanup and f"job {dead_job}" in cleanup[0] and f"pid {half_started[0]}" in cleanup[0], [
                (e.type, e.data.get("message")) for e in seen
            ]
        else:
            assert replaced["config"]["process"]["pid"] == half_started[0]
            assert replaced["config"]["launched_by"]["job"] == dead_job
        now = h.engine_pids()
        assert len(now) == 1 and now != half_started
        print(f"\nSIGKILL -> lease free {freed_s:.2f} s, failed event {reported_s:.2f} s (TTL {ttl} s)")


@pytest.mark.slow
def test_racing_launches_never_run_two_servers_on_one_port(redis_url: str, tmp_path: Path) -> None:
    """Done-when 4: 2 users x 2 launches at once on 2 workers: one engine on the port at any moment, FIFO."""
    with BenchbotHost(redis_url, tmp_path, workers=2) as h:
        most = [0]
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                most[0] = max(most[0], len(h.engine_pids()))
                stop.wait(0.01)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            lines = [
                ("alice", "/launch cutlass cudnn"),
                ("bob", "/launch nextn cudnn"),
                ("alice", "/launch nextn cudnn customar"),
                ("bob", "/launch cutlass cudnn mscclpp"),
            ]
            jobs = []
            for user, line in lines:
                reply = h.run(user, line)
                assert reply.ok and reply.job_id, reply.text
                jobs.append(reply.job_id)
            outcomes = [h.wait(job, timeout=90) for job in jobs]
        finally:
            stop.set()
            watcher.join(5)
        assert [t.type for t, _ in outcomes] == ["succeeded"] * 4, [t.data for t, _ in outcomes]
        started = [first(seen, events.STARTED).ts for _, seen in outcomes]
        assert started == sorted(started), "jobs did not start in the order they were queued"
        assert {_started_worker(seen) for _, seen in outcomes} <= {"test-worker-1", "test-worker-2"}
        assert most[0] == 1, f"{most[0]} engine processes were alive on the port at once"
        last = first(outcomes[-1][1], events.READY).data["config"]
        assert h.engine_pids() == [last["process"]["pid"]] and "mscclpp" in last["summary"]


def test_server_swapped_behind_our_back_shows_unmanaged_with_real_args(redis_url: str, tmp_path: Path) -> None:
    """Done-when 5: someone kills our server and starts their own: /status says unmanaged, NEXTN, its argv."""
    with BenchbotHost(redis_url, tmp_path, workers=1) as h:
        _, seen = h.launch_ok("alice", "/launch cutlass cudnn")
        ours = first(seen, events.READY).data["config"]["process"]["pid"]
        os.kill(ours, signal.SIGKILL)
        wait_until(lambda: not h.engine_pids(), timeout=10, what="our server to die")
        rogue_argv = [
            "--model-path",
            "nvidia/Qwen3.5-397B-A17B-NVFP4",
            "--tp",
            "8",
            "--quantization",
            "modelopt_fp4",
            "--moe-runner-backend",
            "flashinfer_cutlass",
            "--fp4-gemm-backend",
            "flashinfer_cudnn",
            "--speculative-algorithm",
            "NEXTN",
            "--mamba-scheduler-strategy",
            "extra_buffer",
        ]
        env = {
            "SGLANG_ENABLE_SPEC_V2": "1",
            "BENCHBOT_SIM_STATE_DIR": str(tmp_path / "sim"),
            "BENCHBOT_SIM_STARTUP_S": "0.2",
        }
        with start_sim(h.port, *rogue_argv, env=env, log_path=tmp_path / "rogue.log") as rogue:
            reply = h.run("alice", "/status")
            view = reply.data["hosts"][0]
            observed = view["fresh"]
            assert observed is not None, reply.text
            assert observed["managed"] is False and observed["launched_by"] is None
            assert observed["process"]["pid"] == rogue.pid
            assert "--speculative-algorithm" in observed["process"]["argv"]
            assert observed["launch_args"]["--speculative-algorithm"] == "NEXTN"
            assert observed["server"]["args"]["speculative_algorithm"] == "EAGLE"
            assert "NEXTN 3/1/4" in observed["summary"]
            assert "unmanaged" in reply.text.lower() and "NEXTN" in reply.text


@pytest.mark.slow
def test_cancel_running_launch_is_owner_only_and_stops_what_it_started(redis_url: str, tmp_path: Path) -> None:
    """Done-when 6: bob may not cancel alice's launch; alice's /cancel stops the server it was starting."""
    with BenchbotHost(redis_url, tmp_path, workers=1) as h:
        reply = h.run("alice", "/launch cutlass cudnn --sim-startup-s 30")
        job = reply.job_id
        assert job
        wait_until(
            lambda: [e for e in events.job_events(h.r, job) if e.data.get("phase") == "watch"],
            timeout=30,
            what="the launch to spawn its server",
        )
        wait_until(h.engine_pids, timeout=10, what="the engine process")
        denied = h.run("bob", f"/cancel {job}")
        assert not denied.ok and "belongs to alice" in denied.text
        assert not events.is_terminal(h.r, job) and h.engine_pids()
        asked = h.run("alice", f"/cancel {job}")
        assert asked.ok, asked.text
        terminal, _ = h.wait(job, timeout=30)
        assert terminal.type == "cancelled", terminal.data
        assert h.engine_pids() == []  # gone from /proc, not merely from benchbot's records


def test_an_unmanaged_engine_is_stopped_alone_not_its_process_group(redis_url: str, tmp_path: Path) -> None:
    """A server someone started leads a process group another of their processes shares: replacing it
    signals that pid only (benchbot did not create the group), and the neighbour lives on. It is started
    the documented way, `benchbot sim sglang ...`, which the kernel shows as `python3 .../bin/benchbot sim
    sglang ...`: an engine benchbot knows, so /launch replaces it (issue 36 item 7; it was refused)."""
    with BenchbotHost(redis_url, tmp_path, workers=1) as h:
        env = {**os.environ, "BENCHBOT_SIM_STATE_DIR": str(tmp_path / "sim")}
        argv = [
            str(Path(sys.executable).parent / "benchbot"),
            "sim",
            "sglang",
            "--model-path",
            "nvidia/Qwen3.5-397B-A17B-NVFP4",
            "--tp-size",
            "8",
            "--quantization",
            "modelopt_fp4",
            "--port",
            str(h.port),
            "--sim-startup-s",
            "0",
        ]
        theirs = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
        neighbour = subprocess.Popen(["sleep", "300"], process_group=theirs.pid)
        try:
            assert os.getpgid(neighbour.pid) == theirs.pid == os.getpgid(theirs.pid)
            wait_until(
                lambda: h.engine_pids() == [theirs.pid] and _accepts(h.port), timeout=30, what="their server to listen"
            )
            _, seen = h.launch_ok("alice", "/launch cutlass cudnn")
            replaced = first(seen, events.READY).data["replaced"]
            assert replaced["config"]["managed"] is False and replaced["config"]["process"]["pid"] == theirs.pid
            assert theirs.wait(10) is not None
            assert neighbour.poll() is None, "the neighbour in their process group was signalled"
            assert h.engine_pids() == [first(seen, events.READY).data["config"]["process"]["pid"]]
        finally:
            for proc in (theirs, neighbour):
                proc.kill()
                proc.wait(10)


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
