"""The RQ worker that runs benchbot jobs for one or more GPU hosts.

A fork ``Worker`` (the horse can be SIGKILLed, which ``SimpleWorker`` cannot) with four additions:

* every few seconds, even while idle, it reports jobs whose worker died (``reaper.reap_dead_jobs``),
  instead of relying on RQ's 600 s maintenance pass;
* when it picks a job it marks the job's place in the host's line as taken by a live worker;
* while a job runs it watches the job's cancel flag, and SIGKILLs the horse if the job has not
  ended ``cancel_grace_s`` after the flag appeared (RQ's own stop-job path: the job lands in the
  FailedJobRegistry as stopped);
* after the horse exits it makes sure the job has exactly one terminal event and no lease left,
  whatever happened to the horse (killed, timed out, raised before entering its JobContext);
* it rides out a Redis outage (a restart: seconds to a minute) instead of quitting, which is what RQ
  does when a heartbeat fails mid-job: it logs one line when Redis goes and one when it is back,
  waits with backoff, registers again with RQ if Redis lost its record, and lets a running horse go
  on (the job's lease decides whether it may touch the host). Past ``redis_outage_limit_s`` (10 min by
  default, ``BENCHBOT_REDIS_OUTAGE_LIMIT_S``) it exits with :data:`EXIT_REDIS_GONE` so a supervisor
  restarts it.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import socket
import time
import uuid
from typing import Any

import redis
from rq import Worker
from rq.exceptions import StopRequested
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.serializers import JSONSerializer

from workers.errors import BenchbotError
from workers.jobs import events, lease, reaper, waiting_line
from workers.jobs.context import LEASE_TTL_ENV
from workers.jobs.queue import QUEUE_PREFIX, cancel_key, cancel_requested_by, queue_name
from workers.json_value import JsonObject
from workers.redis_conn import REDIS_DOWN, RedisGoneTooLong, RedisOutage, connect

log = logging.getLogger(__name__)

DEFAULT_REAP_INTERVAL_S = 5
DEFAULT_CANCEL_GRACE_S = 20.0
UNSTARTED_MESSAGE = "Redis went away just as a worker took this job; it did not run (queue it again)"
#: Exit status after Redis stayed away past the limit (EX_TEMPFAIL): "try again", for a supervisor.
EXIT_REDIS_GONE = 75
#: How long the command-channel thread waits per poll; it is also the longest a worker's exit waits for it.
PUBSUB_POLL_S = 1.0


class _QuietRQRedisRetries(logging.Filter):
    """RQ logs an ERROR per retry while Redis is away (its dequeue loop, its pubsub thread, every 1-2 s);
    :class:`RedisOutage` says it once, so these are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "could not connect to Redis instance" not in str(record.msg)


_QUIET_RQ = _QuietRQRedisRetries()


def _host_of(queue: Queue) -> str:
    return queue.name[len(QUEUE_PREFIX) :] if queue.name.startswith(QUEUE_PREFIX) else queue.name


def _failure_message(exc_string: str | None) -> str:
    """A user-fit message from RQ's stored traceback: BenchbotError text as is, else the type only."""
    lines = [line for line in (exc_string or "").strip().splitlines() if line.strip()]
    if not lines:
        return "the job process ended without reporting a result"
    if "work-horse terminated" in exc_string.lower():  # type: ignore[union-attr]
        return "the job process died (killed or out of memory)"
    last = lines[-1]
    name, _, message = last.partition(": ")
    module, _, cls_name = name.rpartition(".")
    if module.startswith("workers."):
        try:
            cls = getattr(importlib.import_module(module), cls_name)
            if isinstance(cls, type) and issubclass(cls, BenchbotError):
                return message or cls_name
        except (ImportError, AttributeError):
            pass
    return f"internal error: {cls_name or name}"


class BenchbotWorker(Worker):
    """RQ fork worker with benchbot's dead-job reaping, cancel enforcement and terminal-event guarantee."""

    def __init__(
        self,
        *args: Any,
        lease_ttl_s: float = lease.DEFAULT_TTL_S,
        cancel_grace_s: float = DEFAULT_CANCEL_GRACE_S,
        reap_interval_s: int = DEFAULT_REAP_INTERVAL_S,
        redis_outage_limit_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        # Set before super().__init__: it reads dequeue_timeout to size the socket timeout.
        self.lease_ttl_s = lease_ttl_s
        self.cancel_grace_s = cancel_grace_s
        self.reap_interval_s = max(1, int(reap_interval_s))
        self._next_reap = 0.0
        self._cancel_seen_at: float | None = None
        self._forked_job_id: str | None = None
        # After an outage, a lease that expired because its horse could not renew it is that job's to
        # report (``lease_lost``, once its horse reaches Redis again), not the reaper's ("worker died").
        self._reap_not_before = 0.0
        super().__init__(*args, **kwargs)
        self.outage = RedisOutage(f"worker {self.name}", self.log, limit_s=redis_outage_limit_s)
        if _QUIET_RQ not in self.log.filters:
            self.log.addFilter(_QUIET_RQ)

    @property
    def dequeue_timeout(self) -> int:
        # Wake from the blocking dequeue every few seconds so the idle loop can reap dead jobs.
        return max(1, min(self.worker_ttl - 15, self.reap_interval_s))

    @property
    def should_run_maintenance_tasks(self) -> bool:
        return time.monotonic() >= self._next_reap or super().should_run_maintenance_tasks

    def run_maintenance_tasks(self) -> None:
        try:
            self._reap()
            if super().should_run_maintenance_tasks:
                super().run_maintenance_tasks()
        except REDIS_DOWN as exc:
            self._ride_out(exc)

    def _reap(self) -> None:
        self._next_reap = time.monotonic() + self.reap_interval_s
        if time.monotonic() < self._reap_not_before:
            return
        try:
            for job_id in reaper.reap_dead_jobs(self.connection):
                self.log.warning("Worker %s: reported job %s as failed (its worker died)", self.name, job_id)
        except REDIS_DOWN:
            raise
        except redis.RedisError as exc:
            self.log.error("Worker %s: reaping dead jobs failed: %s", self.name, exc)

    # ------------------------------------------------------------------ Redis outages

    def _ride_out(self, exc: BaseException) -> None:
        """Wait for Redis to come back (one log line each way), then rejoin RQ; exit past the limit."""
        try:
            self.outage.wait(self.connection, exc, stop=lambda: bool(self._stop_requested))
        except RedisGoneTooLong:
            self.log.error(
                "Worker %s: Redis unreachable for %g s: exiting (status %d) so that a supervisor restarts this worker",
                self.name,
                self.outage.limit_s,
                EXIT_REDIS_GONE,
            )
            raise SystemExit(EXIT_REDIS_GONE) from None
        if self._stop_requested:
            raise StopRequested()
        self._rejoin()

    def _rejoin(self) -> None:
        """After an outage: register with RQ again if Redis lost our record; give horses time to report."""
        self._reap_not_before = time.monotonic() + self.lease_ttl_s + 2 * self.outage.max_delay_s
        try:
            if not self.connection.exists(self.key) or self.connection.hexists(self.key, "death"):
                self.register_birth()
                self.set_state(self.get_state())
                self.log.warning("Worker %s: registered with RQ again (Redis had lost its record)", self.name)
        except REDIS_DOWN as exc:
            self.outage.note(exc)  # gone again: the next Redis call waits for it

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        # RQ calls this first in each turn of its loops: a failure here is where an outage is waited out.
        if pipeline is not None:
            super().heartbeat(timeout, pipeline=pipeline)
            return
        while True:
            try:
                super().heartbeat(timeout)
            except REDIS_DOWN as exc:
                self._ride_out(exc)
                continue
            if self.outage.down:  # an outage noticed while a horse ran, over before it ended
                self.outage.recovered()
                self._rejoin()
            return

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            except REDIS_DOWN as exc:
                self._ride_out(exc)

    def check_for_suspension(self, burst: bool) -> None:
        while True:
            try:
                super().check_for_suspension(burst)
                return
            except REDIS_DOWN as exc:
                self._ride_out(exc)

    def set_shutdown_requested_date(self) -> None:
        # Called from the SIGTERM handler mid-job: a Redis outage must not turn a warm stop into a crash.
        with contextlib.suppress(*REDIS_DOWN):
            super().set_shutdown_requested_date()

    def subscribe(self) -> None:
        """RQ's own command-channel thread polls for 60 s at a time, and redis-py 8's ``stop()`` joins it without a
        bound. When the thread reads the UNSUBSCRIBE reply before RQ clears its running flag, its next poll waits
        out the whole 60 s with nothing subscribed, and the worker's exit with it (a burst worker took 60 s to
        end in CI). A 1 s poll bounds that wait; it costs one idle wake-up per second."""
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]  # RQ annotates it None
            sleep_time=PUBSUB_POLL_S, daemon=True, exception_handler=self._pubsub_exception_handler
        )

    def teardown(self) -> None:
        try:
            super().teardown()
        except REDIS_DOWN as exc:
            self.log.warning("Worker %s: could not record its exit in Redis (%s)", self.name, type(exc).__name__)
            if self.pubsub_thread is not None:
                self.pubsub_thread.stop()

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        # In the horse, for a job that raised. A BenchbotError is an ending written for the user (the
        # engine crashed, the lease was lost): one line. Anything else is a bug: RQ's traceback.
        exc = exc_info[1] if len(exc_info) > 1 else None
        if not isinstance(exc, BenchbotError):
            super().handle_exception(job, *exc_info)
            return
        self.log.warning("Worker %s: job %s failed: %s", self.name, job.id, exc)
        for handler in self._exc_handlers:
            if handler(job, *exc_info) is False:
                break

    def fork_work_horse(self, job: Job, queue: Queue) -> None:
        self._forked_job_id = job.id
        super().fork_work_horse(job, queue)

    def execute_job(self, job: Job, queue: Queue) -> None:
        host = _host_of(queue)
        self._cancel_seen_at = None
        unstarted = False
        try:
            try:
                # Give the horse time to fork and reach its JobContext before its place in line can expire.
                waiting_line.mark_dequeued(self.connection, host, job.id, self.name, max(self.lease_ttl_s, 10.0))
                super().execute_job(job, queue)
            except REDIS_DOWN as exc:
                # Redis went away while RQ recorded the job's start or its end (the horse, if any, has
                # exited: heartbeat failures while it runs are absorbed below). Report once it is back.
                unstarted = self._forked_job_id != job.id
                self._ride_out(exc)
        finally:
            self._after_job(job, host, unstarted=unstarted)

    def maintain_heartbeats(self, job: Job, execution: Any) -> None:
        try:
            super().maintain_heartbeats(job, execution)
            self._enforce_cancel_grace(job)
        except REDIS_DOWN as exc:
            # The horse goes on: its lease (not renewable while Redis is away) tells it when to stop
            # touching the host. Keep waiting for it; the next beat tells whether Redis is back.
            self.outage.note(exc)
            return
        if self.outage.down:
            self.outage.recovered()
            self._rejoin()

    def _enforce_cancel_grace(self, job: Job) -> None:
        if not self.connection.exists(cancel_key(job.id)):
            return
        now = time.monotonic()
        if self._cancel_seen_at is None:
            self._cancel_seen_at = now
            return
        if now - self._cancel_seen_at >= self.cancel_grace_s and self._stopped_job_id != job.id:
            self.log.warning(
                "Worker %s: job %s ignored its cancel for %.0f s; force-stopping it",
                self.name,
                job.id,
                now - self._cancel_seen_at,
            )
            self._stopped_job_id = job.id  # what RQ's stop-job command sets: the job ends as stopped
            self.kill_horse()

    def _after_job(self, job: Job, host: str, *, unstarted: bool = False) -> None:
        """Whatever the horse did, leave one terminal event, no lease and no place in line."""
        conn = self.connection
        try:
            waiting_line.remove_waiter(conn, host, job.id)
            if not events.is_terminal(conn, job.id):
                ending: tuple[str, JsonObject] = (
                    (events.FAILED, {"message": UNSTARTED_MESSAGE}) if unstarted else self._ending_of(job)
                )
                kind, data = ending
                events.publish(conn, job.id, kind, data)
                self.log.info("Worker %s: job %s ended as %s (reported by the worker)", self.name, job.id, kind)
            if lease.release_job(conn, host, job.id):
                self.log.warning("Worker %s: released the lease on %s left by job %s", self.name, host, job.id)
            conn.delete(cancel_key(job.id))
        except redis.RedisError as exc:
            self.log.error("Worker %s: bookkeeping after job %s failed: %s", self.name, job.id, exc)

    def _ending_of(self, job: Job) -> tuple[str, JsonObject]:
        by = cancel_requested_by(self.connection, job.id)
        if by is not None:
            return events.CANCELLED, {"by": by, "message": f"cancelled by {by} (force-stopped)"}
        status = job.get_status(refresh=True)
        if status == JobStatus.FINISHED:
            value = job.return_value(refresh=True)
            payload = value if isinstance(value, dict) else ({} if value is None else {"result": value})
            return events.SUCCEEDED, payload
        result = job.latest_result()
        exc_string = getattr(result, "exc_string", None) if result is not None else None
        if not exc_string and _never_started(self.connection, job.id):
            # No result, and the horse never announced the start it makes under the lease: the job did not
            # run. Only a Redis that went away as it began gets here (with Redis up, a horse that dies leaves
            # RQ's "work-horse terminated" behind): the failover test saw it when the primary died just after
            # the fork. Said as the dequeue's own loss is, so the user knows to queue it again.
            return events.FAILED, {"message": UNSTARTED_MESSAGE}
        return events.FAILED, {"message": _failure_message(exc_string)}


def _never_started(r: redis.Redis, job_id: str) -> bool:
    """The job's whole history is there (it begins with ``queued``: a long job's stream is trimmed from the
    front) and holds no ``started``; a trimmed history proves nothing, so it is not taken as never started."""
    history = events.job_events(r, job_id)
    return bool(history) and history[0].type == events.QUEUED and all(e.type != events.STARTED for e in history)


def default_worker_name(hosts: list[str]) -> str:
    """Unique and readable: machine, pid, first host and a random suffix."""
    return f"{socket.gethostname()}.{os.getpid()}.{hosts[0] if hosts else 'none'}.{uuid.uuid4().hex[:6]}"


def run_worker(
    redis_url: str,
    hosts: list[str],
    *,
    name: str | None = None,
    burst: bool = False,
    lease_ttl_s: float = lease.DEFAULT_TTL_S,
    cancel_grace_s: float = DEFAULT_CANCEL_GRACE_S,
    reap_interval_s: int = DEFAULT_REAP_INTERVAL_S,
    job_monitoring_interval_s: int = 2,
    redis_outage_limit_s: float | None = None,
    logging_level: str = "INFO",
) -> bool:
    """Run a worker on the hosts' queues until stopped (or, with ``burst``, until they are empty).

    Returns True if it processed any job; raises ``SystemExit(EXIT_REDIS_GONE)`` when Redis stayed away
    past ``redis_outage_limit_s`` (default: ``BENCHBOT_REDIS_OUTAGE_LIMIT_S``, else 10 min). Job
    payloads are never logged (they may carry tokens the job reads from its environment by name, but
    the payload itself should not be echoed anyway).
    """
    if not hosts:
        raise BenchbotError("a worker needs at least one host to serve")
    # The horse is forked from this process, so its JobContext inherits the TTL through the env.
    os.environ[LEASE_TTL_ENV] = str(lease_ttl_s)
    connection = connect(redis_url)  # a Sentinel URL gives a client that follows a failover
    name = name or default_worker_name(hosts)
    # RQ's Worker talks to Redis as it is built (CLIENT SETNAME): a worker (re)started while Redis restarts or
    # fails over waits for it, as a running one does, instead of exiting with a traceback.
    starting = RedisOutage(f"worker {name}", log, limit_s=redis_outage_limit_s)
    while True:
        try:
            worker = BenchbotWorker(
                [queue_name(h) for h in hosts],
                name=name,
                connection=connection,
                serializer=JSONSerializer,
                log_job_description=False,
                job_monitoring_interval=max(1, int(job_monitoring_interval_s)),
                lease_ttl_s=lease_ttl_s,
                cancel_grace_s=cancel_grace_s,
                reap_interval_s=reap_interval_s,
                redis_outage_limit_s=redis_outage_limit_s,
            )
            break
        except REDIS_DOWN as exc:
            try:
                starting.wait(connection, exc)
            except RedisGoneTooLong:
                log.error(
                    "worker %s: Redis unreachable for %g s: exiting (status %d)",
                    name,
                    starting.limit_s,
                    EXIT_REDIS_GONE,
                )
                raise SystemExit(EXIT_REDIS_GONE) from None
    log.info("worker %s serving %s (lease TTL %.1f s)", worker.name, ", ".join(hosts), lease_ttl_s)
    try:
        return worker.work(burst=burst, logging_level=logging_level)
    finally:
        connection.close()
