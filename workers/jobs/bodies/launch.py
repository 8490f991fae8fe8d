"""``/launch``: launch, verify, and (``then bench`` / ``then eval``) measure under the same lease."""

from __future__ import annotations

from workers.jobs.bench_run import run_bench_measured
from workers.jobs.bodies.base import JobBody
from workers.jobs.engine_launch import compile_launch, launch_engine, learn_engine
from workers.jobs.eval_run import run_eval_measured
from workers.jobs.host_job import HostJob
from workers.jobs.outcomes import LaunchOutcome
from workers.jobs.payloads import Expectation, LaunchPayload


class LaunchBody(JobBody[LaunchPayload, LaunchOutcome]):
    async def run(self, job: HostJob, payload: LaunchPayload) -> LaunchOutcome:
        ctx, config, host, transport = job.ctx, job.config, job.host, job.transport
        facts = await learn_engine(ctx, host, transport)
        spec = compile_launch(ctx, config, host, payload.launch, facts)
        ready = await launch_engine(ctx, ctx.redis, host, transport, spec, job.started, facts=facts)
        bench = None
        if payload.bench is not None:
            bench = await run_bench_measured(
                ctx,
                ctx.redis,
                host,
                transport,
                payload.bench,
                expect=Expectation(after_job=ctx.job_id),
                label=spec.label,
                config=config,
            )
        evaluated = None
        if payload.eval is not None:  # `then eval`: with the bench's run when there was one
            evaluated = await run_eval_measured(
                ctx,
                ctx.redis,
                config,
                host,
                transport,
                payload.eval,
                expect=Expectation(after_job=ctx.job_id),
                label=spec.label,
                attach_to=bench.run_id if bench is not None else None,
            )
        return LaunchOutcome(config=ready.config, diff=ready.diff, bench=bench, eval=evaluated)


#: The ``launch`` job.
launch_job = LaunchBody()
