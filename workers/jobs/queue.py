"""Per-host job queues: enqueue, list, inspect and cancel jobs.

One RQ queue per GPU host (``benchbot-<host>``), JSON-serialized (no pickle crosses Redis). Job ids
are the global sequence number (``INCR`` :data:`workers.keys.JOB_SEQ`) so people can type them ("cancel 17").
Enqueue runs under one short Redis lock so the per-user limit is exact and RQ's list order equals
sequence order, which is what the lease's FIFO line relies on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from rq import Queue
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from workers import keys, replication
from workers.errors import BenchbotError
from workers.jobs import events, lease, waiting_line
from workers.json_value import JsonObject, RawJson
from workers.redis_conn import rq_client, text_client

log = logging.getLogger(__name__)

QUEUE_PREFIX = keys.QUEUE_NAME_PREFIX
SEQ_KEY = keys.JOB_SEQ
ENQUEUE_LOCK_KEY = keys.ENQUEUE_LOCK
#: What RQ runs, by dotted path: jobs already queued in Redis name it, so it stays where it is.
JOB_FUNC = "workers.jobs.runner.execute"
RESULT_TTL_S = 24 * 3600
FAILURE_TTL_S = 7 * 24 * 3600
CANCEL_FLAG_TTL_S = 24 * 3600
# KEYS: the job's terminal marker, its cancel flag.  ARGV: flag value, flag TTL.
# Sets the flag only while the job has not ended; returns how it ended otherwise. Together with the
# job's atomic "succeeded unless cancelled" (events.publish_unless) a cancel can never be lost between.
_FLAG_CANCEL = """
local ended = redis.call('GET', KEYS[1])
if ended then return ended end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
return false
"""
_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_JOB_ID_RE = re.compile(r"^[0-9]{1,18}$")


queue_name = keys.queue_name


def host_queue(r: redis.Redis, host: str) -> Queue:
    """The host's RQ queue with the JSON serializer."""
    return Queue(queue_name(host), connection=rq_client(r), serializer=JSONSerializer)


#: Flag set by :func:`cancel` on a running job; its JobContext and its worker watch it.
cancel_key = keys.job_cancel


def _check_host(host: str) -> None:
    if not _HOST_RE.match(host or ""):
        raise BenchbotError(f"{host!r} is not a valid host name (letters, digits, '.', '_' and '-')")


@dataclass(frozen=True)
class QueuedJob:
    """What enqueue tells the requester: the id to refer to and where the job stands.

    ``position`` is the 1-based place among jobs not yet started on the host; ``ahead`` counts every
    unfinished job on the host before this one (running, waiting for the host, queued).
    """

    job_id: str
    seq: int
    host: str
    position: int
    ahead: int


@dataclass(frozen=True)
class JobInfo:
    """One job as people see it.

    ``state``: queued (not picked by a worker), waiting (picked, waiting for the host), running
    (holds the host), succeeded / failed / cancelled, or an RQ status for jobs outside the line.
    ``position`` is the 1-based place in the host's line (1 = running or next), None once ended.
    """

    job_id: str
    seq: int
    host: str
    user: str
    channel: str
    kind: str
    summary: str
    enqueued_at: float
    state: str
    position: int | None = None

    def to_dict(self) -> dict[str, object]:
        """Its fields as JSON (flat: ``dataclasses.asdict``'s deep copy cost /queue of 1,000 jobs 11 ms)."""
        return dict(vars(self))


# ---- enqueue ----------------------------------------------------------------------------------


def _queued_count_for(r: redis.Redis, user: str) -> int:
    """How many of ``user``'s jobs have not started yet, in time proportional to that user's jobs.

    Each enqueue adds ``host|job`` to the user's set; an entry whose job left the "queued" state (a
    worker took it, it was cancelled or it ended) is dropped here, lazily.
    """
    key = keys.user_queued(user)
    members = list(text_client(r).smembers(key))
    entries = [tuple(m.split("|", 1)) for m in members]
    states = waiting_line.liveness(r, [(host, job) for host, job in entries])
    stale = [m for m, state in zip(members, states, strict=True) if state != waiting_line.QUEUED_MARK]
    if stale:
        r.srem(key, *stale)
    return len(members) - len(stale)


def _ahead_on(r: redis.Redis, host: str) -> tuple[int, int]:
    """(jobs not yet started, all unfinished jobs) on the host right now."""
    line = [(j, live) for j, live in waiting_line.waiters(r, host) if live is not None]
    not_started = sum(1 for _, live in line if live == waiting_line.QUEUED_MARK)
    running = 1 if lease.current_holder(r, host) is not None else 0
    return not_started, len(line) + running


def enqueue(
    r: redis.Redis,
    host: str,
    kind: str,
    payload: JsonObject,
    *,
    user: str,
    channel: str,
    summary: str,
    job_timeout_s: int,
    max_queued_per_user: int | None = None,
    func: Callable[..., Any] | str = JOB_FUNC,
    outcome_kind: str | None = None,
) -> QueuedJob:
    """Queue a job for ``host``; refuses (nothing enqueued) when ``user`` already has too many queued.

    ``outcome_kind`` (from the typed payload: ``launch+bench`` for a launch that benches) goes into the
    ``queued`` event, so a header drawn from the events alone knows the job's shape.
    """
    _check_host(host)
    if not isinstance(job_timeout_s, int) or job_timeout_s <= 0:
        raise BenchbotError(f"job timeout must be a positive number of seconds, not {job_timeout_s!r}")
    try:
        json.dumps(payload)
    except (TypeError, ValueError) as exc:
        raise BenchbotError(f"the job's parameters cannot be stored: {exc}") from exc
    lock = r.lock(ENQUEUE_LOCK_KEY, timeout=10, blocking_timeout=10, thread_local=False)
    if not lock.acquire():
        raise BenchbotError("the queue is busy right now; try again in a few seconds")
    try:
        if max_queued_per_user is not None:
            queued = _queued_count_for(r, user)
            if queued >= max_queued_per_user:
                raise BenchbotError(
                    f"you already have {queued} job(s) waiting to start (limit {max_queued_per_user}); "
                    "cancel one or wait until one starts"
                )
        not_started, ahead = _ahead_on(r, host)
        seq = int(r.incr(SEQ_KEY))
        job_id = str(seq)
        meta = {
            "user": user,
            "channel": channel,
            "kind": kind,
            "summary": summary,
            "host": host,
            "seq": seq,
            "enqueued_at": time.time(),
        }
        events.publish(
            r,
            job_id,
            events.QUEUED,
            {
                "position": not_started + 1,
                "ahead": ahead,
                "host": host,
                "user": user,
                "channel": channel,
                "kind": kind,
                "summary": summary,
                **({"outcome_kind": outcome_kind} if outcome_kind else {}),
            },
        )
        # One MULTI for RQ's job + list push and our place in line: a reaper or a worker never sees
        # the job in one without the other.
        pipe = rq_client(r).pipeline()
        pipe.multi()
        waiting_line.add_waiter(pipe, host, job_id, seq)
        pipe.sadd(keys.user_queued(user), f"{host}|{job_id}")
        try:
            target: Any = func  # RQ takes a dotted path or a callable (a constrained type variable, not their union)
            host_queue(r, host).enqueue_call(
                target,
                args=(payload,),
                timeout=job_timeout_s,
                result_ttl=RESULT_TTL_S,
                failure_ttl=FAILURE_TTL_S,
                description=f"{kind} on {host} (job {job_id})",
                job_id=job_id,
                meta=meta,
                pipeline=pipe,
            )
            pipe.execute()
        except Exception:
            events.publish(r, job_id, events.FAILED, {"message": "could not be queued (internal error)"})
            raise
        # Before the user is told "queued": a replica has the job (INCRBY 0 is a replicated no-op write
        # later in the stream than the MULTI, whose own connection WAIT would not block inside MULTI).
        _, durable = replication.confirm_write(r, lambda p: p.incrby(SEQ_KEY, 0))
        if not durable:
            log.warning("job %s: queued, but no replica confirmed it; a failover now could lose it", job_id)
    finally:
        try:
            lock.release()
        except redis.exceptions.LockNotOwnedError:  # expired, or lost with a failover: the enqueue is done
            log.warning("job enqueue lock was gone at release (a failover, or a 10 s stall)")
    return QueuedJob(job_id=job_id, seq=seq, host=host, position=not_started + 1, ahead=ahead)


# ---- inspect ----------------------------------------------------------------------------------


def _info_from(job_id: str, meta: RawJson, state: str, position: int | None) -> JobInfo:
    return JobInfo(
        job_id=job_id,
        seq=int(meta.get("seq") or job_id),
        host=str(meta.get("host", "")),
        user=str(meta.get("user", "")),
        channel=str(meta.get("channel", "")),
        kind=str(meta.get("kind", "")),
        summary=str(meta.get("summary", "")),
        enqueued_at=float(meta.get("enqueued_at") or 0.0),
        state=state,
        position=position,
    )


def list_jobs(r: redis.Redis, host: str) -> list[JobInfo]:
    """Unfinished jobs on ``host`` in the order they will run: running first, then the line."""
    ordered: list[tuple[str, str]] = []
    holder = lease.current_holder(r, host)
    if holder is not None and not events.is_terminal(r, holder[0].job):
        ordered.append((holder[0].job, events.JobState.RUNNING))
    for job_id, live in waiting_line.waiters(r, host):
        if live is None or events.is_terminal(r, job_id):
            continue  # dead waiter: the reaper reports it
        ordered.append(
            (job_id, events.JobState.QUEUED if live == waiting_line.QUEUED_MARK else events.JobState.WAITING)
        )
    jobs = (
        Job.fetch_many([j for j, _ in ordered], connection=rq_client(r), serializer=JSONSerializer) if ordered else []
    )
    out: list[JobInfo] = []
    for (job_id, state), job in zip(ordered, jobs, strict=True):
        meta = job.meta if job is not None else {"host": host}
        out.append(_info_from(job_id, meta, state, len(out) + 1))
    return out


def job_info(r: redis.Redis, job_id: str) -> JobInfo | None:
    """Everything known about one job, from RQ and its events; None if there is no such job."""
    job_id = str(job_id).strip().lstrip("#")
    if not _JOB_ID_RE.match(job_id):
        return None
    try:
        job: Job | None = Job.fetch(job_id, connection=rq_client(r), serializer=JSONSerializer)
    except NoSuchJobError:
        job = None
    meta: RawJson = dict(job.meta) if job is not None else {}
    if not meta:
        history = events.job_events(r, job_id)
        if not history:
            return None
        meta = dict(history[0].data) if history[0].type == events.QUEUED else {}
    host = str(meta.get("host", ""))
    ended = events.terminal_type(r, job_id)
    if ended is not None:
        return _info_from(job_id, meta, ended, None)
    if host:
        for info in list_jobs(r, host):
            if info.job_id == job_id:
                return info
    status = job.get_status(refresh=False) if job is not None else None
    state = str(status.value if hasattr(status, "value") else status) if status is not None else "unknown"
    return _info_from(job_id, meta, state, None)


def job_payload(r: redis.Redis, job_id: str) -> RawJson:
    """The payload a job was enqueued with (for Re-run); BenchbotError when RQ no longer has it."""
    try:
        job = Job.fetch(str(job_id), connection=rq_client(r), serializer=JSONSerializer)
    except NoSuchJobError:
        raise BenchbotError(f"job {job_id} is too old to re-run: run its command again") from None
    first = job.args[0] if job.args else None
    if not isinstance(first, dict):
        raise BenchbotError(f"job {job_id} has no payload to re-run")
    return dict(first)


# ---- cancel -----------------------------------------------------------------------------------


#: RQ statuses of a job that is over (what ``job_info`` reports once its own events have expired).
RQ_ENDED = frozenset({"finished", "failed", "stopped", "canceled"})


def cancel(r: redis.Redis, job_id: str, *, by: str, is_admin: bool = False) -> str:
    """Cancel a job: owner or admin only. Returns the message to show.

    A queued job is removed at once and gets its ``cancelled`` event. A started job gets a cooperative
    cancel flag; its JobContext notices it within ~0.5 s, cleans up and publishes ``cancelled``; the
    worker force-stops it if it is still running after the grace period.
    """
    info = job_info(r, job_id)
    if info is None:
        raise BenchbotError(f"there is no job {job_id}")
    # First: whose it was does not matter once it has ended. A long-finished job's events may have
    # expired while RQ still keeps the job: its RQ status says it ended then.
    if info.state in events.TERMINAL or info.state in RQ_ENDED:
        return f"job {info.job_id} already ended ({info.state}); nothing to cancel"
    if info.user != by and not is_admin:
        raise BenchbotError(f"job {info.job_id} belongs to {info.user}; only they or an admin can cancel it")
    queue = host_queue(r, info.host)
    if r.lrem(queue.key, 0, info.job_id):
        # Out of RQ's list, so no worker can pick it up any more; now make RQ and the line agree.
        with contextlib.suppress(NoSuchJobError, InvalidJobOperation):
            Job.fetch(info.job_id, connection=rq_client(r), serializer=JSONSerializer).cancel()
        waiting_line.remove_waiter(r, info.host, info.job_id)
        events.publish(r, info.job_id, events.CANCELLED, {"by": by, "message": f"cancelled by {by} before it started"})
        return f"cancelled job {info.job_id} ({info.summary or info.kind}) before it started"
    ended = text_client(r).eval(
        _FLAG_CANCEL,
        2,
        events.terminal_key(info.job_id),
        cancel_key(info.job_id),
        json.dumps({"by": by, "at": time.time()}),
        CANCEL_FLAG_TTL_S,
    )
    if ended:
        return f"job {info.job_id} already ended ({ended}); nothing to cancel"
    events.publish(
        r, info.job_id, events.PROGRESS, {"phase": "cancelling", "message": f"{by} asked to cancel; stopping"}
    )
    return f"asked job {info.job_id} to stop; if it does not, it is force-stopped after a grace period"


def cancel_requested_by(r: redis.Redis, job_id: str) -> str | None:
    """Who asked to cancel a started job, or None."""
    raw = text_client(r).get(cancel_key(job_id))
    if raw is None:
        return None
    try:
        return str(json.loads(raw).get("by", "someone"))
    except ValueError:
        return "someone"
