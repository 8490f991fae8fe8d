"""Noticing dead jobs: a holder whose lease expired unreleased, a waiter whose worker died, a job that
left RQ without running. Each gets its ``failed`` event once, even when no next job comes for the host.

Called from each worker's maintenance loop every few seconds (:func:`reap_dead_jobs`); the next
acquirer of a lease also reports a dead previous holder (:func:`workers.jobs.lease.try_acquire`).
"""

from __future__ import annotations

import redis

from workers import keys
from workers.jobs import events
from workers.jobs.lease import LeaseHolder, last_key, lease_key, report_dead_holder
from workers.jobs.waiting_line import (
    HOSTS_KEY,
    QUEUED_MARK,
    remove_waiter,
    waiter_prefix,
    waiters_key,
    waiting_jobs,
)
from workers.redis_conn import text_client

# KEYS: lease, last.  The record of a holder whose lease expired without a release, taken once.
_TAKE_ORPHAN = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local v = redis.call('GET', KEYS[2])
if v then redis.call('DEL', KEYS[2]) end
return v
"""


# KEYS: waiters.  ARGV: job, waiter key.  Removes a waiter whose liveness key is gone.
_DROP_DEAD_WAITER = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
if redis.call('EXISTS', ARGV[2]) == 1 then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
"""


def _rq_job_gone(r: redis.Redis, job_id: str) -> bool:
    """True if RQ no longer has the job, or has it in a final state (deleted, cancelled, failed...)."""
    status = text_client(r).hget(keys.rq_job(job_id), "status")
    if status is None:
        return True
    return status in {"finished", "failed", "stopped", "canceled"}


def reap_dead_jobs(r: redis.Redis) -> list[str]:
    """Report jobs whose worker died, on every known host; returns the job ids reported.

    Called from each worker's maintenance loop every few seconds so a dead job gets its ``failed``
    event even when no next job comes to take the host.
    """
    r = text_client(r)
    reported: list[str] = []
    for host in r.smembers(HOSTS_KEY):
        orphan = r.eval(_TAKE_ORPHAN, 2, lease_key(host), last_key(host))
        if orphan:
            holder = LeaseHolder.from_json(orphan)
            if not events.is_terminal(r, holder.job):
                report_dead_holder(r, host, holder)
                reported.append(holder.job)
        for job_id in waiting_jobs(r, host):
            waiter = waiter_prefix(host) + job_id
            if r.eval(_DROP_DEAD_WAITER, 1, waiters_key(host), job_id, waiter):
                published = events.publish(
                    r,
                    job_id,
                    events.FAILED,
                    {
                        "message": f"worker died while job {job_id} was waiting for {host}",
                        "diagnosis": {
                            "category": "worker_died",
                            "host": host,
                            "summary": "the worker running this job died",
                        },
                    },
                )
                if published is not None:
                    reported.append(job_id)
                continue
            if r.get(waiter) == QUEUED_MARK and _rq_job_gone(r, job_id):
                # Deleted or failed outside benchbot (rq empty, stuck in RQ's intermediate queue...).
                remove_waiter(r, host, job_id)
                published = events.publish(
                    r, job_id, events.FAILED, {"message": f"job {job_id} left the queue without running"}
                )
                if published is not None:
                    reported.append(job_id)
    return reported
