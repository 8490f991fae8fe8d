"""When a waiting job should start: an estimate from how long past jobs held a host.

The history is the job-duration record the workers keep for the operators' metrics
(:data:`workers.keys.METRICS_DURATIONS`: the time each ended job held its host, summed and counted per
job kind). A waiting job's ETA is what the running job has left of its kind's mean (at least a tenth of
it: a job past its mean has not ended yet) plus the mean of every job ahead of it. A kind that has
never ended has no history, and then no ETA is given rather than a made-up one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence

import redis

from workers import keys
from workers.jobs.events import JobState
from workers.jobs.queue import JobInfo
from workers.redis_conn import text_client


def mean_held_s(r: redis.Redis) -> dict[str, float]:
    """The mean time a job of each kind held its host, from every ended job counted so far."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for field, value in text_client(r).hgetall(keys.METRICS_DURATIONS).items():
        try:
            kind, what = json.loads(field)[:2]
            if what == "sum":
                sums[str(kind)] = float(value)
            elif what == "count":
                counts[str(kind)] = int(value)
        except (ValueError, TypeError):
            continue
    return {kind: sums[kind] / n for kind, n in counts.items() if n > 0 and kind in sums}


def _running_since(r: redis.Redis, hosts: Sequence[str]) -> dict[str, float]:
    """When each host's lease holder took it (job id -> unix time)."""
    out: dict[str, float] = {}
    for raw in text_client(r).mget([keys.lease(h) for h in hosts]) if hosts else []:
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            continue
        if isinstance(body, dict) and isinstance(body.get("since"), int | float):
            out[str(body.get("job"))] = float(body["since"])
    return out


def waits_s(r: redis.Redis, listing: Mapping[str, Sequence[JobInfo]]) -> dict[str, float]:
    """Seconds until each waiting job should start (jobs whose wait cannot be estimated are left out)."""
    means = mean_held_s(r)
    if not means:
        return {}
    since = _running_since(r, list(listing))
    now = time.time()
    out: dict[str, float] = {}
    for jobs in listing.values():
        ahead: float | None = 0.0
        for job in jobs:
            mean = means.get(job.kind)
            if job.state == JobState.RUNNING:
                if ahead is not None and mean is not None:
                    started = since.get(job.job_id, now)
                    ahead += max(mean - (now - started), 0.1 * mean)
                else:
                    ahead = None
                continue
            if ahead is not None:
                out[job.job_id] = ahead
            ahead = None if ahead is None or mean is None else ahead + mean
    return out


def eta_words(seconds: float) -> str:
    """``ETA ~4 min`` / ``ETA ~40 s`` / ``ETA ~2.5 h``."""
    if seconds < 90:
        return f"ETA ~{max(5, round(seconds / 5) * 5):.0f} s"
    if seconds < 5400:
        return f"ETA ~{seconds / 60:.0f} min"
    return f"ETA ~{seconds / 3600:.1f} h"
