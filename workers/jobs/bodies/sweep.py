"""``/sweep``: launch + bench (+ eval) per config under one lease; a failed cell does not end the sweep."""

from __future__ import annotations

from workers.benchmark.spec import BenchSpec
from workers.config import Config, HostConfig
from workers.engines.probe import EngineFacts
from workers.errors import BenchbotError, LeaseLostError
from workers.evaluation.spec import EvalSpec
from workers.host.transport import Transport
from workers.jobs.bench_run import run_bench_measured
from workers.jobs.bodies.base import JobBody
from workers.jobs.context import JobCancelled, JobContext
from workers.jobs.engine_launch import compile_launch, launch_engine, learn_engine
from workers.jobs.eval_run import run_eval_measured
from workers.jobs.events import ProgressPhase
from workers.jobs.failed_run import store_failed_run
from workers.jobs.host_job import HostJob, JobState
from workers.jobs.outcomes import SweepCell, SweepOutcome
from workers.jobs.payloads import Expectation, SweepPayload
from workers.presets import LaunchIntent
from workers.results import store, tables


async def sweep_cell(
    ctx: JobContext,
    config: Config,
    host: HostConfig,
    transport: Transport,
    launch: LaunchIntent,
    spec: BenchSpec,
    state: JobState,
    sweep_id: str,
    index: int,
    facts: EngineFacts,
    evaluate: EvalSpec | None = None,
) -> SweepCell:
    """One config of a sweep: launch + bench (+ eval). A failed launch or bench is a failed cell, not a failed
    sweep; a failed eval is a note on its cell."""
    try:
        compiled = compile_launch(ctx, config, host, launch, facts)
        await launch_engine(ctx, ctx.redis, host, transport, compiled, state, log_tag=f"-cell{index}", facts=facts)
        measured = await run_bench_measured(
            ctx,
            ctx.redis,
            host,
            transport,
            spec,
            expect=Expectation(after_job=ctx.job_id),
            label=launch.label,
            kind="sweep-cell",
            sweep_id=sweep_id,
            config=config,
        )
    except (JobCancelled, LeaseLostError):
        raise
    except BenchbotError as exc:
        diagnosis = getattr(exc, "diagnosis", None) or {"category": "bench_failed", "summary": str(exc)}
        record = store_failed_run(
            ctx,
            host=host.name,
            label=launch.label,
            sweep_id=sweep_id,
            params=spec.to_dict(),
            diagnosis=diagnosis,
            kind="sweep-cell",
        )
        ctx.progress(ProgressPhase.SWEEP, f"{launch.label}: failed ({diagnosis.get('category')}); going on")
        return SweepCell(
            label=launch.label, status="failed", run_id=record.id, diagnosis=dict(diagnosis), message=str(exc)
        )
    evaluated, eval_error = None, ""
    if evaluate is not None:
        try:
            evaluated = await run_eval_measured(
                ctx,
                ctx.redis,
                config,
                host,
                transport,
                evaluate,
                expect=Expectation(after_job=ctx.job_id),
                label=launch.label,
                kind="sweep-cell",
                sweep_id=sweep_id,
                attach_to=measured.run_id,
            )
        except (JobCancelled, LeaseLostError):
            raise
        except BenchbotError as exc:
            eval_error = str(exc)
            ctx.progress(ProgressPhase.SWEEP, f"{launch.label}: the eval failed ({exc}); going on")
    return SweepCell(
        label=launch.label,
        status="ok",
        run_id=measured.run_id,
        valid=measured.valid,
        invalid_reason=measured.invalid_reason,
        table=measured.table,
        eval=evaluated,
        eval_error=eval_error,
    )


class SweepBody(JobBody[SweepPayload, SweepOutcome]):
    async def run(self, job: HostJob, payload: SweepPayload) -> SweepOutcome:
        ctx, config, host, transport = job.ctx, job.config, job.host, job.transport
        sweep_id = f"s{ctx.job_id}"
        configs = payload.configs
        cells: list[SweepCell] = []
        facts = await learn_engine(ctx, host, transport)
        for index, launch in enumerate(configs, 1):
            ctx.progress(ProgressPhase.SWEEP, f"config {index}/{len(configs)}: {launch.label}")
            job.started = JobState()  # the current cell's server: each launch stops the previous cell's
            cells.append(
                await sweep_cell(
                    ctx,
                    config,
                    host,
                    transport,
                    launch,
                    payload.bench,
                    job.started,
                    sweep_id,
                    index,
                    facts,
                    payload.eval,
                )
            )
        run_ids = tuple(c.run_id for c in cells if c.run_id)
        table = tables.compare_table(store.get_runs(ctx.redis, list(run_ids))) if run_ids else ""
        return SweepOutcome(sweep_id=sweep_id, cells=tuple(cells), run_ids=run_ids, table=table)


#: The ``sweep`` job.
sweep_job = SweepBody()
