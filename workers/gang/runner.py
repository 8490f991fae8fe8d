"""The RQ entry for a job on a group: ``workers.jobs.runner.execute`` hands a payload whose host is a group here.

The job was queued on the group's first member (sorted names: the queue and line it waits in first,
docs/queue.md "Gangs"); :class:`GangJobContext` then takes every member's lease in the one global order.
"""

from __future__ import annotations

import asyncio
import contextlib

from workers import observer
from workers.config import Config, GroupConfig
from workers.errors import BenchbotError
from workers.gang.bench import gang_measure
from workers.gang.context import GangJobContext
from workers.gang.launch import gang_launch
from workers.gang.stop import gang_stop
from workers.jobs.access import run_time_denial
from workers.jobs.outcomes import BenchOutcome, EvalOutcome, LaunchOutcome, StopOutcome
from workers.jobs.payloads import BenchPayload, EvalPayload, JobPayload, LaunchPayload, StopPayload
from workers.json_value import JsonValue
from workers.redis_conn import REDIS_DOWN


def execute_gang(config: Config, group: GroupConfig, job: JobPayload) -> dict[str, JsonValue]:
    """Run the gang job under every member's lease; the body commits its own ``succeeded``."""
    with GangJobContext(
        group, lease_ttl_s=config.limits.lease_ttl_s, lease_margin_s=config.limits.lease_margin_s
    ) as ctx:
        try:
            return asyncio.run(run_gang_job(ctx, config, group, job)).to_dict()
        finally:
            with contextlib.suppress(*REDIS_DOWN):  # every member may have changed: its observer looks again
                for host in group.members:
                    observer.ask_observation(ctx.redis, host)


async def run_gang_job(
    ctx: GangJobContext, config: Config, group: GroupConfig, job: JobPayload
) -> LaunchOutcome | StopOutcome | BenchOutcome | EvalOutcome:
    """The gang body for the payload's kind, if its owner may still run it."""
    denial = run_time_denial(config.access, ctx.user, str(job.kind))
    if denial:
        raise BenchbotError(denial)
    if isinstance(job, LaunchPayload):
        return await gang_launch(ctx, config, group, job)
    if isinstance(job, StopPayload):
        return await gang_stop(ctx, config, group, job)
    if isinstance(job, BenchPayload | EvalPayload):
        return await gang_measure(ctx, config, group, job)
    raise BenchbotError(
        f"a {job.kind} job on the group {group.name} is not built yet (issue 38): /launch ... on {group.name} "
        f"[then bench ...], /bench and /eval ... on {group.name} and /stop {group.name} are"
    )
