"""A measured eval: is the running server still answering right? Scored, stored with the run, compared.

``/eval`` (``workers.jobs.bodies.eval``), ``then eval`` after a launch and a sweep's ``eval`` all go through
:func:`run_eval_measured`, shaped like the bench's (``workers.jobs.bench_run``): observe the server before and refuse
to score one the requester did not mean (loading, nothing, another config unless ``any``), ask the
task's questions greedily with the lease's fence checked before every request, observe again (a server
that changed mid-eval makes the result invalid), then compare with the host's eval baseline
(:func:`workers.results.store.baseline_eval_for`) and store the result with the run: on the bench's
record when the eval follows a bench on the same server (one row with tok/s and accuracy), else as a
run of kind ``eval``. The per-item results are kept beside the record. docs/eval.md says why each
number is what it is.
"""

from __future__ import annotations

import dataclasses
import time

import redis

from workers import observer
from workers.config import Config, HostConfig
from workers.errors import BenchbotError
from workers.evaluation.runner import EvalParams, EvalRun, run_eval
from workers.evaluation.scoring import Comparison, pct
from workers.evaluation.spec import EvalSpec
from workers.evaluation.tasks import load_task
from workers.host.transport import Transport
from workers.jobs import faults
from workers.jobs.context import JobContext
from workers.jobs.events import ProgressPhase
from workers.jobs.expectation import check_expectation
from workers.jobs.outcomes import EvalOutcome, WrongAnswer
from workers.jobs.payloads import Expectation
from workers.jobs.port_owner import owner_words
from workers.json_value import JsonObject
from workers.observation import ObservedState, RunningConfig
from workers.results import store
from workers.results.labels import bench_label
from workers.results.record import RunRecord

#: Wrong answers shown with a result (the rest are in the stored items).
WRONG_SHOWN = 3
#: Progress events per eval (one per reply would flood the job's stream).
PROGRESS_STEPS = 4


def _observed_problem(host: HostConfig, before: RunningConfig) -> str | None:
    if before.state == ObservedState.LOADING:
        return (
            f"the engine on {host.name}:{host.port} is still loading ({owner_words(before)}): "
            "evaluate it once it is ready (/status shows when)"
        )
    if before.state == ObservedState.STARTING:
        return (
            f"the server on {host.name}:{host.port} is warming up ({before.detail or 'not ready yet'}): "
            "evaluate it once it is ready (/status shows when)"
        )
    if before.state != ObservedState.RUNNING:
        return (
            f"nothing is serving on {host.name}:{host.port} ({before.state}): /launch first, or /status to see "
            "what is there"
        )
    return None


def _changed(before: RunningConfig, after: RunningConfig) -> str | None:
    if after.instance_id != before.instance_id:
        return (
            f"the server changed during the eval: instance {before.instance_id} became {after.instance_id or 'nothing'}"
        )
    if after.fingerprint != before.fingerprint:
        return "the server's config changed during the eval"
    return None


def eval_data(
    run: EvalRun,
    spec: EvalSpec,
    comparison: Comparison | None,
    baseline: tuple[RunRecord, str] | None,
    summary: str,
    verdict: str,
) -> JsonObject:
    """The ``eval`` object stored on a run record (docs/eval.md, "Storage"); never the items."""
    acc = run.accuracy
    lo, hi = acc.interval
    return {
        "task": run.task,
        "task_fingerprint": run.task_fingerprint,
        "task_source": run.task_source,
        "seed": spec.seed,
        "api": run.api,
        "model": run.model,
        "n": acc.n,
        "correct": acc.correct,
        "accuracy": acc.value,
        "ci95": [lo, hi],
        "failed_requests": run.failed_requests,
        "completion_tokens": run.completion_tokens,
        "duration_s": run.duration_s,
        "baseline_run": baseline[0].id if baseline else None,
        "baseline_why": baseline[1] if baseline else None,
        "verdict": verdict,
        "summary": summary,
        "comparison": comparison.to_dict() if comparison is not None else None,
    }


def verdict_line(run: EvalRun, host: str, comparison: Comparison | None, invalid: str | None) -> tuple[str, str]:
    """``(summary, verdict)``: the comparison's line, or why there is none."""
    here = f"accuracy {pct(run.accuracy.value)} ({run.accuracy.correct}/{run.accuracy.n})"
    if invalid:
        return f"{here}, INVALID: {invalid}; not compared with a baseline", "invalid"
    if comparison is None:
        return (
            f"{here}; no baseline for {run.task} on {host} yet: later evals are compared with this one "
            "(or tag a run with /runs tag rN baseline)",
            "no_baseline",
        )
    return comparison.summary(), comparison.verdict


async def run_eval_measured(
    ctx: JobContext,
    r: redis.Redis,
    config: Config,
    host: HostConfig,
    transport: Transport,
    spec: EvalSpec,
    *,
    expect: Expectation | None,
    label: str | None = None,
    kind: str = "eval",
    sweep_id: str | None = None,
    attach_to: str | None = None,
) -> EvalOutcome:
    """Observe, check it is the server meant, eval, observe again, compare with the baseline, store.

    ``attach_to``: the run id of a bench just measured on this server (``then bench ... then eval``, a
    sweep cell); the eval joins that record when the server is still the same instance and config.
    """
    ctx.progress(ProgressPhase.OBSERVE, "observing the server before the eval")
    before = await observer.observe_host(r, host, transport)
    problem = _observed_problem(host, before)
    if problem:
        raise BenchbotError(problem)
    mismatch = check_expectation(expect, before, observer.launched_record(r, host.name))
    if mismatch:
        raise BenchbotError(
            f"refusing to evaluate under a wrong label: {mismatch}. Run /eval again, or add 'any' to check "
            "whatever runs."
        )
    settings = config.eval
    task = load_task(spec.task, n=spec.n or settings.n, seed=spec.seed, files=settings.files)
    params = EvalParams(
        api=settings.api,
        concurrency=settings.concurrency,
        api_key=host.engine.api_key(),
        extra_body=settings.extra_body,
    )
    step = max(1, len(task) // PROGRESS_STEPS)

    def on_progress(done: int, total: int) -> None:
        if done == total or done % step == 0:
            ctx.progress(ProgressPhase.EVAL, f"{spec.task}: {done}/{total} answered")

    ctx.progress(ProgressPhase.EVAL, f"asking {len(task)} questions of {task.name} ({task.source})")
    ctx.check(faults.BEFORE_EVAL)
    run = await ctx.guard(
        run_eval(
            host.base_url, task, params, gate=ctx.request_gate(faults.BEFORE_EVAL_REQUEST), on_progress=on_progress
        )
    )
    ctx.progress(ProgressPhase.OBSERVE, "observing the server after the eval")
    after = await observer.observe_host(r, host, transport)
    invalid = _changed(before, after)

    attached = _attachable(r, attach_to, before) if attach_to and not invalid else None
    run_id = attached.id if attached is not None else store.new_run_id(r)
    found = None if invalid else store.baseline_eval_for(r, host.name, task.name, run.model, exclude=run_id)
    comparison = run.compare_to(found[1]) if found is not None else None
    summary, verdict = verdict_line(run, host.name, comparison, invalid)
    baseline = (found[0], found[2]) if found is not None else None
    data = eval_data(run, spec, comparison, baseline, summary, verdict)
    if attached is not None:
        record = dataclasses.replace(attached, eval=data)
    else:
        record = RunRecord(
            id=run_id,
            job_id=ctx.job_id,
            user=ctx.user,
            host=host.name,
            created_at=time.time(),
            label=label or bench_label(before, store.baseline_for(r, host.name)),
            kind=kind,
            sweep_id=sweep_id,
            config=before.to_dict(),
            config_after=after.to_dict(),
            valid=invalid is None,
            invalid_reason=invalid,
            params={"eval": spec.to_dict()},
            eval=data,
        )
    ctx.check()  # a cancelled (or no longer fenced) eval stores nothing
    store.save_run(r, record)
    store.save_eval_items(r, run_id, run)
    detail = comparison.detail() if comparison is not None else ""
    if baseline is not None:
        detail = f"baseline {baseline[0].id} ({baseline[1]}): {detail}"
    wrong = tuple(WrongAnswer(i.id, i.reason, i.reply[:200]) for i in run.items if not i.correct)[:WRONG_SHOWN]
    return EvalOutcome(
        run_id=run_id,
        summary=summary,
        flagged=comparison is not None and comparison.flagged,
        accuracy=str(run.accuracy),
        detail=detail,
        baseline_run=baseline[0].id if baseline else None,
        valid=invalid is None,
        invalid_reason=invalid,
        wrong=wrong,
    )


def _attachable(r: redis.Redis, run_id: str, observed: RunningConfig) -> RunRecord | None:
    """The bench record to store the eval with, if it measured this very server (instance and config)."""
    try:
        record = store.get_run(r, run_id)
    except BenchbotError:
        return None
    same = record.config.get("instance_id") == observed.instance_id and record.fingerprint == observed.fingerprint
    return record if same and record.status == "ok" else None
