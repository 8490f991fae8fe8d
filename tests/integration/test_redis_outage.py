"""Redis goes away and comes back: unsupervised workers and their observers ride it out.

Real ``benchbot worker`` processes (no supervisor to restart them), each with its observer process,
on a private redis-server that the test stops (``SHUTDOWN``, as a restart or an upgrade begins) and
starts again on the same unix socket, with AOF as in production. Throughout the outage every worker
(same pid) and every observer must stay alive; afterwards ``/status`` is answered again by a fresh
observation, a job enqueued after the restart runs to its end, and the logs say once that Redis went
away and once that it came back, with no traceback. A job that was running meanwhile loses its lease
after one TTL, stops touching the host and ends ``failed`` (``lease_lost``) once Redis is back,
leaving the host free. Past the outage limit a worker exits with a clear message (status 75) so that
a supervisor restarts it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.harness import HOST, BenchbotHost
from tests.util import wait_until
from workers import redis_conn
from workers.jobs import events, lease
from workers.jobs.worker import EXIT_REDIS_GONE

pytestmark = pytest.mark.slow

AOF = ["--appendfsync", "always"]
TTL_S = 3.0


@pytest.fixture
def redis_dir(tmp_path: Path) -> Iterator[Path]:
    """A private redis-server with AOF on ``redis_dir/redis.sock`` that the test may stop and start."""
    directory = tmp_path / "redis"
    redis_conn.start_redis_server(directory, appendonly=True, extra_args=AOF)
    try:
        yield directory
    finally:
        redis_conn.stop_redis_server(directory)


def url_of(directory: Path) -> str:
    return f"unix://{directory / redis_conn.SOCKET_NAME}"


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def observer_of(worker_pid: int) -> int:
    """The observer process a worker spawned (multiprocessing's spawn child, not the resource tracker)."""

    def find() -> int | None:
        for pid in children(worker_pid):
            try:
                if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                continue
        return None

    return wait_until(find, timeout=20, what=f"the observer of worker {worker_pid}")


def outage(directory: Path, seconds: float, still_true: Callable[[], None]) -> None:
    """Stop Redis for ``seconds`` (the scenario itself), checking ``still_true`` all along, then restart it."""
    pid = int((directory / "redis.pid").read_text())
    assert redis_conn.stop_redis_server(directory)
    wait_until(lambda: not alive(pid), timeout=10, what="redis to exit")
    back_at = time.monotonic() + seconds
    while time.monotonic() < back_at:
        still_true()
        time.sleep(0.2)
    redis_conn.start_redis_server(directory, appendonly=True, extra_args=AOF)


def processes_alive(pids: dict[str, int]) -> Callable[[], None]:
    def check() -> None:
        dead = [name for name, pid in pids.items() if not alive(pid)]
        assert not dead, f"{dead} died while Redis was away"

    return check


def assert_rode_it_out(h: BenchbotHost, pids: dict[str, int]) -> None:
    """Same processes alive, each worker said once that Redis went and once that it came back, no traceback."""
    processes_alive(pids)()
    for index in range(1, len(h.workers) + 1):
        text = (h.work / f"worker-{index}.log").read_text(errors="replace")
        assert "Traceback" not in text, text[-4000:]
        me = f"worker test-worker-{index}: Redis"
        assert text.count(f"{me} is unreachable") == 1, text[-4000:]
        assert text.count(f"{me} is back after") == 1, text[-4000:]
        assert text.count("observer for gpu-1: Redis is back after") == 1, text[-4000:]
        assert "could not connect to Redis instance" not in text  # RQ's retry-per-second lines


def status_is_fresh(h: BenchbotHost) -> bool:
    reply = h.run("alice", "/status")
    return reply.ok and reply.data["hosts"][0]["fresh"] is not None


def pids_of(h: BenchbotHost) -> dict[str, int]:
    pids = {}
    for index, proc in enumerate(h.workers, start=1):
        pids[f"worker-{index}"] = proc.pid
        pids[f"observer-{index}"] = observer_of(proc.pid)
    return pids


def test_a_10s_redis_restart_mid_launch_is_ridden_out_and_the_launch_ends_lease_lost(
    redis_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "host").mkdir()
    with BenchbotHost(url_of(redis_dir), tmp_path / "host", workers=2, lease_ttl_s=TTL_S) as h:
        pids = pids_of(h)
        reply = h.run("alice", "/launch cutlass cudnn --sim-startup-s 60")
        assert reply.ok and reply.job_id
        doomed = reply.job_id
        wait_until(
            lambda: any(e.data.get("phase") == "watch" for e in events.job_events(h.r, doomed)),
            timeout=30,
            what="the launch to be watching its engine",
        )
        assert len(h.engine_pids()) == 1

        outage(redis_dir, 10, processes_alive(pids))

        # the launch lost its lease after one TTL without renewal and says so, once, now that Redis is back
        terminal, seen = h.wait(doomed, timeout=30)
        assert terminal.type == events.FAILED, terminal.data
        assert terminal.data["diagnosis"]["category"] == "lease_lost", terminal.data
        assert [e.type for e in seen].count(events.FAILED) == 1
        wait_until(lambda: lease.current_holder(h.r, HOST) is None, timeout=10, what="the host to be free")
        wait_until(lambda: status_is_fresh(h), timeout=20, what="/status to get a fresh observation again")
        # the next launch finds the server the dead one left half-started, stops it and runs to the end
        _, seen_after = h.launch_ok("bob", "/launch cutlass cudnn", timeout=60)
        cleanup = [e.data["message"] for e in seen_after if e.data.get("phase") in ("cleanup", "stop")]
        assert cleanup, [e.data for e in seen_after]
        assert len(h.engine_pids()) == 1
        assert_rode_it_out(h, pids)


@pytest.mark.timeout(110)
def test_a_60s_redis_restart_leaves_idle_workers_and_observers_alive_and_serving(
    redis_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "host").mkdir()
    with BenchbotHost(url_of(redis_dir), tmp_path / "host", workers=1, lease_ttl_s=TTL_S) as h:
        pids = pids_of(h)
        outage(redis_dir, 60, processes_alive(pids))
        wait_until(lambda: status_is_fresh(h), timeout=20, what="/status to get a fresh observation again")
        terminal, _ = h.launch_ok("alice", "/launch cutlass cudnn then bench 1 in=64 out=16 n=4", timeout=60)
        assert terminal.data["run_id"]
        assert_rode_it_out(h, pids)


def test_after_an_outage_a_lease_left_to_expire_is_its_jobs_to_report_before_the_reaper_takes_it(
    redis_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "host").mkdir()
    with BenchbotHost(url_of(redis_dir), tmp_path / "host", workers=1, lease_ttl_s=TTL_S) as h:
        pids = pids_of(h)
        outage(redis_dir, 4, processes_alive(pids))
        log = h.work / "worker-1.log"
        wait_until(
            lambda: "worker test-worker-1: Redis is back" in log.read_text(),
            timeout=15,
            what="the worker to see Redis back",
        )
        back = time.monotonic()
        # a lease whose job could not renew it through the outage and is about to report lease_lost
        assert isinstance(lease.try_acquire(h.r, HOST, job="ghost", user="carol", ttl_s=0.5), lease.Lease)
        while time.monotonic() < back + TTL_S + 5:  # the grace: one lease TTL and two backoff steps
            assert events.terminal_type(h.r, "ghost") is None, "reaped before its job could report"
            time.sleep(0.2)
        wait_until(
            lambda: events.terminal_type(h.r, "ghost") == events.FAILED,
            timeout=20,
            what="the reaper to report the lease nobody came back for",
        )
        assert events.job_events(h.r, "ghost")[-1].data["diagnosis"]["category"] == "worker_died"
        assert_rode_it_out(h, pids)


def test_a_redis_that_comes_back_empty_gets_the_worker_registered_again(redis_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "host").mkdir()
    with BenchbotHost(url_of(redis_dir), tmp_path / "host", workers=1, lease_ttl_s=TTL_S) as h:
        pids = pids_of(h)
        key = b"rq:worker:test-worker-1"
        assert h.r.sismember("rq:workers", key)

        pid = int((redis_dir / "redis.pid").read_text())
        assert redis_conn.stop_redis_server(redis_dir)
        wait_until(lambda: not alive(pid), timeout=10, what="redis to exit")
        # what a Redis without persistence comes back as: nothing (its AOF is removed while it is down)
        for name in ("appendonly.aof", "appendonlydir"):  # before Redis 7, and since
            path = redis_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        back_at = time.monotonic() + 3
        while time.monotonic() < back_at:
            processes_alive(pids)()
            time.sleep(0.2)
        redis_conn.start_redis_server(redis_dir, appendonly=True, extra_args=AOF)
        assert not h.r.exists("benchbot:events")  # it really came back empty

        wait_until(
            lambda: h.r.sismember("rq:workers", key) and h.r.exists(key),
            timeout=20,
            what="the worker to register with RQ again",
        )
        wait_until(lambda: status_is_fresh(h), timeout=20, what="/status to get a fresh observation again")
        h.launch_ok("alice", "/launch cutlass cudnn", timeout=60)
        assert_rode_it_out(h, pids)


def test_past_the_outage_limit_a_worker_exits_with_a_clear_message_for_its_supervisor(
    redis_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "host").mkdir()
    h = BenchbotHost(url_of(redis_dir), tmp_path / "host", workers=1, lease_ttl_s=TTL_S)
    h.env["BENCHBOT_REDIS_OUTAGE_LIMIT_S"] = "3"
    with h:
        pids = pids_of(h)
        assert redis_conn.stop_redis_server(redis_dir)
        stopped = time.monotonic()
        code = wait_until(lambda: h.workers[0].poll(), timeout=20, what="the worker to give up")
        assert code == EXIT_REDIS_GONE
        assert 3 <= time.monotonic() - stopped < 15
        wait_until(lambda: not alive(pids["observer-1"]), timeout=10, what="its observer to exit with it")
        text = (h.work / "worker-1.log").read_text(errors="replace")
        assert "Redis unreachable for 3 s: exiting (status 75) so that a supervisor restarts this worker" in text
        assert "Traceback" not in text, text[-4000:]
        redis_conn.start_redis_server(redis_dir, appendonly=True, extra_args=AOF)
