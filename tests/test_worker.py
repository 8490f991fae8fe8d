"""Real RQ worker processes: one job per host at a time in FIFO order, crashes, cancels, endings."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from rq import Worker
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from tests import jobfuncs
from tests.util import wait_until
from workers import keys
from workers.errors import LeaseLostError
from workers.jobs import events, lease, queue, waiting_line
from workers.jobs.context import LEASE_LOST_MESSAGE, JobCancelled, JobContext
from workers.jobs.queue import queue_name
from workers.jobs.worker import UNSTARTED_MESSAGE, BenchbotWorker
from workers.redis_conn import rq_client

ROOT = Path(__file__).resolve().parent.parent

StartWorker = Callable[..., subprocess.Popen[bytes]]


def _children_of(pids: set[int]) -> set[int]:
    """Processes whose parent is one of ``pids`` (the horses of our workers)."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid in pids:
            found.add(int(entry.name))
    return found


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def start_worker(redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> Iterator[StartWorker]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        name: str, hosts: tuple[str, ...] = ("h1",), ttl_s: float = 3.0, grace_s: float = 1.0, burst: bool = False
    ) -> subprocess.Popen[bytes]:
        code = (
            "from workers.jobs.worker import run_worker; "
            f"run_worker({redis_url!r}, {list(hosts)!r}, name={name!r}, burst={burst}, lease_ttl_s={ttl_s}, "
            f"cancel_grace_s={grace_s}, reap_interval_s=1, job_monitoring_interval_s=1, logging_level='WARNING')"
        )
        log = (tmp_path / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        procs.append(proc)
        if not burst:
            wait_until(
                lambda: any(w.name == name for w in Worker.all(connection=redis_client)),
                timeout=20,
                what=f"worker {name} to register",
            )
        return proc

    yield start
    for proc in procs:  # freeze the workers first so none forks a new horse while we look
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGSTOP)
    horses = _children_of({p.pid for p in procs})
    horses |= {int(p) for p in redis_client.smembers(jobfuncs.PIDS_KEY)}
    for pid in horses:
        _kill_group(pid)  # a horse is the leader of its own process group
    for proc in procs:
        _kill_group(proc.pid)
        proc.wait(timeout=10)


def _enqueue(r: redis.Redis, func: str, user: str = "alice", **payload: object) -> queue.QueuedJob:
    return queue.enqueue(
        r,
        "h1",
        "test",
        dict(payload),
        user=user,
        channel="C1",
        summary=func,
        job_timeout_s=120,
        func=f"tests.jobfuncs.{func}",
    )


def _ended(r: redis.Redis, *job_ids: str) -> bool:
    return all(events.is_terminal(r, j) for j in job_ids)


def _state(r: redis.Redis, job_id: str) -> str | None:
    info = queue.job_info(r, job_id)
    return info.state if info is not None else None


def _starts(r: redis.Redis) -> list[dict[str, object]]:
    return [e for e in jobfuncs.log_entries(r) if e["what"] == "start"]


def test_two_workers_never_overlap_and_keep_fifo_order(redis_client: redis.Redis, start_worker: StartWorker) -> None:
    start_worker("w-a")
    start_worker("w-b")
    ids = [_enqueue(redis_client, "hold", user=user, hold_s=0.3).job_id for user in ("alice", "bob", "alice", "bob")]
    wait_until(lambda: _ended(redis_client, *ids), timeout=30, what="all four jobs to end")

    log = jobfuncs.log_entries(redis_client)
    spans = {}
    for entry in log:
        spans.setdefault(entry["job"], {})[entry["what"]] = entry["t"]
    order = sorted(spans, key=lambda j: spans[j]["start"])
    assert order == ids  # FIFO even though two workers raced for the host
    for before, after in itertools.pairwise(order):
        assert spans[before]["end"] <= spans[after]["start"], f"job {after} started while {before} ran"
    fences = [e["fence"] for e in log if e["what"] == "start"]
    assert fences == sorted(fences) and len(set(fences)) == 4
    assert len({e["pid"] for e in log}) == 4  # each job in its own forked horse
    workers = {Job.fetch(j, connection=redis_client, serializer=JSONSerializer).worker_name for j in ids}
    assert workers == {"w-a", "w-b"}  # both workers took jobs: only the lease kept them apart
    for job_id in ids:
        types = [e.type for e in events.job_events(redis_client, job_id)]
        assert types[0] == "queued" and types[-1] == "succeeded" and "started" in types
        assert types.index("started") < types.index("succeeded")
    # The terminal event goes out just before the release: give the release its moment.
    wait_until(lambda: lease.current_holder(redis_client, "h1") is None, timeout=5, what="the last release")
    assert queue.list_jobs(redis_client, "h1") == []


def test_sigkilled_worker_frees_host_within_ttl(redis_client: redis.Redis, start_worker: StartWorker) -> None:
    ttl_s = 3.0
    doomed = start_worker("w-doomed", ttl_s=ttl_s)
    first = _enqueue(redis_client, "hold", hold_s=60).job_id
    wait_until(lambda: _starts(redis_client), timeout=20, what="job 1 to start")
    start_worker("w-survivor", ttl_s=ttl_s)
    second = _enqueue(redis_client, "hold", user="bob", hold_s=0.1).job_id
    wait_until(
        lambda: _state(redis_client, second) == "waiting", timeout=20, what="job 2 to wait for the host on the survivor"
    )

    horse_pid = int(_starts(redis_client)[0]["pid"])  # type: ignore[call-overload]
    _kill_group(doomed.pid)
    _kill_group(horse_pid)  # the horse has its own process group: the machine "died" as a whole
    killed_at = time.monotonic()
    doomed.wait(timeout=10)

    wait_until(lambda: len(_starts(redis_client)) == 2, timeout=ttl_s + 5, what="job 2 to get the host")
    assert time.monotonic() - killed_at <= ttl_s + 5
    wait_until(lambda: _ended(redis_client, first, second), timeout=10, what="both jobs to have ended")
    dead = events.job_events(redis_client, first)[-1]
    assert dead.type == "failed" and dead.data["message"].startswith("worker died: lease expired after 3 s")
    assert events.terminal_type(redis_client, second) == "succeeded"
    assert _starts(redis_client)[1]["job"] == second


def test_cancel_running_async_job_and_force_stop_one_that_ignores_it(
    redis_client: redis.Redis, start_worker: StartWorker
) -> None:
    start_worker("w-a", grace_s=1.0)
    polite = _enqueue(redis_client, "async_cooperative").job_id
    stubborn = _enqueue(redis_client, "ignore_cancel").job_id
    after = _enqueue(redis_client, "hold", hold_s=0.05).job_id
    wait_until(lambda: len(_starts(redis_client)) == 1, timeout=20, what="the async job to start")

    with pytest.raises(queue.BenchbotError):
        queue.cancel(redis_client, polite, by="mallory")
    assert not events.is_terminal(redis_client, polite), events.job_events(redis_client, polite)
    asked = time.monotonic()
    assert "asked job" in queue.cancel(redis_client, polite, by="alice")
    wait_until(lambda: _ended(redis_client, polite), timeout=5, what="the cooperative cancel")
    assert time.monotonic() - asked < 2  # the watcher polls every 0.25 s
    ending = events.job_events(redis_client, polite)[-1]
    assert ending.type == "cancelled" and ending.data["by"] == "alice"

    wait_until(lambda: len(_starts(redis_client)) == 2, timeout=20, what="the stubborn job to start")
    queue.cancel(redis_client, stubborn, by="root", is_admin=True)
    wait_until(lambda: _ended(redis_client, stubborn), timeout=15, what="the hard stop")
    ending = events.job_events(redis_client, stubborn)[-1]
    assert ending.type == "cancelled" and ending.data["by"] == "root" and "force-stopped" in ending.data["message"]
    stopped = Job.fetch(stubborn, connection=redis_client, serializer=JSONSerializer)
    assert stopped.get_status() in (JobStatus.STOPPED, JobStatus.FAILED)

    wait_until(lambda: _ended(redis_client, after), timeout=20, what="the next job to run")
    assert events.terminal_type(redis_client, after) == "succeeded"


def test_endings_reported_by_context_and_by_worker(redis_client: redis.Redis, start_worker: StartWorker) -> None:
    friendly = _enqueue(redis_client, "fail_friendly", message="model /m/x not found").job_id
    bug = _enqueue(redis_client, "crash").job_id
    bare = _enqueue(redis_client, "no_context", value=7).job_id
    worker = start_worker("w-burst", burst=True)
    assert worker.wait(timeout=60) == 0
    assert events.job_events(redis_client, friendly)[-1].data["message"] == "model /m/x not found"
    crashed = events.job_events(redis_client, bug)[-1]
    assert crashed.type == "failed" and crashed.data["message"] == "internal error: RuntimeError"
    assert "secret" not in str(crashed.data)
    done = events.job_events(redis_client, bare)[-1]
    assert done.type == "succeeded" and done.data == {"echo": 7}
    assert lease.current_holder(redis_client, "h1") is None and waiting_line.waiting_jobs(redis_client, "h1") == []


def test_a_job_the_worker_learns_nothing_of_ends_as_not_run_unless_it_started(redis_client: redis.Redis) -> None:
    """The worker's bookkeeping after a horse exits, when RQ holds no result for its job: what a primary that
    died just after the fork leaves (the failover test met it). A job that never announced its start under the
    lease did not run: the user is told to queue it again. One that started is not said to have not run."""
    never = _enqueue(redis_client, "hold").job_id  # no result, no `started`
    began = _enqueue(redis_client, "hold").job_id
    events.publish(redis_client, began, events.STARTED, {"worker": "w-gone", "fence": 1, "host": "h1"})
    trimmed = _enqueue(redis_client, "hold").job_id  # a long job's stream loses its oldest events, `started` too
    redis_client.xtrim(keys.job_events(trimmed), maxlen=0)
    events.publish(redis_client, trimmed, events.PROGRESS, {"phase": "bench", "message": "c=1: running"})
    worker = BenchbotWorker([queue_name("h1")], connection=rq_client(redis_client), serializer=JSONSerializer)
    for job_id in (never, began, trimmed):
        worker._after_job(Job.fetch(job_id, connection=rq_client(redis_client), serializer=JSONSerializer), "h1")
    unrun, cut, unknown = (events.job_events(redis_client, j)[-1] for j in (never, began, trimmed))
    assert (unrun.type, unrun.data["message"]) == ("failed", UNSTARTED_MESSAGE)
    for ending in (cut, unknown):  # started, or its start out of sight: not said to have not run
        assert (ending.type, ending.data["message"]) == ("failed", "the job process ended without reporting a result")
    assert waiting_line.waiting_jobs(redis_client, "h1") == []


# ---- JobContext in this process (no worker): the endings a job body can meet -----------------


def test_lost_lease_ends_the_job_as_failed(redis_client: redis.Redis) -> None:
    ctx = JobContext(redis_client=redis_client, job_id="1", host="h1", user="alice", lease_ttl_s=0.6)
    with pytest.raises(LeaseLostError), ctx:
        ctx.fenced_set("server", "pid 10")
        redis_client.delete(lease.lease_key("h1"))  # e.g. expired during a long pause
        wait_until(lambda: ctx.lease is not None and ctx.lease.lost, timeout=5, what="the heartbeat to notice")
        ctx.check()
    types = [e.type for e in events.job_events(redis_client, "1")]
    assert types == ["started", "failed"]
    assert events.job_events(redis_client, "1")[-1].data["message"] == LEASE_LOST_MESSAGE


def test_a_refusal_by_the_host_names_its_cause_in_the_failed_message(redis_client: redis.Redis) -> None:
    """Issue 25 item 7: a stale fence file was named only in the detail, the message said "another worker"."""
    from workers.errors import StaleFenceError

    refusal = "gpu-1 (local): stale fence: /x/.benchbot-fence-1 holds 5, newer than this job's 1"
    ctx = JobContext(redis_client=redis_client, job_id="31", host="h-refused", user="alice", lease_ttl_s=5.0)
    with pytest.raises(StaleFenceError), ctx:
        raise StaleFenceError(refusal)
    ending = events.job_events(redis_client, "31")[-1]
    assert ending.type == "failed" and ending.data["message"] == f"lease lost: the host refused: {refusal}"
    assert ending.data["diagnosis"]["category"] == "lease_lost"


def test_cancel_while_waiting_for_the_host(redis_client: redis.Redis, redis_url: str) -> None:
    blocker = lease.try_acquire(redis_client, "h1", job="0", user="bob", ttl_s=30)
    assert isinstance(blocker, lease.Lease)
    qj = _enqueue(redis_client, "hold")
    redis_client.lpop("rq:queue:benchbot-h1")  # what a worker's dequeue does
    waiting_line.mark_dequeued(redis_client, "h1", qj.job_id, "w", ttl_s=30)
    outcome: list[BaseException] = []

    def body() -> None:
        client = redis.Redis.from_url(redis_url)
        try:
            with JobContext(redis_client=client, job_id=qj.job_id, host="h1", user="alice", seq=qj.seq):
                outcome.append(AssertionError("must not get the host"))
        except BaseException as exc:  # the test inspects whatever escaped
            outcome.append(exc)
        finally:
            client.close()

    thread = threading.Thread(target=body)
    thread.start()
    wait_until(
        lambda: any(e.data.get("phase") == "waiting" for e in events.job_events(redis_client, qj.job_id)),
        what="the job to report it waits",
    )
    queue.cancel(redis_client, qj.job_id, by="alice")
    thread.join(timeout=10)
    assert len(outcome) == 1 and isinstance(outcome[0], JobCancelled)
    assert events.terminal_type(redis_client, qj.job_id) == "cancelled"
    assert waiting_line.waiting_jobs(redis_client, "h1") == []
    assert lease.current_holder(redis_client, "h1")[0].job == "0"  # type: ignore[index]
    blocker.release()


def _started_here(r: redis.Redis) -> queue.QueuedJob:
    """Enqueue a job and take it as a worker would (out of RQ's list, its place in line alive)."""
    qj = _enqueue(r, "hold")
    r.lpop("rq:queue:benchbot-h1")
    waiting_line.mark_dequeued(r, "h1", qj.job_id, "w", ttl_s=30)
    return qj


def test_a_cancel_before_the_commit_ends_the_job_cancelled_after_the_body_cleans_up(redis_client: redis.Redis) -> None:
    qj = _started_here(redis_client)
    cleaned: list[str] = []
    with (
        pytest.raises(JobCancelled),
        JobContext(redis_client=redis_client, job_id=qj.job_id, host="h1", user="alice", seq=qj.seq) as ctx,
    ):
        assert "asked job" in queue.cancel(redis_client, qj.job_id, by="alice")
        try:
            ctx.commit({"ready": True})  # the work is done, but the cancel came first
        except JobCancelled:
            cleaned.append("stopped what it started")
            raise
    assert cleaned == ["stopped what it started"]
    history = events.job_events(redis_client, qj.job_id)
    assert [e.type for e in history if e.type != "progress"] == ["queued", "started", "cancelled"]
    assert history[-1].data["by"] == "alice"
    assert lease.current_holder(redis_client, "h1") is None


def test_after_the_commit_a_cancel_is_told_the_job_ended(redis_client: redis.Redis) -> None:
    qj = _started_here(redis_client)
    with JobContext(redis_client=redis_client, job_id=qj.job_id, host="h1", user="alice", seq=qj.seq) as ctx:
        ctx.commit({"ready": True})
        told = queue.cancel(redis_client, qj.job_id, by="alice")
        assert told == f"job {qj.job_id} already ended (succeeded); nothing to cancel"
        assert queue.cancel_requested_by(redis_client, qj.job_id) is None
    history = events.job_events(redis_client, qj.job_id)
    assert [e.type for e in history] == ["queued", "started", "succeeded"]
    assert history[-1].data == {"ready": True}


def test_a_body_that_never_commits_still_ends_cancelled_if_the_cancel_came_before_its_end(
    redis_client: redis.Redis,
) -> None:
    qj = _started_here(redis_client)
    with JobContext(redis_client=redis_client, job_id=qj.job_id, host="h1", user="alice", seq=qj.seq) as ctx:
        queue.cancel(redis_client, qj.job_id, by="alice")
        ctx.succeed({"ready": True})
    last = events.job_events(redis_client, qj.job_id)[-1]
    assert last.type == "cancelled" and "as it finished" in last.data["message"]


def test_commit_under_a_lost_lease_publishes_no_success(redis_client: redis.Redis) -> None:
    qj = _started_here(redis_client)
    with (
        pytest.raises(LeaseLostError),
        JobContext(
            redis_client=redis_client, job_id=qj.job_id, host="h1", user="alice", seq=qj.seq, lease_ttl_s=0.6
        ) as ctx,
    ):
        redis_client.delete(lease.lease_key("h1"))
        wait_until(lambda: ctx.lease is not None and ctx.lease.lost, timeout=5, what="the heartbeat to notice")
        ctx.commit({"ready": True})
    last = events.job_events(redis_client, qj.job_id)[-1]
    assert last.type == "failed" and last.data["diagnosis"]["category"] == "lease_lost"


def test_a_worker_exits_at_once_even_when_its_channel_thread_read_the_unsubscribe_first(
    redis_client: redis.Redis,
) -> None:
    """The race a burst worker lost in CI (it took 60 s to end): RQ unsubscribes, the command-channel thread reads
    the reply before RQ clears its running flag, and then polls with nothing subscribed while ``stop()`` joins it."""
    worker = BenchbotWorker([queue_name("h-sub")], name="w-sub", connection=rq_client(redis_client))
    worker.subscribe()
    assert worker.pubsub is not None
    worker.pubsub.unsubscribe()  # the thread reads this reply while its running flag is still set
    wait_until(lambda: not worker.pubsub.subscribed, timeout=10, what="the thread to read the UNSUBSCRIBE reply")
    exited = threading.Event()
    threading.Thread(target=lambda: (worker.unsubscribe(), exited.set()), daemon=True).start()
    assert exited.wait(timeout=10), "the worker's exit waited out its command-channel thread's poll"
    assert worker.pubsub_thread is not None and not worker.pubsub_thread.is_alive()
