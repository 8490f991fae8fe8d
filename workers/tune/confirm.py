"""The winner is confirmed, not guessed: the best 1-3 trials re-run, the full eval, the host's baseline.

Each finalist is launched again and measured at its knee with ``repeat=3`` (a stored run: mean and 95 %
interval), every repeat's p99s checked against the SLO, and asked the full eval (``n`` from the task's
default unless the tune's eval said more). A finalist that misses the SLO on a repeat or whose full
eval drops (against the host's eval baseline or the most accurate finalist) cannot win. The winner is
the best remaining by the objective; its throughput at the knee is compared with the host's baseline run
(Welch's verdict with its interval) when the baseline measured the same requests (lengths, prefix, API,
dataset, closed or open loop: a throughput of other requests says nothing of this one), and the reply gives
its verified running config and the ``/launch`` line that reproduces it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from workers.benchmark import stats
from workers.benchmark.spec import BenchSpec
from workers.engines.probe import EngineFacts
from workers.errors import BenchbotError, LeaseLostError
from workers.evaluation.spec import EvalSpec
from workers.evaluation.tasks import DEFAULT_N
from workers.jobs.bench_run import run_bench_measured
from workers.jobs.context import JobCancelled
from workers.jobs.engine_launch import compile_launch, launch_engine
from workers.jobs.eval_run import run_eval_measured
from workers.jobs.events import ProgressPhase
from workers.jobs.host_job import HostJob, JobState
from workers.jobs.payloads import Expectation
from workers.json_value import JsonObject
from workers.results import store
from workers.results.record import RunRecord, metric
from workers.tune.space import TuneSpace
from workers.tune.state import TrialRecord
from workers.tune.trial import RUN_KIND, accuracy_drop, tune_run_id

CONFIRM_REPEATS = 3
MAX_FINALISTS = 3


@dataclass(frozen=True)
class Confirmed:
    """One finalist re-run: its trial, the repeat run, the full eval's run, and why it cannot win (if so)."""

    trial: TrialRecord
    run_id: str | None
    tok_s: tuple[float, ...]
    eval_run: str | None
    problem: str = ""
    running_config: str = ""

    def to_dict(self) -> JsonObject:
        return {
            "trial": self.trial.number,
            "config": self.trial.config,
            "run_id": self.run_id,
            "tok_s": list(self.tok_s),
            "eval_run": self.eval_run,
            "problem": self.problem,
            "running_config": self.running_config,
        }


def launch_line(space: TuneSpace, params: dict[str, str | int], host: str, default_host: str) -> str:
    """The one ``/launch`` that reproduces a config (presets first, then the knobs' flags)."""
    intent = space.intent(params)
    words = [*intent.presets, *(f"{flag} {value}" for flag, value in intent.raw_flags)]
    where = "" if host == default_host else f" on {host}"
    return "/launch " + " ".join(words) + where


def _slo_misses(levels: list[dict[str, object]], slo: tuple[tuple[str, float], ...]) -> str:
    for run in levels:
        for key, limit in slo:
            p99 = metric(run, f"{key}_ms", "p99")
            if p99 is not None and p99 > limit:
                return f"a repeat missed the SLO: p99 {key.upper()} {p99:.0f} ms > {limit:g} ms"
    return ""


async def confirm_one(
    job: HostJob,
    tune_id: str,
    space: TuneSpace,
    trial: TrialRecord,
    bench: BenchSpec,
    evaluate: EvalSpec | None,
    facts: EngineFacts,
) -> Confirmed:
    ctx, config, host = job.ctx, job.config, job.host
    job.started = JobState()
    try:
        compiled = compile_launch(ctx, config, host, space.intent(dict(trial.params)), facts)
        ready = await launch_engine(
            ctx, ctx.redis, host, job.transport, compiled, job.started, log_tag=f"-c{trial.number}", facts=facts
        )
    except (JobCancelled, LeaseLostError):
        raise
    except BenchbotError as exc:
        return Confirmed(trial, None, (), None, problem=f"it did not launch again: {exc}"[:300])
    knee = int(trial.knee or 1)
    spec = replace(bench, slo=(), slo_errors_pct=None, search_max=None, levels=(knee,), repeat=CONFIRM_REPEATS)
    expect = Expectation(after_job=ctx.job_id)
    measured = await run_bench_measured(
        ctx,
        ctx.redis,
        host,
        job.transport,
        spec,
        expect=expect,
        label=f"{trial.config} (confirm)",
        kind=RUN_KIND,
        sweep_id=tune_run_id(tune_id),
        config=config,
    )
    record = store.get_run(ctx.redis, measured.run_id)
    level = record.level(knee)
    runs = [dict(lv) for lv in (stats.runs_of(level) if level else [])]
    tok_s = tuple(v for lv in runs if (v := metric(lv, "output_tok_s")) is not None)
    problem = _slo_misses(runs, bench.slo) if measured.valid else f"invalid: {measured.invalid_reason}"
    eval_run = None
    if evaluate is not None:
        full = replace(evaluate, n=max(evaluate.n or 0, config.eval.n or DEFAULT_N))
        outcome = await run_eval_measured(
            ctx,
            ctx.redis,
            config,
            host,
            job.transport,
            full,
            expect=expect,
            label=f"{trial.config} (confirm)",
            kind=RUN_KIND,
            sweep_id=tune_run_id(tune_id),
            attach_to=measured.run_id,
        )
        eval_run = outcome.run_id
        if outcome.flagged and not problem:
            problem = f"ACCURACY DROP in the full eval: {outcome.summary}"
    return Confirmed(trial, measured.run_id, tok_s, eval_run, problem, running_config=ready.config.summary)


async def confirm(
    job: HostJob,
    tune_id: str,
    space: TuneSpace,
    finalists: list[TrialRecord],
    bench: BenchSpec,
    evaluate: EvalSpec | None,
    facts: EngineFacts,
) -> tuple[list[Confirmed], Confirmed | None]:
    """Re-run each finalist; the most accurate finalist's full eval is the reference for the others."""
    done: list[Confirmed] = []
    for index, trial in enumerate(finalists, 1):
        job.ctx.progress(
            ProgressPhase.SWEEP,
            f"confirming {index}/{len(finalists)}: trial {trial.number} "
            f"({trial.config}) with repeat={CONFIRM_REPEATS} and the full eval",
        )
        done.append(await confirm_one(job, tune_id, space, trial, bench, evaluate, facts))
    evals = [(c, store.get_eval_run(job.ctx.redis, c.eval_run)) for c in done if c.eval_run]
    scored = [(c, e.accuracy.value) for c, e in evals if e is not None]
    if scored:
        reference = max(scored, key=lambda pair: pair[1])[0].eval_run
        done = [
            replace(c, problem=c.problem or (accuracy_drop(job.ctx.redis, c.eval_run, reference) or ""))
            if c.eval_run
            else c
            for c in done
        ]
    winner = next((c for c in done if not c.problem), None)
    return done, winner


def request_shape(params: Mapping[str, object]) -> dict[str, str] | None:
    """What a run's requests were, from its stored spec: lengths (or their distributions), shared prefix, API,
    dataset, and closed or open loop. None when the record does not say (a failed run, a foreign record)."""
    if "input_len" not in params:
        return None
    try:
        spec = BenchSpec.from_dict(params)
    except (KeyError, TypeError, ValueError):
        return None
    return {
        "in": spec.input or str(spec.input_len),
        "out": spec.output or str(spec.output_len),
        "prefix": str(spec.prefix_tokens),
        "api": spec.api,
        "dataset": spec.dataset or "-",
        "load": f"open loop ({spec.arrivals})" if spec.open_loop else "closed loop",
    }


def _shape_difference(baseline: RunRecord, measured: RunRecord | None) -> str | None:
    """Why ``baseline``'s requests are not the winner's (``the baseline r3 measured other request sizes (in=1024
    out=256; this tune in=32 out=8)``); None when they are the same."""
    theirs = request_shape(baseline.params)
    ours = request_shape(measured.params) if measured is not None else None
    if theirs is None or ours is None:
        which = f"the baseline {baseline.id}" if theirs is None else "the confirmation run"
        return f"{which} does not record its request sizes"
    differ = [key for key in ours if theirs[key] != ours[key]]
    if not differ:
        return None
    was = " ".join(f"{key}={theirs[key]}" for key in differ)
    now = " ".join(f"{key}={ours[key]}" for key in differ)
    return f"the baseline {baseline.id} measured other request sizes ({was}; this tune {now})"


def baseline_verdict(job: HostJob, winner: Confirmed) -> JsonObject:
    """The winner against the host's baseline run at the winner's knee: Welch's verdict with its interval."""
    r = job.ctx.redis
    baseline = store.baseline_for(r, job.host.name)
    measured = store.get_run(r, winner.run_id) if winner.run_id and baseline is not None else None
    return compare_with_baseline(job.host.name, baseline, winner, measured)


def compare_with_baseline(
    host: str, baseline: RunRecord | None, winner: Confirmed, measured: RunRecord | None
) -> JsonObject:
    """The winner's confirmation run (``measured``) against ``baseline``, like with like: the same concurrency
    and the same requests, or a plain sentence that says why they are not compared."""
    knee = float(winner.trial.knee or 1)
    if baseline is None:
        return {"text": f"{host} has no baseline run to compare with (tag one: /runs tag RUN baseline)"}
    differ = _shape_difference(baseline, measured)
    if differ is not None:
        return {"baseline": baseline.id, "text": f"{differ}: not compared"}
    level = baseline.level(knee)
    if level is None:
        return {"baseline": baseline.id, "text": f"the baseline {baseline.id} has no level at concurrency {knee:g}"}
    base = [v for lv in stats.runs_of(level) if (v := metric(lv, "output_tok_s")) is not None]
    verdict = stats.verdict(base, winner.tok_s, metric="output_tok_s", level=knee)
    return {
        "baseline": baseline.id,
        "text": f"against the baseline {baseline.id}: {verdict.text}",
        "verdict": verdict.to_dict(),
    }
