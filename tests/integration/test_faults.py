"""Faults on purpose: workers SIGKILLed mid-job, Redis killed and restarted, the SSH link cut, Slack failing.

Each test breaks one thing the way a shared GPU box breaks it and checks benchbot's promises: nothing
lost, nothing run twice, the host never left locked, and a clear story in the job's events. Real
``benchbot worker`` processes, a real Redis, the simulator, real SSH servers (``tests/sshd.py``).
Issue 4's ``tests/integration/test_jobs.py`` owns "SIGKILL during a launch, then a launch" and the
never-healthy engine; here the next job after a dead launch is a *bench*, which must not measure
the server the dead launch left half-started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.harness import HOST, BenchbotHost, first
from tests.sshd import AsyncsshServer
from tests.util import wait_until
from workers import redis_conn
from workers.jobs import events, lease, queue
from workers.results import store

pytestmark = pytest.mark.slow

TTL_S = 3.0
SHORT_BENCH = "1 in=64 out=16 n=4"


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (a worker's horse lives in its own process group, so find it by parent)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def crash_worker_running(h: BenchbotHost, job_id: str) -> float:
    """SIGKILL the worker that runs ``job_id`` and its horse at once, as the OOM killer or a reboot would.

    Returns the monotonic time of the kill.
    """
    started = first(events.job_events(h.r, job_id), events.STARTED)
    name = str(started.data["worker"])
    index = int(name.rsplit("-", 1)[1]) - 1
    proc = h.workers[index]
    horses = children_of(proc.pid)
    assert horses, f"worker {name} has no horse running {job_id}"
    for pid in horses:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    h.kill_worker(proc)
    return time.monotonic()


def phase_seen(h: BenchbotHost, job_id: str, phase: str) -> bool:
    return any(e.type == events.PROGRESS and e.data.get("phase") == phase for e in events.job_events(h.r, job_id))


def queue_job(h: BenchbotHost, user: str, line: str) -> str:
    reply = h.run(user, line)
    assert reply.ok and reply.job_id, reply.text
    return reply.job_id


# --------------------------------------------------------------------------- workers killed mid-job


def test_worker_killed_mid_bench_frees_the_host_fails_the_job_and_the_next_job_runs(
    redis_url: str, tmp_path: Path
) -> None:
    with BenchbotHost(redis_url, tmp_path, lease_ttl_s=TTL_S) as h:
        h.launch_ok("alice", "/launch cutlass cudnn")
        server = h.engine_pids()
        assert len(server) == 1
        doomed = queue_job(h, "alice", "/bench 1,4 in=64 out=64 n=400 any")
        after = queue_job(h, "bob", f"/bench {SHORT_BENCH} any")
        wait_until(lambda: phase_seen(h, doomed, "bench"), timeout=30, what="the bench to be measuring")
        killed_at = crash_worker_running(h, doomed)

        def lease_moved_on() -> bool:
            holder = lease.current_holder(h.r, HOST)  # read once: it may expire between two reads
            return holder is None or holder[0].job != doomed

        wait_until(lease_moved_on, timeout=TTL_S + 5, what="the dead job's lease to go")
        wait_until(
            lambda: events.terminal_type(h.r, doomed) == events.FAILED,
            timeout=TTL_S + 5 - (time.monotonic() - killed_at) + 0.5,
            what="the dead job to be reported failed",
        )
        assert time.monotonic() - killed_at <= TTL_S + 5
        dead = events.job_events(h.r, doomed)[-1]
        assert dead.data["diagnosis"]["category"] == "worker_died"
        assert "worker died" in dead.data["message"]

        terminal, _ = h.wait(after, timeout=60)
        assert terminal.type == events.SUCCEEDED, terminal.data
        # the half-measured bench stored nothing; the ready server it measured was left serving
        assert [r.job_id for r in store.list_runs(h.r, n=50)] == [after]
        assert h.engine_pids() == server
        assert [e.type for e in events.job_events(h.r, doomed)].count(events.FAILED) == 1


def test_worker_killed_mid_launch_the_next_bench_finds_the_half_started_server_and_stops_it(
    redis_url: str, tmp_path: Path
) -> None:
    with BenchbotHost(redis_url, tmp_path, lease_ttl_s=TTL_S, sim_startup_s=6.0) as h:
        launch = queue_job(h, "alice", "/launch cutlass cudnn")
        bench = queue_job(h, "alice", f"/bench {SHORT_BENCH}")  # meant for the server that launch starts
        wait_until(lambda: phase_seen(h, launch, "watch"), timeout=30, what="the engine to be starting")
        half_started = h.engine_pids()
        assert len(half_started) == 1
        crash_worker_running(h, launch)

        terminal, seen = h.wait(bench, timeout=40)
        assert events.terminal_type(h.r, launch) == events.FAILED
        assert "worker died" in events.job_events(h.r, launch)[-1].data["message"]
        notes = [e.data["message"] for e in seen if e.type == events.PROGRESS and e.data.get("phase") == "cleanup"]
        assert notes, [e.data for e in seen]
        assert f"job {launch}" in notes[0] and "half-started" in notes[0]
        # never benchmarked: the server the requester meant never passed its smoke test
        assert terminal.type == events.FAILED, terminal.data
        assert "nothing is serving" in terminal.data["message"]
        assert store.list_runs(h.r, n=10) == []
        wait_until(lambda: not h.engine_pids(), timeout=10, what="the half-started server to be gone")
        # the terminal event goes out just before the release
        wait_until(lambda: lease.current_holder(h.r, HOST) is None, timeout=5, what="the host to be free")


# --------------------------------------------------------------------------- Redis and SSH go away


def test_queued_jobs_survive_a_redis_crash_with_aof_and_run_in_order(tmp_path: Path) -> None:
    directory = tmp_path / "redis"
    aof = ["--appendfsync", "always"]
    sock = redis_conn.start_redis_server(directory, appendonly=True, extra_args=aof)
    (tmp_path / "host").mkdir()
    h = BenchbotHost(f"unix://{sock}", tmp_path / "host", lease_ttl_s=TTL_S)  # not entered: no worker yet
    try:
        ids = [
            queue_job(h, "alice", "/launch cutlass cudnn"),
            queue_job(h, "bob", "/stop"),
            queue_job(h, "carol", "/stop"),
        ]
        pid = int((directory / "redis.pid").read_text())
        os.kill(pid, signal.SIGKILL)  # a crash, not a clean shutdown: only the fsynced AOF can save the jobs
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=10, what="redis to die")
        with pytest.raises(redis.ConnectionError):
            h.r.ping()
        redis_conn.start_redis_server(directory, appendonly=True, extra_args=aof)  # same dir: replays the AOF

        assert [j.job_id for j in queue.list_jobs(h.r, HOST)] == ids
        assert [events.job_events(h.r, j)[0].type for j in ids] == [events.QUEUED] * 3
        h.start_worker()
        endings = [h.wait(job, timeout=60)[0] for job in ids]
        assert [e.type for e in endings] == [events.SUCCEEDED] * 3, [e.data for e in endings]
        started = [events.Event.from_entry(i, f) for i, f in h.r.xrange(events.GLOBAL_STREAM)]
        assert [e.job for e in started if e.type == events.STARTED] == ids  # each once, in queue order
        assert "stopped" in endings[1].data["message"] and "nothing on port" in endings[2].data["message"]
    finally:
        h.close()
        redis_conn.stop_redis_server(directory)


@pytest.fixture
def ssh_server(tmp_path: Path) -> Iterator[AsyncsshServer]:
    """asyncssh's server; a test may stop it early (the link cut for good), so stop only once."""
    directory = tmp_path / "ssh"
    directory.mkdir()
    server = AsyncsshServer(directory)
    server.start()
    server.stopped = False  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        if not server.stopped:  # type: ignore[attr-defined]
            server.stop()


def test_ssh_link_cut_mid_launch_is_a_clear_failure_and_frees_the_host(
    redis_url: str, tmp_path: Path, ssh_server: AsyncsshServer
) -> None:
    (tmp_path / "host").mkdir()
    with BenchbotHost(
        redis_url, tmp_path / "host", ssh=ssh_server, lease_ttl_s=TTL_S, sim_startup_s=3.0, workers=1
    ) as h:
        launch = queue_job(h, "alice", "/launch cutlass cudnn")
        wait_until(lambda: phase_seen(h, launch, "watch"), timeout=30, what="the engine to be starting over SSH")
        ssh_server.stop()  # sshd gone: every connection dropped, new ones refused
        ssh_server.stopped = True  # type: ignore[attr-defined]

        terminal, _ = h.wait(launch, timeout=60)
        assert terminal.type == events.FAILED
        message = terminal.data["message"]
        assert "127.0.0.1" in message or HOST in message, message
        assert "internal error" not in message and "Traceback" not in message
        wait_until(lambda: lease.current_holder(h.r, HOST) is None, timeout=5, what="the lease to be released")
        # the host is not stuck: the next job gets it at once and fails just as clearly
        stop = queue_job(h, "alice", "/stop")
        terminal, _ = h.wait(stop, timeout=60)
        assert terminal.type == events.FAILED and "internal error" not in terminal.data["message"]
        wait_until(lambda: lease.current_holder(h.r, HOST) is None, timeout=5, what="the lease to be released")


# --------------------------------------------------------------------------- Slack failing in bursts


def test_slack_429_and_500_bursts_and_a_notifier_restart_deliver_every_thread_in_order(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    from bot.slack_standin import UPLOAD, SlackStandIn
    from tests.factories import make_run
    from tests.integration.test_slack_notifier import (
        CHANNEL,
        EXPECTED_THREAD,
        all_delivered,
        describe,
        header,
        launch_bench_result,
        open_thread,
        publish_launch_start,
        running,
    )

    jobs = ("31", "32")
    expected = {"31": [e.replace("r1", "r31") for e in EXPECTED_THREAD], "32": ["Verified config", "Failed: boom"]}
    events.ensure_group(redis_client)
    with SlackStandIn() as standin:
        store.save_run(redis_client, make_run("r31", host="gpu-1"))
        threads = {job: open_thread(redis_client, standin, job) for job in jobs}
        # Slack has a bad minute: bursts of 429 (with Retry-After) and 500 on every method the notifier uses
        standin.fail_next("chat.update", 4, status=429, retry_after=0.2)
        standin.fail_next("chat.postMessage", 2, status=500)
        standin.fail_next(UPLOAD, 2, status=500)
        standin.fail_next("files.completeUploadExternal", 2, status=429, retry_after=0.2)
        with running(redis_client, standin, tmp_path, consumer="n1", thread_wait_s=1.0):
            for job in jobs:
                publish_launch_start(redis_client, job)
            wait_until(
                lambda: any(describe(standin.thread(CHANNEL, threads[j])) for j in jobs),
                timeout=30,
                what="the first thread reply",
            )
        # the notifier restarts mid-way (a deploy); the jobs go on publishing meanwhile
        events.publish(redis_client, "31", events.SUCCEEDED, launch_bench_result("r31"))
        events.publish(redis_client, "32", events.FAILED, {"message": "boom", "diagnosis": None})
        standin.fail_next("chat.postMessage", 2, status=500)
        standin.fail_next("chat.update", 2, status=429, retry_after=0.2)
        with running(redis_client, standin, tmp_path, consumer="n1", thread_wait_s=1.0):
            wait_until(
                lambda: (
                    all_delivered(redis_client)
                    and all(len(standin.thread(CHANNEL, threads[j])) == len(expected[j]) for j in jobs)
                ),
                timeout=60,
                what="every thread complete",
            )
        failures = [c.status for c in standin.calls if c.status != 200]
        for job in jobs:
            assert describe(standin.thread(CHANNEL, threads[job])) == expected[job]  # all there, in order, once
        assert header(standin, threads["31"]).text.endswith("#31 done")
        assert header(standin, threads["32"]).text.endswith("#32 failed")
        assert len(standin.top_level()) == len(jobs)
    assert failures.count(429) >= 6 and failures.count(500) >= 6  # the bursts really happened
