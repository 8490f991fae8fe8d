"""Job functions used only by tests: real RQ workers import them as ``tests.jobfuncs.<name>``.

Each records what it did in Redis (start/end times, pid, fence) so tests can assert on it from the
outside. They poll with short sleeps because they stand in for job bodies, not for tests.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from workers.errors import BenchbotError
from workers.jobs.context import JobContext

LOG_KEY = "benchbot:test:log"
PIDS_KEY = "benchbot:test:pids"
MAX_HOLD_S = 60.0


def _note(ctx: JobContext, what: str) -> None:
    ctx.redis.rpush(
        LOG_KEY,
        json.dumps(
            {
                "job": ctx.job_id,
                "what": what,
                "t": time.time(),
                "pid": os.getpid(),
                "fence": ctx.fence,
                "user": ctx.user,
            }
        ),
    )


def _remember_pid(payload: dict[str, Any]) -> None:
    # Recorded before the lease wait so test teardown can kill horses that never got the host.
    from rq import get_current_job

    job = get_current_job()
    if job is not None:
        job.connection.sadd(PIDS_KEY, os.getpid())


def log_entries(r: Any) -> list[dict[str, Any]]:
    """What the jobs recorded, in order."""
    return [json.loads(x) for x in r.lrange(LOG_KEY, 0, -1)]


def hold(payload: dict[str, Any]) -> dict[str, Any]:
    """Hold the host for ``hold_s`` seconds (or until key ``until`` exists), checking the context."""
    _remember_pid(payload)
    with JobContext() as ctx:
        _note(ctx, "start")
        deadline = time.monotonic() + float(payload.get("hold_s", 0.2))
        until = payload.get("until")
        while time.monotonic() < deadline:
            if until and ctx.redis.exists(until):
                break
            ctx.check()
            time.sleep(0.02)
        _note(ctx, "end")
        ctx.succeed({"job": ctx.job_id, "fence": ctx.fence})
    return {"job": ctx.job_id}


def ignore_cancel(payload: dict[str, Any]) -> None:
    """Hold the host and never look at the cancel flag: only a hard stop ends it."""
    _remember_pid(payload)
    with JobContext() as ctx:
        _note(ctx, "start")
        deadline = time.monotonic() + MAX_HOLD_S
        while time.monotonic() < deadline:
            time.sleep(0.05)


async def async_cooperative(payload: dict[str, Any]) -> dict[str, Any]:
    """An async job that sits in a long await; cancel must interrupt it through ``ctx.guard``."""
    _remember_pid(payload)
    with JobContext() as ctx:
        _note(ctx, "start")
        await ctx.sleep(MAX_HOLD_S)
        ctx.succeed({"slept": True})
    return {}


def fail_friendly(payload: dict[str, Any]) -> None:
    """Fail with a message meant for the user."""
    _remember_pid(payload)
    with JobContext():
        raise BenchbotError(payload.get("message", "the model file is missing"))


def crash(payload: dict[str, Any]) -> None:
    """Fail with a bug: the user sees only the type."""
    _remember_pid(payload)
    with JobContext():
        raise RuntimeError("secret internals that must not reach the user")


def no_context(payload: dict[str, Any]) -> dict[str, Any]:
    """A job that never opens a JobContext: the worker still publishes its terminal event."""
    _remember_pid(payload)
    return {"echo": payload.get("value")}


def span(payload: dict[str, Any]) -> dict[str, Any]:
    """Hold the host ``hold_s`` seconds and leave a marker file: when this run provably held the lease.

    The marker lives on disk, not in Redis, so a failover that loses writes cannot lose it: one file per
    run (job id and pid in its name), holding the start (right after the lease was granted) and the
    last instant a fence check passed. Two runs of a job, or two overlapping spans, are the failures.
    """
    from pathlib import Path

    _remember_pid(payload)
    with JobContext() as ctx:
        start = last_ok = time.monotonic()
        marker = Path(str(payload["dir"])) / f"{ctx.job_id}.{os.getpid()}.json"
        try:
            deadline = start + float(payload.get("hold_s", 0.2))
            while True:
                ctx.check()
                last_ok = time.monotonic()
                if last_ok >= deadline:
                    break
                time.sleep(0.02)
        finally:
            marker.write_text(
                json.dumps({"job": ctx.job_id, "start": start, "end": last_ok, "fence": ctx.fence, "pid": os.getpid()})
            )
        ctx.succeed({"job": ctx.job_id, "fence": ctx.fence})
    return {"job": ctx.job_id}
