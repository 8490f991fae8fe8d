"""One trial of a tune on its claimed host: launch, smoke, (early stop), the SLO knee search, a quick eval.

Each part is the one every other command uses: ``engine_launch`` (a failed launch is a *crashed* trial
with the launch's diagnosis, stored as a failed run like a sweep's cell), ``run_bench_measured`` with the
tune's SLO spec (the knee search, stored as a run: ``/runs`` and ``/compare`` work on it), and
``run_eval_measured`` (stored with the trial's run). Early stop: when an incumbent exists, the trial's
first level is the incumbent's knee measured twice; if Welch's verdict (``workers.benchmark.stats``) says
it is significantly slower there, the knee search is skipped and the trial is *pruned*, saying so.
The accuracy gate: a trial flagged against the host's eval baseline, or against the tune's most
accurate trial so far (McNemar on the same questions), is an *accuracy drop* and can never win.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from workers.benchmark import stats
from workers.benchmark.spec import BenchSpec
from workers.engines.probe import EngineFacts
from workers.errors import BenchbotError, LeaseLostError
from workers.evaluation.spec import EvalSpec
from workers.jobs.bench_run import run_bench_measured
from workers.jobs.context import JobCancelled
from workers.jobs.engine_launch import compile_launch, launch_engine
from workers.jobs.eval_run import run_eval_measured
from workers.jobs.events import ProgressPhase
from workers.jobs.failed_run import store_failed_run
from workers.jobs.host_job import HostJob, JobState
from workers.jobs.outcomes import BenchOutcome
from workers.jobs.payloads import Expectation
from workers.results import store
from workers.results.record import RunRecord, metric, sub
from workers.tune.space import TuneSpace, label_of
from workers.tune.state import ACCURACY_DROP, CRASHED, DONE, PRUNED, TrialRecord

#: The early-stop probe measures the incumbent's knee this many times (Welch needs two on each side).
PROBE_REPEATS = 2
#: The tune's runs are filed under this sweep id, so ``/runs t17`` lists one tune's trials.
RUN_KIND = "sweep-cell"  # a run record kind: a trial is stored as a cell of the tune (its sweep id t<ID>)


@dataclass(frozen=True)
class Incumbent:
    """The best trial so far: its number, goodput, knee, and the request/s measured at its knee."""

    number: int
    goodput_rps: float
    knee: float
    knee_request_s: tuple[float, ...]


def tune_run_id(tune_id: str) -> str:
    return f"t{tune_id}"


def knee_of(record: RunRecord) -> tuple[float | None, float | None, tuple[float, ...]]:
    """``(knee, goodput at the knee, request/s of every measurement at the knee)`` of an SLO run (the knee
    is measured twice: a confirmed knee gives Welch its two values)."""
    search = sub(record.extra.get("slo"))
    knee = search.get("knee")
    if not isinstance(knee, int | float) or isinstance(knee, bool):
        return None, 0.0, ()
    raw = search.get("points")
    points = [p for p in (raw if isinstance(raw, list) else []) if isinstance(p, dict) and p.get("load") == knee]
    goodputs = [float(p["goodput_rps"]) for p in points if isinstance(p.get("goodput_rps"), int | float)]
    request_s = tuple(float(p["request_s"]) for p in points if isinstance(p.get("request_s"), int | float))
    return float(knee), (min(goodputs) if goodputs else 0.0), request_s


def tokens_per_joule(record: RunRecord) -> float | None:
    j = metric(sub(record.extra.get("telemetry")), "j_per_tok")
    return 1.0 / j if j else None


async def bench_trial(job: HostJob, spec: BenchSpec, label: str, tune_id: str) -> BenchOutcome:
    """A bench of the trial's own server (the one this job launched), stored under the tune's id."""
    ctx = job.ctx
    return await run_bench_measured(
        ctx,
        ctx.redis,
        job.host,
        job.transport,
        spec,
        expect=Expectation(after_job=ctx.job_id),
        label=label,
        kind=RUN_KIND,
        sweep_id=tune_run_id(tune_id),
        config=job.config,
    )


async def run_trial(
    job: HostJob,
    *,
    tune_id: str,
    space: TuneSpace,
    params: dict[str, str | int],
    number: int,
    bench: BenchSpec,
    evaluate: EvalSpec | None,
    facts: EngineFacts,
    incumbent: Incumbent | None,
    reference_eval: str | None,
) -> TrialRecord:
    """Run one config; never raises for the config's own failure (that is the trial's status)."""
    ctx, config, host, transport = job.ctx, job.config, job.host, job.transport
    label = label_of(params)
    started = time.monotonic()
    base = TrialRecord(number=number, config=label, params=params, status=DONE)
    intent = space.intent(params)
    job.started = JobState()
    try:
        compiled = compile_launch(ctx, config, host, intent, facts)
        await launch_engine(ctx, ctx.redis, host, transport, compiled, job.started, log_tag=f"-t{number}", facts=facts)
    except (JobCancelled, LeaseLostError):
        raise
    except BenchbotError as exc:
        diagnosis = getattr(exc, "diagnosis", None) or {"category": "launch_failed", "summary": str(exc)}
        record = store_failed_run(
            ctx,
            host=host.name,
            label=label,
            sweep_id=tune_run_id(tune_id),
            params=bench.to_dict(),
            diagnosis=diagnosis,
            kind=RUN_KIND,
        )
        why = str(diagnosis.get("summary") or exc)
        return replace(
            base,
            status=CRASHED,
            reason=f"{diagnosis.get('category')}: {why}"[:300],
            run_id=record.id,
            duration_s=time.monotonic() - started,
        )
    if incumbent is not None and len(incumbent.knee_request_s) >= 2:
        probe_spec = replace(
            bench, slo=(), slo_errors_pct=None, search_max=None, levels=(int(incumbent.knee),), repeat=PROBE_REPEATS
        )
        ctx.progress(
            ProgressPhase.SWEEP,
            f"trial {number}: first level, concurrency {incumbent.knee:g} x{PROBE_REPEATS}, "
            f"against the incumbent (trial {incumbent.number})",
        )
        probe = await bench_trial(job, probe_spec, label, tune_id)
        probe_run = store.get_run(ctx.redis, probe.run_id)
        level = probe_run.level(incumbent.knee)
        mine = [v for lv in (stats.runs_of(level) if level else []) if (v := metric(lv, "request_s")) is not None]
        verdict = stats.verdict(incumbent.knee_request_s, mine, metric="request_s", level=incumbent.knee)
        if verdict.significant and verdict.better is False:
            return replace(
                base,
                status=PRUNED,
                run_id=probe.run_id,
                reason=f"pruned at its first level: {verdict.text} against trial {incumbent.number}",
                duration_s=time.monotonic() - started,
            )
    measured = await bench_trial(job, bench, label, tune_id)
    record = store.get_run(ctx.redis, measured.run_id)
    knee, goodput, _ = knee_of(record)
    result = replace(
        base, run_id=measured.run_id, knee=knee, goodput_rps=goodput, tokens_per_joule=tokens_per_joule(record)
    )
    if not measured.valid:
        result = replace(result, status=CRASHED, reason=f"the bench is invalid: {measured.invalid_reason}")
    elif knee is None:
        result = replace(result, reason="the SLO fails even at the lowest load", goodput_rps=0.0)
    if evaluate is not None and result.status == DONE:
        result = await _quick_eval(job, result, evaluate, label, tune_id, reference_eval)
    return replace(result, duration_s=time.monotonic() - started)


async def _quick_eval(
    job: HostJob, result: TrialRecord, evaluate: EvalSpec, label: str, tune_id: str, reference_eval: str | None
) -> TrialRecord:
    """The accuracy gate on the trial's server: flagged against the host's baseline or the tune's best."""
    ctx = job.ctx
    outcome = await run_eval_measured(
        ctx,
        ctx.redis,
        job.config,
        job.host,
        job.transport,
        evaluate,
        expect=Expectation(after_job=ctx.job_id),
        label=label,
        kind=RUN_KIND,
        sweep_id=tune_run_id(tune_id),
        attach_to=result.run_id,
    )
    here = store.get_eval_run(ctx.redis, outcome.run_id)
    accuracy = here.accuracy.value if here is not None else None
    result = replace(result, accuracy=accuracy)
    if outcome.flagged:
        return replace(result, status=ACCURACY_DROP, reason=outcome.summary)
    drop = accuracy_drop(ctx.redis, outcome.run_id, reference_eval)
    if drop:
        return replace(result, status=ACCURACY_DROP, reason=drop)
    return replace(result, reason=outcome.summary)


def accuracy_drop(r: object, run_id: str, reference_run: str | None) -> str | None:
    """Why the eval stored with ``run_id`` is a drop against the one stored with ``reference_run``; None if not."""
    if reference_run is None or reference_run == run_id:
        return None
    here, there = store.get_eval_run(r, run_id), store.get_eval_run(r, reference_run)  # type: ignore[arg-type]
    if here is None or there is None or not here.items or not there.items:
        return None
    comparison = here.compare_to(there)
    if comparison.verdict == "drop":
        return f"ACCURACY DROP against {reference_run}: {comparison.summary()}"
    return None
