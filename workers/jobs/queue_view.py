"""Every host's line in two Redis round trips: what ``/queue`` of a whole fleet reads.

:func:`workers.jobs.queue.list_jobs` reads one host with a handful of round trips per job (the terminal
marker of each waiter, then RQ's ``fetch_many``); over 50 hosts and 1,000 jobs that is thousands of round
trips and about half a second. The rules here are the very same ones (running first if its job has not
ended, then the line in its ZSET order, dead or ended waiters left out, positions 1-based in that order),
so the order and positions are exactly those the lease grants (:mod:`workers.jobs.lease` walks the same
ZSET); only the reads are batched:

1. one MULTI/EXEC over every host: the lease holder, its TTL and the line (a consistent snapshot of who
   holds each host and who waits, as the lease script itself would see it at that instant);
2. one pipeline over every job seen, three kinds of command however many jobs: each host's waiters'
   liveness (an MGET per host), every job's terminal marker (one MGET) and every job's RQ ``meta`` field (one
   server-side script, :data:`HGET_MANY`; only that field: RQ's full job restore is most of ``fetch_many``'s
   cost). A command per job was 2,000 commands for 1,000 jobs, and packing and parsing them was most of
   ``/queue``'s time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import redis
from rq.job import Job

from workers import keys
from workers.jobs import events, waiting_line
from workers.jobs.lease import LeaseHolder
from workers.jobs.queue import JobInfo, _info_from
from workers.json_value import RawJson
from workers.redis_conn import text_client

#: One field of many hashes in one call: ``KEYS`` the hashes, ``ARGV[1]`` the field; a missing one is nil.
HGET_MANY = """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('HGET', key, ARGV[1])
end
return out
"""


def _meta(raw: str | None, host: str) -> RawJson:
    """RQ's JSON-serialized ``meta`` (as :class:`rq.serializers.JSONSerializer` wrote it), or the host alone."""
    if not raw:
        return {"host": host}
    try:
        body = json.loads(raw)
    except ValueError:
        return {"host": host}
    return body if isinstance(body, dict) else {"host": host}


def list_jobs_many(r: redis.Redis, hosts: Sequence[str]) -> dict[str, list[JobInfo]]:
    """Unfinished jobs per host in the order they will run (as :func:`~workers.jobs.queue.list_jobs`)."""
    t = text_client(r)
    first = t.pipeline()
    for host in hosts:
        first.get(keys.lease(host))
        first.pttl(keys.lease(host))
        first.zrange(keys.lease_waiters(host), 0, -1)
    answers = first.execute() if hosts else []

    holders: dict[str, str | None] = {}
    lines: dict[str, list[str]] = {}
    for i, host in enumerate(hosts):
        raw, ttl_ms, line = answers[3 * i : 3 * i + 3]
        holders[host] = LeaseHolder.from_json(raw).job if raw is not None and ttl_ms != -2 else None
        lines[host] = list(line)

    # Facts of single jobs (is it alive, has it ended, its meta): no MULTI needed, and without one Redis sends
    # no QUEUED per command. The lease and line above are one snapshot.
    second = t.pipeline(transaction=False)
    for host in hosts:
        if lines[host]:
            second.mget([waiting_line.waiter_prefix(host) + job_id for job_id in lines[host]])
    candidates: list[str] = []
    for host in hosts:
        held = holders[host]
        candidates += ([held] if held is not None else []) + lines[host]
    if candidates:
        second.mget([events.terminal_key(job_id) for job_id in candidates])
        # EVAL with the script's text (100 bytes), not EVALSHA: no SCRIPT EXISTS round trip before the pipeline, and
        # nothing to reload on a Redis that never saw it (a restart, a Sentinel failover).
        second.eval(HGET_MANY, len(candidates), *(Job.key_for(job_id) for job_id in candidates), "meta")
    replies = second.execute() if candidates else []

    live_by_host: dict[str, list[str | None]] = {}
    at = 0
    for host in hosts:
        if lines[host]:
            live_by_host[host] = list(replies[at])
            at += 1
        else:
            live_by_host[host] = []
    terminal, raw_metas = (replies[at], replies[at + 1]) if candidates else ([], [])
    ended = {job_id: marker is not None for job_id, marker in zip(candidates, terminal, strict=True)}
    metas: dict[str, str | None] = dict(zip(candidates, raw_metas, strict=True))

    out: dict[str, list[JobInfo]] = {}
    for host in hosts:
        ordered: list[tuple[str, str]] = []
        holder = holders[host]
        if holder is not None and not ended[holder]:
            ordered.append((holder, events.JobState.RUNNING))
        for job_id, live in zip(lines[host], live_by_host[host], strict=True):
            if live is None or ended[job_id]:
                continue  # dead waiter: the reaper reports it
            state = events.JobState.QUEUED if live == waiting_line.QUEUED_MARK else events.JobState.WAITING
            ordered.append((job_id, state))
        out[host] = [
            _info_from(job_id, _meta(metas[job_id], host), state, place)
            for place, (job_id, state) in enumerate(ordered, start=1)
        ]
    return out
