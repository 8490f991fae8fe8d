"""The context a job body runs in: the host lease, cancellation, progress and exactly one ending.

Usage inside an RQ job (sync or ``async def``)::

    with JobContext() as ctx:           # waits in line for the host, then publishes `started`
        ctx.progress("launch", "starting sglang")
        ctx.check("before_spawn")        # raises LeaseLostError or JobCancelled: call before every side effect
        ctx.fenced_set("server", {...})  # host state, only under our fencing token
        ctx.commit({"url": ...})         # publishes `succeeded` unless a cancel came (then JobCancelled)

On exit the context publishes one terminal event (succeeded / failed / cancelled) unless the body
committed one, and releases the lease. A cancel request is noticed by a watcher thread within ~0.5 s
even while the body sits in a long ``await``; :meth:`JobContext.guard` turns it into a cancelled task.
``check(point)`` / ``check_fence(point)`` are where a test may pause the job (``workers.jobs.faults``).

While Redis is away (a restart) a job keeps going as long as its lease lets it: progress lines are
dropped rather than fatal, and the lease's own rule ends it (no renewal for a whole TTL: lost, stop
touching the host). A job whose body needed Redis and could not reach it ends the same way,
``failed`` with ``lease_lost``; that ending is recorded once Redis is back, never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import redis
from rq import get_current_job
from rq.timeouts import JobTimeoutException

from workers.errors import BenchbotError, LeaseLostError, StaleFenceError
from workers.jobs import events, faults, host_state, lease, waiting_line
from workers.jobs.queue import cancel_key
from workers.json_value import JsonObject, RawJson
from workers.redis_conn import REDIS_DOWN, RedisGoneTooLong, RedisOutage, TextRedis, text_client

log = logging.getLogger(__name__)

T = TypeVar("T")

LEASE_TTL_ENV = "BENCHBOT_LEASE_TTL_S"
LEASE_LOST_MESSAGE = "lease lost: another worker may hold the host; stopped touching it"
REDIS_LOST_MESSAGE = "lease lost: Redis was unreachable, so the host may no longer be ours; stopped touching it"
REDIS_WAIT_MESSAGE = "Redis was unreachable while this job waited for the host; it did not start (queue it again)"
_current: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar("benchbot_job_context", default=None)


class JobCancelled(BenchbotError):
    """Raised by :meth:`JobContext.check` when someone cancelled the job; ends it as ``cancelled``."""

    def __init__(self, by: str = "someone") -> None:
        super().__init__(f"cancelled by {by}")
        self.by = by


def current_job_context() -> JobContext | None:
    """The JobContext entered in this task/thread, if any (for helpers deep in a job body)."""
    return _current.get()


def _default_ttl_s() -> float:
    raw = os.environ.get(LEASE_TTL_ENV)
    try:
        return float(raw) if raw else lease.DEFAULT_TTL_S
    except ValueError:
        return lease.DEFAULT_TTL_S


class JobContext:
    """Lease + events + cancellation for one job. Built from the current RQ job unless told otherwise."""

    def __init__(
        self,
        *,
        redis_client: redis.Redis | None = None,
        job_id: str | None = None,
        host: str | None = None,
        user: str | None = None,
        channel: str | None = None,
        seq: int | None = None,
        kind: str | None = None,
        lease_ttl_s: float | None = None,
        lease_margin_s: float | None = None,
        worker: str | None = None,
        cancel_poll_s: float = 0.25,
    ) -> None:
        self._rq_job = get_current_job() if job_id is None else None
        if self._rq_job is None and (job_id is None or redis_client is None):
            raise RuntimeError("JobContext outside an RQ job needs job_id, host and redis_client")
        meta: RawJson = dict(self._rq_job.meta) if self._rq_job is not None else {}
        # RQ hands the job its own bytes client; benchbot's keys hold text, read through a decoding one.
        self.redis: TextRedis = text_client(redis_client or self._rq_job.connection)  # type: ignore[union-attr]
        self.job_id = str(job_id if job_id is not None else self._rq_job.id)  # type: ignore[union-attr]
        self.host = str(host or meta.get("host") or "")
        if not self.host:
            raise RuntimeError(f"job {self.job_id} has no host")
        self.user = str(user or meta.get("user") or "")
        self.channel = str(channel or meta.get("channel") or "")
        self.kind = str(kind or meta.get("kind") or "")
        raw_seq = seq if seq is not None else meta.get("seq")
        self.seq: int | None = int(raw_seq) if raw_seq is not None else None
        self.lease_ttl_s = lease_ttl_s if lease_ttl_s is not None else _default_ttl_s()
        self.lease_margin_s = lease_margin_s if lease_margin_s is not None else lease.default_margin_s(self.lease_ttl_s)
        self.worker = worker or lease.default_worker_name()
        self.fence: int | None = None
        self.lease: lease.Lease | None = None
        self._cancel_poll_s = cancel_poll_s
        self._cancelled = threading.Event()
        self._cancel_by = "someone"
        self._done: list[str] = []
        self._stop_watch = threading.Event()
        self._watcher: threading.Thread | None = None
        self._result: JsonObject | None = None
        self._token: contextvars.Token[JobContext | None] | None = None
        self._finished = False
        self._committed = False
        self._outage = RedisOutage(f"job {self.job_id}", log)

    # ---- what the body uses ------------------------------------------------------------------

    @property
    def payload(self) -> RawJson:
        """The job's payload (the RQ job's first argument), {} outside RQ."""
        if self._rq_job is not None and self._rq_job.args:
            first = self._rq_job.args[0]
            return dict(first) if isinstance(first, dict) else {}
        return {}

    def progress(self, phase: events.ProgressPhase | str, message: str, **extra: Any) -> None:
        """Publish a progress event (shown in the job's thread); dropped, not fatal, while Redis is away."""
        try:
            data = {**events.ProgressData(str(phase), message).to_dict(), **extra}
            events.publish(self.redis, self.job_id, events.PROGRESS, data)
        except REDIS_DOWN as exc:
            self._outage.note(exc)
            return
        self._outage.recovered()

    def ready(self, payload: JsonObject) -> None:
        """Publish ``ready`` (e.g. the engine answers); the job may go on afterwards."""
        events.publish(self.redis, self.job_id, events.READY, dict(payload))

    def succeed(self, payload: JsonObject) -> None:
        """Set the payload of the ``succeeded`` event published on a clean exit (see also :meth:`commit`)."""
        self._result = dict(payload)

    def commit(self, payload: JsonObject) -> None:
        """Publish ``succeeded`` now, under a valid fence, unless a cancel was requested.

        The cancel flag and the event are checked and written in one Redis step, so a cancel either
        lands first (this raises JobCancelled: the body still holds what it started and cleans it up)
        or finds the job ended. Call it last, where the body can still undo its work.
        """
        self._result = dict(payload)
        self.check_fence(faults.BEFORE_SUCCESS)
        outcome, _ = events.publish_unless(
            self.redis, self.job_id, events.SUCCEEDED, self._result, blocker_key=cancel_key(self.job_id)
        )
        if outcome == events.BLOCKED:
            self.cancel_requested()
            raise JobCancelled(self._cancel_by)
        self._committed = True

    def did(self, what: str) -> None:
        """Note a side effect on the host that is done and stays done ("the engine was stopped (pid 123)").

        A cancel that lands after it cannot undo it, so the job's ending says so: "cancelled by bob after
        the engine was stopped (pid 123)", not a bare "cancelled by bob" that reads as if nothing happened.
        """
        self._done.append(what)

    def cancel_requested(self) -> bool:
        """True once someone asked to cancel this job."""
        if self._cancelled.is_set():
            return True
        try:
            raw = self.redis.get(cancel_key(self.job_id))
        except REDIS_DOWN as exc:  # nobody can cancel through a Redis that is away; the watcher looks again
            self._outage.note(exc)
            return False
        if raw is not None:
            self._note_cancel(raw)
        return self._cancelled.is_set()

    def check_fence(self, point: str | None = None) -> None:
        """Raise LeaseLostError unless the host is still ours with the margin left (see lease.FenceCheck).

        Call it right before a side effect on the host; ``point`` names it (a fault test may pause here).
        A clock comparison while the last proof holds, one Redis round trip after.
        """
        if point is not None:
            faults.pause_at(point, self.job_id)
        if self.lease is None:
            raise LeaseLostError(LEASE_LOST_MESSAGE)
        self.lease.check()

    def check(self, point: str | None = None) -> None:
        """:meth:`check_fence`, then raise JobCancelled if someone cancelled the job."""
        if point is not None or self.lease is not None:
            self.check_fence(point)
        if self.cancel_requested():
            raise JobCancelled(self._cancel_by)

    def request_gate(self, point: str = faults.BEFORE_BENCH_REQUEST) -> Callable[[], None]:
        """A cheap, picklable fence check for a hot path (each bench request): clock compare, Redis rarely."""
        if self.lease is None:
            raise LeaseLostError(LEASE_LOST_MESSAGE)
        return faults.PausingGate(point, self.lease.checker, self.job_id)

    def refence_above(self, floor: int) -> bool:
        """Take a fence above the host's ``floor`` when Redis lost its counter (see ``Lease.refence_above``)."""
        if self.lease is None:
            return False
        fence = self.lease.refence_above(floor)
        if fence is None:
            return False
        self.fence = fence
        return True

    def fenced_set(self, key: str, value: str | Mapping[str, object] | None) -> None:
        """Write host state under this job's fence (raises LeaseLostError if it is stale)."""
        if self.fence is None:
            raise LeaseLostError(LEASE_LOST_MESSAGE)
        host_state.fenced_set(self.redis, self.host, key, value, self.fence)

    def wait(self, seconds: float, poll_s: float = 0.1) -> None:
        """Sleep, but wake up and raise at once on cancel or a lost lease."""
        deadline = time.monotonic() + seconds
        while True:
            self.check()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(poll_s, left))

    async def guard(self, awaitable: Awaitable[T], poll_s: float = 0.1) -> T:
        """Await ``awaitable``; cancel it and raise JobCancelled / LeaseLostError if either happens."""
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=poll_s)
                if done:
                    return task.result()
                try:
                    if self.lease is not None:
                        self.lease.check()  # a clock comparison unless the last proof ran out
                    if self._cancelled.is_set():
                        raise JobCancelled(self._cancel_by)
                except BenchbotError:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    raise
        finally:
            if not task.done():
                task.cancel()

    async def sleep(self, seconds: float) -> None:
        """``asyncio.sleep`` that ends early with JobCancelled / LeaseLostError."""
        await self.guard(asyncio.sleep(seconds))

    # ---- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> JobContext:
        self._token = _current.set(self)
        self._watcher = threading.Thread(target=self._watch_cancel, name=f"cancel-{self.job_id}", daemon=True)
        self._watcher.start()
        try:
            self._abort_if_needed()
            self._take_lease()
            self._announce_start()
        except BaseException as exc:
            self._finish(exc)
            raise
        return self

    def _take_lease(self) -> None:
        """Wait in the host's line and take its lease (a gang's context takes every member's: workers/gang)."""
        self.lease = lease.acquire(
            self.redis,
            self.host,
            job=self.job_id,
            user=self.user,
            worker=self.worker,
            seq=self.seq,
            ttl_s=self.lease_ttl_s,
            margin_s=self.lease_margin_s,
            abort=self._abort_if_needed,
            on_wait=self._on_wait,
            outage=self._outage,  # a Redis restart while waiting in line costs the job nothing
        )
        self.fence = self.lease.fence
        self.lease.start_heartbeat(on_lost=self._on_lost)

    def _give_back_lease(self) -> None:
        """Release what :meth:`_take_lease` took, or leave the line when it took nothing."""
        if self.lease is not None:
            self.lease.release()
        else:
            waiting_line.remove_waiter(self.redis, self.host, self.job_id)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._finish(exc)

    def _announce_start(self) -> None:
        """Under the new lease: make sure the job has not ended meanwhile, then publish ``started``.

        Again under the lease because a copy of this job that a failover handed out twice (its dequeue
        lost) may have run and ended while this one waited in line behind it. A Redis that goes away
        here (a failover hitting just after the grant, which a replica already confirmed) is waited
        out as everywhere else rather than failing a job that holds its host; a retry first looks
        whether the lost reply's ``started`` was written, so it is never shown twice.
        """
        assert self.lease is not None
        retrying = False
        while True:
            try:
                self._abort_if_needed()
                if retrying and any(
                    e.type == events.STARTED and e.data.get("fence") == self.fence
                    for e in events.job_events(self.redis, self.job_id)
                ):
                    return
                events.publish(
                    self.redis,
                    self.job_id,
                    events.STARTED,
                    {"worker": self.worker, "fence": self.fence, "host": self.host},
                )
                self._outage.recovered()
                return
            except REDIS_DOWN as exc:
                self._outage.wait(self.redis, exc)  # RedisGoneTooLong past its limit
                self.lease.check()  # the heartbeat kept it through the outage, or the job stops here
                retrying = True

    def _finish(self, exc: BaseException | None) -> None:
        if self._finished:
            return
        self._finished = True
        try:
            kind, data = self._ending(exc)
            if not self._committed:  # else the body published its `succeeded` itself
                self._record_ending(kind, data)
        finally:
            self._stop_watch.set()
            try:
                self._give_back_lease()
                self.redis.delete(cancel_key(self.job_id))
            except REDIS_DOWN as down:  # gone again: the lease expires by itself within its TTL
                log.warning(
                    "job %s: could not release the lease (%s); it expires by itself", self.job_id, type(down).__name__
                )
            if self._token is not None:
                _current.reset(self._token)
                self._token = None

    def _publish_ending(self, kind: str, data: JsonObject) -> None:
        """One attempt at the terminal event (a second attempt after a partial one publishes nothing new)."""
        if kind != events.SUCCEEDED:
            events.publish(self.redis, self.job_id, kind, data)
            return
        # Same atomic rule as commit(); this body cannot clean up any more, so say what happened.
        outcome, _ = events.publish_unless(self.redis, self.job_id, kind, data, blocker_key=cancel_key(self.job_id))
        if outcome == events.BLOCKED:
            self.cancel_requested()
            events.publish(
                self.redis, self.job_id, events.CANCELLED, self._cancel_ending(self._cancel_by, "as it finished")
            )

    def _record_ending(self, kind: str, data: JsonObject) -> None:
        """Publish the terminal event, waiting out a Redis restart rather than losing it."""
        while True:
            try:
                self._publish_ending(kind, data)
            except REDIS_DOWN as exc:
                try:
                    self._outage.wait(self.redis, exc)
                except RedisGoneTooLong:
                    log.error(
                        "job %s: Redis unreachable for %g s; its ending (%s) could not be recorded; the "
                        "worker reports it when Redis is back",
                        self.job_id,
                        self._outage.limit_s,
                        kind,
                    )
                    raise
                continue
            self._outage.recovered()
            return

    def _ending(self, exc: BaseException | None) -> tuple[str, JsonObject]:
        """Which terminal event this exit means."""
        if isinstance(exc, REDIS_DOWN) and self.lease is None:
            return events.FAILED, {
                "message": REDIS_WAIT_MESSAGE,
                "diagnosis": {"category": "redis_unreachable", "summary": REDIS_WAIT_MESSAGE},
            }
        if isinstance(exc, REDIS_DOWN):
            # The body needed Redis (to record, or to check its fence) and could not reach it: the lease
            # cannot be proven, so the job stopped where it was, exactly as if the lease had been lost.
            return events.FAILED, {
                "message": REDIS_LOST_MESSAGE,
                "diagnosis": {"category": "lease_lost", "summary": REDIS_LOST_MESSAGE},
            }
        if isinstance(exc, LeaseLostError) or (self.lease is not None and self.lease.lost):
            detail = str(exc) if isinstance(exc, LeaseLostError) else LEASE_LOST_MESSAGE
            # The host's own refusal names its cause (a newer token in the fence file, or an expired
            # deadline): say that, not only "another worker may hold the host" (issue 25 item 7).
            message = f"lease lost: the host refused: {exc}" if isinstance(exc, StaleFenceError) else LEASE_LOST_MESSAGE
            return events.FAILED, {
                "message": message,
                "diagnosis": {"category": "lease_lost", "summary": message, "detail": detail},
            }
        if exc is None:
            return events.SUCCEEDED, dict(self._result or {})
        if isinstance(exc, JobCancelled) or (isinstance(exc, asyncio.CancelledError) and self._cancelled.is_set()):
            by = exc.by if isinstance(exc, JobCancelled) else self._cancel_by
            return events.CANCELLED, self._cancel_ending(by)
        if isinstance(exc, BenchbotError):
            diagnosis = getattr(exc, "diagnosis", None)
            return events.FAILED, {"message": str(exc), "diagnosis": diagnosis if isinstance(diagnosis, dict) else None}
        if isinstance(exc, JobTimeoutException):
            limit = getattr(self._rq_job, "timeout", None)
            return events.FAILED, {
                "message": f"timed out after {limit} s" if limit else "timed out",
                "diagnosis": {"category": "timeout", "summary": "the job ran past its timeout"},
            }
        log.error("job %s failed with an internal error", self.job_id, exc_info=exc)
        return events.FAILED, {
            "message": f"internal error: {type(exc).__name__}",
            "diagnosis": {"category": "internal", "summary": "a bug in benchbot; see the worker log"},
        }

    # ---- internals ---------------------------------------------------------------------------

    def _cancel_ending(self, by: str, when: str = "") -> JsonObject:
        """The ``cancelled`` event's data: who, and what the job had done before the cancel landed."""
        done = " and ".join(self._done)
        message = " ".join(part for part in (f"cancelled by {by}", when, f"after {done}" if done else "") if part)
        return events.CancelledData(by, message, done).to_dict()

    def _note_cancel(self, raw: str) -> None:
        try:
            self._cancel_by = str(json.loads(raw).get("by", "someone"))
        except ValueError:
            self._cancel_by = "someone"
        self._cancelled.set()

    def _abort_if_needed(self) -> None:
        if self.cancel_requested():
            raise JobCancelled(self._cancel_by)
        while True:  # a Redis restart or failover as the job starts costs it nothing, as while it waits in line
            try:
                ended = events.is_terminal(self.redis, self.job_id)
            except REDIS_DOWN as exc:
                self._outage.wait(self.redis, exc)  # RedisGoneTooLong past its limit: the job fails saying so
                continue
            self._outage.recovered()
            break
        if ended:
            raise BenchbotError(f"job {self.job_id} was already reported as ended; not starting it")

    def _on_wait(self, kind: str, blocker: str) -> None:
        if kind == "lease":
            holder = lease.LeaseHolder.from_json(blocker)
            message = f"waiting for {self.host}: job {holder.job} ({holder.user}) holds it"
        else:
            message = f"waiting for {self.host}: job {blocker} is ahead in line"
        self.progress(events.ProgressPhase.WAITING, message)

    def _on_lost(self) -> None:
        log.error("job %s: %s", self.job_id, LEASE_LOST_MESSAGE)

    def _watch_cancel(self) -> None:
        client = text_client(lease.own_client(self.redis))
        try:
            while not self._stop_watch.wait(self._cancel_poll_s):
                try:
                    raw = client.get(cancel_key(self.job_id))
                except redis.RedisError:
                    continue
                if raw is not None:
                    self._note_cancel(raw)
                    return
        finally:
            client.close()
