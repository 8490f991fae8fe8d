"""Counters for the operators' dashboard that live in Redis, because the process that sees the event dies.

RQ runs every job in a forked work horse that exits when the job ends: a ``prometheus_client`` counter
bumped there is gone with it, and the worker that forked it never learns the value. So the few events
the dashboard counts (a job's ending, a failure's diagnosis, an engine launch, a lost lease) are counted
in Redis (:data:`workers.keys.METRICS_COUNTERS`, :data:`workers.keys.METRICS_DURATIONS`) in the same
moment they happen, and :mod:`workers.ops_metrics` reads them at scrape time. That also makes them
fleet-wide and restart-proof: any scrape of any benchbot process sees the same totals.

A job's ending is counted where its one terminal event is published (:func:`record_ending`, called by
:mod:`workers.jobs.events` only when the publish actually wrote the event, which happens once per job
whoever publishes it: the job, its worker after a dead horse, or the reaper). Its kind and host come
from its ``queued`` event (the first entry of its stream, always written); its duration is the time it
held the host's lease (the holder record's ``since``, still there when the ending is published).

Recording never fails the caller: a Redis error here loses one increment, not a job's ending.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import redis

from workers import keys
from workers.redis_conn import TextRedis, text_client

log = logging.getLogger(__name__)

#: Upper bounds (seconds) of the job-duration histogram: a stop takes seconds, a 397B launch ten
#: minutes, a sweep hours (the job timeout's default is four).
DURATION_BUCKETS: tuple[float, ...] = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)

JOBS_ENDED = "jobs_ended"  # labels: host, kind, state
JOB_FAILURES = "job_failures"  # labels: host, kind, category
LEASE_LOSSES = "lease_losses"  # labels: host
ENGINE_LAUNCHES = "engine_launches"  # labels: host, engine
ENGINE_LAUNCH_FAILURES = "engine_launch_failures"  # labels: host, engine, category
LEASE_LOST_CATEGORY = "lease_lost"
UNKNOWN = "unknown"


def _field(metric: str, *labels: str) -> str:
    return json.dumps([metric, *labels], separators=(",", ":"))


def _incr(r: redis.Redis, metric: str, *labels: str) -> None:
    try:
        r.hincrby(keys.METRICS_COUNTERS, _field(metric, *labels), 1)
    except redis.RedisError as exc:
        log.warning("metrics: could not count %s (%s)", metric, type(exc).__name__)


@dataclass(frozen=True)
class Ending:
    """What the counters need to know of a job that just ended."""

    job_id: str
    state: str  # succeeded | failed | cancelled
    ended_at: float
    category: str | None = None  # the failure's diagnosis category


def _facts(raw: str | None, queued_event: bool) -> tuple[str, str] | None:
    """(host, kind) from a ``queued`` event's JSON or from RQ's JSON ``meta``; None if it says neither."""
    if not raw:
        return None
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    if queued_event:
        if body.get("type") != "queued" or not isinstance(body.get("data"), dict):
            return None
        body = body["data"]
    if not body.get("host"):
        return None
    return str(body["host"]), str(body.get("kind") or UNKNOWN)


def _queued_facts(t: TextRedis, job_id: str) -> tuple[str, str]:
    """(host, kind) from the job's first event (``queued``), else from RQ's ``meta`` (a stream trimmed past
    its first entry by a long sweep's progress lines); ``unknown`` for a job queued some other way."""
    first = t.xrange(keys.job_events(job_id), count=1)
    found = _facts(first[0][1].get("event"), queued_event=True) if first else None
    if found is None:
        found = _facts(t.hget(keys.rq_job(job_id), "meta"), queued_event=False)
    return found or (UNKNOWN, UNKNOWN)


def _held_since(raws: list[str | None], job_id: str) -> float | None:
    """When ``job_id`` was granted the lease, from the live holder record or the last one kept after it."""
    for raw in raws:
        if not raw:
            continue
        try:
            body = json.loads(raw)
        except ValueError:
            continue
        if isinstance(body, dict) and str(body.get("job")) == job_id and isinstance(body.get("since"), int | float):
            return float(body["since"])
    return None


def record_ending(r: redis.Redis, ending: Ending) -> None:
    """Count one job's ending (and its failure category, lost lease and held time). Three round trips."""
    t = text_client(r)
    try:
        host, kind = _queued_facts(t, ending.job_id)
        since = None
        if host != UNKNOWN:
            since = _held_since(t.mget([keys.lease(host), keys.lease_last(host)]), ending.job_id)
        pipe = t.pipeline(transaction=False)
        pipe.hincrby(keys.METRICS_COUNTERS, _field(JOBS_ENDED, host, kind, ending.state), 1)
        if ending.state == "failed":
            category = ending.category or UNKNOWN
            pipe.hincrby(keys.METRICS_COUNTERS, _field(JOB_FAILURES, host, kind, category), 1)
            if category == LEASE_LOST_CATEGORY:
                pipe.hincrby(keys.METRICS_COUNTERS, _field(LEASE_LOSSES, host), 1)
        if since is not None:
            held = max(0.0, ending.ended_at - since)
            bucket = next((i for i, bound in enumerate(DURATION_BUCKETS) if held <= bound), len(DURATION_BUCKETS))
            pipe.hincrby(keys.METRICS_DURATIONS, json.dumps([kind, "bucket", bucket]), 1)
            pipe.hincrbyfloat(keys.METRICS_DURATIONS, json.dumps([kind, "sum"]), held)
            pipe.hincrby(keys.METRICS_DURATIONS, json.dumps([kind, "count"]), 1)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("metrics: could not count the ending of job %s (%s)", ending.job_id, type(exc).__name__)


def record_launch(r: redis.Redis, host: str, engine: str) -> None:
    """An engine process was spawned on ``host`` (counted once the spawn succeeded)."""
    _incr(r, ENGINE_LAUNCHES, host, engine)


def record_launch_failure(r: redis.Redis, host: str, engine: str, category: str | None) -> None:
    """A spawned engine never became usable: died, timed out or answered garbage (its diagnosis category)."""
    _incr(r, ENGINE_LAUNCH_FAILURES, host, engine, category or UNKNOWN)


# ---- reading (the collector) --------------------------------------------------------------------


@dataclass(frozen=True)
class Counted:
    """One counter series as stored: its metric, label values and value."""

    metric: str
    labels: tuple[str, ...]
    value: float


@dataclass(frozen=True)
class DurationHistogram:
    """One kind's job durations: cumulative counts per :data:`DURATION_BUCKETS` bound (then +Inf), and the sum."""

    kind: str
    cumulative: tuple[int, ...]
    total: float

    @property
    def count(self) -> int:
        return self.cumulative[-1] if self.cumulative else 0


def parse_counters(raw: Mapping[str, str]) -> list[Counted]:
    """The counters hash, typed; unreadable fields (none are written so) are skipped."""
    out: list[Counted] = []
    for field_text, value in raw.items():
        try:
            parts = json.loads(field_text)
            out.append(Counted(str(parts[0]), tuple(str(p) for p in parts[1:]), float(value)))
        except (ValueError, IndexError, TypeError):
            continue
    return out


def parse_durations(raw: Mapping[str, str]) -> list[DurationHistogram]:
    """The durations hash as one cumulative histogram per kind."""
    buckets: dict[str, list[int]] = {}
    sums: dict[str, float] = {}
    for field_text, value in raw.items():
        try:
            parts = json.loads(field_text)
            kind, what = str(parts[0]), parts[1]
            counts = buckets.setdefault(kind, [0] * (len(DURATION_BUCKETS) + 1))
            if what == "bucket":
                counts[min(int(parts[2]), len(DURATION_BUCKETS))] += int(value)
            elif what == "sum":
                sums[kind] = float(value)
        except (ValueError, IndexError, TypeError):
            continue
    out = []
    for kind, counts in sorted(buckets.items()):
        running, cumulative = 0, []
        for c in counts:
            running += c
            cumulative.append(running)
        out.append(DurationHistogram(kind, tuple(cumulative), sums.get(kind, 0.0)))
    return out
