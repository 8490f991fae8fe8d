"""The line of jobs waiting for a GPU host: first in, first served, with each waiter's liveness.

Shape (all keys under ``benchbot:``):

* ``lease:<host>:waiters``: the line, a ZSET of job ids scored by their sequence number, plus one
  liveness key per waiter (``lease:<host>:waiter:<job>``): "queued" (no TTL) from enqueue until a
  worker dequeues the job, then the worker's name with a short TTL that the waiting job refreshes.
  Only the first live waiter may take a free lease (:mod:`workers.jobs.lease`), so with several
  workers on one host jobs still run in enqueue order; a waiter whose liveness key expired (its worker
  died) is skipped, and reported by :mod:`workers.jobs.reaper`.
* ``lease:hosts``: every host that ever had a job enqueued or a lease granted.
"""

from __future__ import annotations

import redis

from workers.redis_conn import as_text

HOSTS_KEY = "benchbot:lease:hosts"
# Must match workers.jobs.queue.queue_name(); spelled out here because queue.py imports this module.
RQ_QUEUE_KEY_PREFIX = "rq:queue:benchbot-"
#: The liveness of a waiter no worker has dequeued yet.
QUEUED_MARK = "queued"


def waiters_key(host: str) -> str:
    """The ZSET of the host's line."""
    return f"benchbot:lease:{host}:waiters"


def waiter_prefix(host: str) -> str:
    """Prefix of the liveness keys of the host's waiters (``+ job id``)."""
    return f"benchbot:lease:{host}:waiter:"


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
    return [as_text(m) for m in r.zrange(waiters_key(host), 0, -1)]


def waiters(r: redis.Redis, host: str) -> list[tuple[str, str | None]]:
    """The host's line in order: (job id, liveness) with liveness "queued", a worker name, or None (dead)."""
    ids = waiting_jobs(r, host)
    if not ids:
        return []
    values = r.mget([waiter_prefix(host) + job_id for job_id in ids])
    return [(job_id, None if v is None else as_text(v)) for job_id, v in zip(ids, values, strict=True)]


def liveness(r: redis.Redis, entries: list[tuple[str, str]]) -> list[str | None]:
    """Liveness of (host, job id) entries of any lines, in one round trip: "queued", a worker, or None."""
    if not entries:
        return []
    values = r.mget([waiter_prefix(host) + job_id for host, job_id in entries])
    return [None if v is None else as_text(v) for v in values]


def known_hosts(r: redis.Redis) -> list[str]:
    """Every host that ever had a job enqueued or a lease granted."""
    return sorted(as_text(h) for h in r.smembers(HOSTS_KEY))
