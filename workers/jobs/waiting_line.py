"""The line of jobs waiting for a GPU host: first in, first served, with each waiter's liveness.

Shape (the keys are named in :mod:`workers.keys`):

* :func:`~workers.keys.lease_waiters`: the line, a ZSET of job ids scored by their sequence number,
  plus one liveness key per waiter (:func:`~workers.keys.lease_waiter`): "queued" (no TTL) from enqueue until a
  worker dequeues the job, then the worker's name with a short TTL that the waiting job refreshes.
  Only the first live waiter may take a free lease (:mod:`workers.jobs.lease`), so with several
  workers on one host jobs still run in enqueue order; a waiter whose liveness key expired (its worker
  died) is skipped, and reported by :mod:`workers.jobs.reaper`.
* :data:`~workers.keys.LEASE_HOSTS`: every host that ever had a job enqueued or a lease granted.
"""

from __future__ import annotations

import redis

from workers import keys
from workers.redis_conn import text_client

HOSTS_KEY = keys.LEASE_HOSTS
#: RQ's list key of a host's queue is this plus the host name (:func:`workers.keys.rq_queue`).
RQ_QUEUE_KEY_PREFIX = keys.RQ_QUEUE_PREFIX + keys.QUEUE_NAME_PREFIX
#: The liveness of a waiter no worker has dequeued yet.
QUEUED_MARK = "queued"


waiters_key = keys.lease_waiters
waiter_prefix = keys.lease_waiter_prefix


def add_waiter(r: redis.Redis | redis.client.Pipeline, host: str, job_id: str, seq: int) -> None:
    """Put a just-enqueued job in the host's line (liveness "queued", no TTL until dequeued)."""
    r.zadd(waiters_key(host), {job_id: seq}, nx=True)
    r.set(waiter_prefix(host) + job_id, QUEUED_MARK)
    r.sadd(HOSTS_KEY, host)


def mark_dequeued(r: redis.Redis, host: str, job_id: str, worker: str, ttl_s: float) -> bool:
    """A worker took the job: from now on its liveness expires unless the job refreshes it."""
    return bool(r.set(waiter_prefix(host) + job_id, worker, px=int(ttl_s * 1000), xx=True))


def keep_waiting(r: redis.Redis, host: str, job_id: str, seq: int, worker: str, ttl_s: float) -> None:
    """Stay in the line (registered if enqueue did not) with liveness ``worker`` for one more ``ttl_s``."""
    pipe = r.pipeline()
    pipe.zadd(waiters_key(host), {job_id: seq}, nx=True)
    pipe.set(waiter_prefix(host) + job_id, worker, px=max(1, int(ttl_s * 1000)))
    pipe.sadd(HOSTS_KEY, host)
    pipe.execute()


def remove_waiter(r: redis.Redis, host: str, job_id: str) -> None:
    """Leave the line (the job ended or was cancelled before it got the host)."""
    pipe = r.pipeline()
    pipe.zrem(waiters_key(host), job_id)
    pipe.delete(waiter_prefix(host) + job_id)
    pipe.execute()


def waiting_jobs(r: redis.Redis, host: str) -> list[str]:
    """Job ids in the host's line, in order (live or not yet reaped)."""
    return list(text_client(r).zrange(waiters_key(host), 0, -1))


def waiters(r: redis.Redis, host: str) -> list[tuple[str, str | None]]:
    """The host's line in order: (job id, liveness) with liveness "queued", a worker name, or None (dead)."""
    ids = waiting_jobs(r, host)
    if not ids:
        return []
    values = text_client(r).mget([waiter_prefix(host) + job_id for job_id in ids])
    return list(zip(ids, values, strict=True))


def liveness(r: redis.Redis, entries: list[tuple[str, str]]) -> list[str | None]:
    """Liveness of (host, job id) entries of any lines, in one round trip: "queued", a worker, or None."""
    if not entries:
        return []
    return list(text_client(r).mget([waiter_prefix(host) + job_id for host, job_id in entries]))


def known_hosts(r: redis.Redis) -> list[str]:
    """Every host that ever had a job enqueued or a lease granted."""
    return sorted(text_client(r).smembers(HOSTS_KEY))
