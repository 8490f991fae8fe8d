"""The RQ entry point: ``execute(payload)`` runs one job under the host's exclusive lease.

RQ enqueues ``workers.jobs.runner.execute`` by that dotted path (``workers.jobs.queue.JOB_FUNC``; jobs
already in Redis name it too). It builds a :class:`JobContext` (lease in queue order, heartbeat, cancel
flag, exactly one terminal event), types the payload, checks its owner may still run it, and hands it to
its kind's body in ``workers.jobs.bodies`` (one module each: launch, bench, stop, sweep, eval). The
bodies follow DESIGN.md's one idea: every launch ends with an observation of what really runs, and every
bench observes before and after and refuses to measure under a wrong label.

Fenced side effects (docs/reliability.md): every action on the host (a signal, the spawn, the smoke
request, each bench request) is preceded by ``ctx.check(point)`` / ``ctx.check_fence(point)``, a lease
check against Redis with a margin (a clock comparison while the last proof holds); a launch is ready only
when the process answering on the port is in the process group it spawned; and each body's outcome is
committed with ``ctx.commit(result)``, which publishes ``succeeded`` unless a cancel came first, in which
case the body stops what it started and the job ends ``cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib

from workers import observer
from workers.config import Config, load_config
from workers.errors import BenchbotError
from workers.gang.runner import execute_gang
from workers.jobs.access import run_time_denial
from workers.jobs.bodies.bench import bench_job
from workers.jobs.bodies.eval import eval_job
from workers.jobs.bodies.launch import launch_job
from workers.jobs.bodies.stop import stop_job
from workers.jobs.bodies.sweep import sweep_job
from workers.jobs.bodies.tune import tune_job
from workers.jobs.context import JobContext
from workers.jobs.outcomes import BenchOutcome, EvalOutcome, LaunchOutcome, StopOutcome, SweepOutcome
from workers.jobs.payloads import (
    BenchPayload,
    EvalPayload,
    JobPayload,
    LaunchPayload,
    StopPayload,
    TunePayload,
    parse_payload,
)
from workers.json_value import JsonValue, RawJson
from workers.redis_conn import REDIS_DOWN
from workers.tune.outcome import TuneOutcome


def execute(payload: RawJson) -> dict[str, JsonValue]:
    """The RQ job: run ``payload['kind']`` under the lease; the body commits its own ``succeeded``.

    The payload is JSON here (RQ's edge) and typed from here on; the result goes back as JSON.
    """
    config = load_config()
    group = config.groups.get(str(payload.get("host") or ""))
    if group is not None:  # a job on a group of hosts: every member's lease, every rank (workers/gang)
        return execute_gang(config, group, parse_payload(payload))
    with JobContext(lease_ttl_s=config.limits.lease_ttl_s, lease_margin_s=config.limits.lease_margin_s) as ctx:
        job = parse_payload(payload)
        try:
            return asyncio.run(run_job(ctx, config, job)).to_dict()
        finally:
            # The job may have changed the host: its observer looks again now, for /status (issue 23).
            with contextlib.suppress(*REDIS_DOWN):
                observer.ask_observation(ctx.redis, job.host)


async def run_job(
    ctx: JobContext, config: Config, job: JobPayload
) -> LaunchOutcome | BenchOutcome | StopOutcome | SweepOutcome | EvalOutcome | TuneOutcome:
    """The body for the payload's kind, if its owner may still run it (access is checked again now)."""
    denial = run_time_denial(config.access, ctx.user, str(job.kind))
    if denial:
        raise BenchbotError(denial)
    if isinstance(job, LaunchPayload):
        return await launch_job(ctx, config, job)
    if isinstance(job, BenchPayload):
        return await bench_job(ctx, config, job)
    if isinstance(job, StopPayload):
        return await stop_job(ctx, config, job)
    if isinstance(job, EvalPayload):
        return await eval_job(ctx, config, job)
    if isinstance(job, TunePayload):
        return await tune_job(ctx, config, job)
    return await sweep_job(ctx, config, job)
