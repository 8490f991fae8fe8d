"""The RQ worker that runs benchbot jobs for one or more GPU hosts.

A fork ``Worker`` (the horse can be SIGKILLed, which ``SimpleWorker`` cannot) with four additions:

* every few seconds, even while idle, it reports jobs whose worker died (``lease.reap_dead_jobs``),
  instead of relying on RQ's 600 s maintenance pass;
* when it picks a job it marks the job's place in the host's line as taken by a live worker;
* while a job runs it watches the job's cancel flag, and SIGKILLs the horse if the job has not
  ended ``cancel_grace_s`` after the flag appeared (RQ's own stop-job path: the job lands in the
  FailedJobRegistry as stopped);
* after the horse exits it makes sure the job has exactly one terminal event and no lease left,
  whatever happened to the horse (killed, timed out, raised before entering its JobContext).
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import time
import uuid
from typing import Any

import redis
from rq import Worker
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.serializers import JSONSerializer

from workers import events, lease
from workers.errors import BenchbotError
from workers.job_context import LEASE_TTL_ENV
from workers.queue import QUEUE_PREFIX, cancel_key, cancel_requested_by, queue_name

log = logging.getLogger(__name__)

DEFAULT_REAP_INTERVAL_S = 5
DEFAULT_CANCEL_GRACE_S = 20.0


def _host_of(queue: Queue) -> str:
    return queue.name[len(QUEUE_PREFIX):] if queue.name.startswith(QUEUE_PREFIX) else queue.name


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
        **kwargs: Any,
    ) -> None:
        # Set before super().__init__: it reads dequeue_timeout to size the socket timeout.
        self.lease_ttl_s = lease_ttl_s
        self.cancel_grace_s = cancel_grace_s
        self.reap_interval_s = max(1, int(reap_interval_s))
        self._next_reap = 0.0
        self._cancel_seen_at: float | None = None
        super().__init__(*args, **kwargs)

    @property
    def dequeue_timeout(self) -> int:
        # Wake from the blocking dequeue every few seconds so the idle loop can reap dead jobs.
        return max(1, min(self.worker_ttl - 15, self.reap_interval_s))

    @property
    def should_run_maintenance_tasks(self) -> bool:
        return time.monotonic() >= self._next_reap or super().should_run_maintenance_tasks

    def run_maintenance_tasks(self) -> None:
        self._reap()
        if super().should_run_maintenance_tasks:
            super().run_maintenance_tasks()

    def _reap(self) -> None:
        self._next_reap = time.monotonic() + self.reap_interval_s
        try:
            for job_id in lease.reap_dead_jobs(self.connection):
                self.log.warning("Worker %s: reported job %s as failed (its worker died)", self.name, job_id)
        except redis.RedisError as exc:
            self.log.error("Worker %s: reaping dead jobs failed: %s", self.name, exc)

    def execute_job(self, job: Job, queue: Queue) -> None:
        host = _host_of(queue)
        self._cancel_seen_at = None
        # Give the horse time to fork and reach its JobContext before its place in line can expire.
        lease.mark_dequeued(self.connection, host, job.id, self.name, max(self.lease_ttl_s, 10.0))
        try:
            super().execute_job(job, queue)
        finally:
            self._after_job(job, host)

    def maintain_heartbeats(self, job: Job, execution: Any) -> None:
        super().maintain_heartbeats(job, execution)
        self._enforce_cancel_grace(job)

    def _enforce_cancel_grace(self, job: Job) -> None:
        if not self.connection.exists(cancel_key(job.id)):
            return
        now = time.monotonic()
        if self._cancel_seen_at is None:
            self._cancel_seen_at = now
            return
        if now - self._cancel_seen_at >= self.cancel_grace_s and self._stopped_job_id != job.id:
            self.log.warning(
                "Worker %s: job %s ignored its cancel for %.0f s; force-stopping it", self.name, job.id,
                now - self._cancel_seen_at,
            )
            self._stopped_job_id = job.id  # what RQ's stop-job command sets: the job ends as stopped
            self.kill_horse()

    def _after_job(self, job: Job, host: str) -> None:
        """Whatever the horse did, leave one terminal event, no lease and no place in line."""
        conn = self.connection
        try:
            lease.remove_waiter(conn, host, job.id)
            if not events.is_terminal(conn, job.id):
                kind, data = self._ending_of(job)
                events.publish(conn, job.id, kind, data)
                self.log.info("Worker %s: job %s ended as %s (reported by the worker)", self.name, job.id, kind)
            if lease.release_job(conn, host, job.id):
                self.log.warning("Worker %s: released the lease on %s left by job %s", self.name, host, job.id)
            conn.delete(cancel_key(job.id))
        except redis.RedisError as exc:
            self.log.error("Worker %s: bookkeeping after job %s failed: %s", self.name, job.id, exc)

    def _ending_of(self, job: Job) -> tuple[str, dict[str, Any]]:
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
        return events.FAILED, {"message": _failure_message(exc_string)}


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
    logging_level: str = "INFO",
) -> bool:
    """Run a worker on the hosts' queues until stopped (or, with ``burst``, until they are empty).

    Returns True if it processed any job. Job payloads are never logged (they may carry tokens the
    job reads from its environment by name, but the payload itself should not be echoed anyway).
    """
    if not hosts:
        raise BenchbotError("a worker needs at least one host to serve")
    # The horse is forked from this process, so its JobContext inherits the TTL through the env.
    os.environ[LEASE_TTL_ENV] = str(lease_ttl_s)
    connection = redis.Redis.from_url(redis_url)
    worker = BenchbotWorker(
        [queue_name(h) for h in hosts],
        name=name or default_worker_name(hosts),
        connection=connection,
        serializer=JSONSerializer,
        log_job_description=False,
        job_monitoring_interval=max(1, int(job_monitoring_interval_s)),
        lease_ttl_s=lease_ttl_s,
        cancel_grace_s=cancel_grace_s,
        reap_interval_s=reap_interval_s,
    )
    log.info("worker %s serving %s (lease TTL %.1f s)", worker.name, ", ".join(hosts), lease_ttl_s)
    try:
        return worker.work(burst=burst, logging_level=logging_level)
    finally:
        connection.close()
