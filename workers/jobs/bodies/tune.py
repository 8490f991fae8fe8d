"""``/tune``: one trial per job under the host's lease, the next step queued at the back of the host's line.

A tune is hours long; holding the lease for all of it would lock teammates out. So each step job runs
one trial (``workers.tune.trial``) and, if the study goes on, enqueues its continuation behind whatever
teammates queued meanwhile: they run first, then the tune continues. The study (Optuna, on Redis) and the
tune's record (``workers.tune.state``) carry everything between steps, so any worker can run the next
one, and ``/tune resume ID`` continues a study whose step died with its worker (the dead trial is failed
and its config asked again: ``workers.tune.study``). The last step confirms the best 1-3
(``workers.tune.confirm``) and reports the winner. ``/cancel`` and ``/tune pause`` are read between
trials: a tune never stops mid-trial on their account, and every result is kept. A cancel sticks for the
whole tune: a step reads it before it enqueues the next (and again once it has, taking that step back out of
the line) and when it starts, so a cancel that lands while one trial ends and the next is queued ends the tune.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from workers.engines.probe import EngineFacts
from workers.errors import BenchbotError
from workers.jobs import faults, queue
from workers.jobs.bodies.base import JobBody
from workers.jobs.engine_launch import compile_launch, learn_engine
from workers.jobs.events import ProgressPhase
from workers.jobs.host_job import HostJob
from workers.jobs.payloads import TunePayload
from workers.json_value import JsonObject
from workers.results import store
from workers.tune import report, state
from workers.tune.confirm import MAX_FINALISTS, baseline_verdict, confirm, launch_line
from workers.tune.objective import BOTH, TOKENS_PER_JOULE, values_for
from workers.tune.outcome import TuneOutcome
from workers.tune.space import Pruned, label_of, params_json, prune
from workers.tune.state import ACCURACY_DROP, CRASHED, DONE, PRUNED, TrialRecord, TuneRecord, step_summary
from workers.tune.trial import Incumbent, knee_of, run_trial

if TYPE_CHECKING:
    import optuna


def _first_record(job: HostJob, payload: TunePayload, tune_id: str, facts: EngineFacts) -> TuneRecord:
    """The tune's record on its first step: every config pruned by presets and by the host's engine version."""
    ctx, config, host = job.ctx, job.config, job.host
    kept, pruned = prune(payload.space, config, host)
    for params in kept:
        try:
            compile_launch(ctx, config, host, payload.space.intent(params), facts)
        except BenchbotError as exc:
            pruned.append(Pruned(params, f"{facts.version or 'this engine'}: {exc}"[:300]))
    deadline = time.time() + payload.time_s if payload.time_s else None
    return TuneRecord(
        id=tune_id,
        host=host.name,
        user=ctx.user,
        channel=payload.channel,
        summary=f"{payload.space.describe()} {payload.bench.label}",
        budget=payload.budget,
        objective=payload.objective,
        created_at=time.time(),
        deadline=deadline,
        pruned=tuple(p.to_dict() for p in pruned),
    )


def _skips(record: TuneRecord) -> dict[str, str]:
    out = {str(p.get("config")): f"pruned before launch: {p.get('reason')}" for p in record.pruned}
    for t in record.trials:
        if t.status in (CRASHED, ACCURACY_DROP, PRUNED):
            out[t.config] = f"trial {t.number} was {t.status}: not run again"
    return out


def _incumbent(job: HostJob, trials: tuple[TrialRecord, ...]) -> Incumbent | None:
    best = report.incumbent_of(trials)
    if best is None or best.run_id is None or best.knee is None:
        return None
    _, goodput, request_s = knee_of(store.get_run(job.ctx.redis, best.run_id))
    return Incumbent(best.number, goodput or 0.0, best.knee, request_s)


def _reference_eval(trials: tuple[TrialRecord, ...]) -> str | None:
    scored = [t for t in trials if t.accuracy is not None and t.run_id and t.status != ACCURACY_DROP]
    return max(scored, key=lambda t: t.accuracy or 0.0).run_id if scored else None


def _live_line(record: TuneRecord) -> str:
    """The last trial's line: its result, the incumbent and its margin, the ETA from the trials' mean time."""
    trials = record.trials
    mean = sum(t.duration_s for t in trials) / len(trials)
    return report.live_line(trials[-1], trials, record.budget, mean * (record.budget - len(trials) + MAX_FINALISTS))


def _objective_key(objective: str, trial: TrialRecord) -> tuple[float, float]:
    g, e = trial.goodput_rps or 0.0, trial.tokens_per_joule or 0.0
    return (e, g) if objective == TOKENS_PER_JOULE else (g, e)


class TuneBody(JobBody[TunePayload, TuneOutcome]):
    async def run(self, job: HostJob, payload: TunePayload) -> TuneOutcome:
        ctx, r = job.ctx, job.ctx.redis
        tune_id = payload.tune_id or ctx.job_id
        if payload.tune_id is not None and (over := self._ended_before_start(job, payload)) is not None:
            return over
        facts = await learn_engine(ctx, job.host, job.transport)
        record = state.load(r, tune_id) or _first_record(job, payload, tune_id, facts)
        record = state.update(r, record, status=state.RUNNING, current_job=ctx.job_id, step=payload.step)
        from workers.tune import study as tune_study  # Optuna loads in the worker only, for a tune

        kept = payload.space.size - len(record.pruned)
        study = tune_study.open_study(r, tune_id, payload.space, kept, payload.objective, seed=payload.seed)
        stale = tune_study.fail_stale(study)
        if stale:
            ctx.progress(
                ProgressPhase.SWEEP,
                f"resuming: the trial of {label_of(stale[0])} died with its worker; "
                "its config is run again from the start",
            )
        stop = self._stop_reason(job, record)
        if stop is None and kept <= 0:
            stop = "every config of the space was pruned before launch"
        if stop is None:
            measured = {
                t.config: values_for(payload.objective, t.goodput_rps or 0.0, t.tokens_per_joule)
                for t in record.trials
                if t.status == DONE
            }
            asked = tune_study.ask(study, payload.space, skip=_skips(record), measured=measured)
            if asked is None:
                stop = "every config of the space was tried"
            else:
                number, params = asked
                record = await self._trial(job, payload, record, study, number, params, facts)
                stop = self._stop_reason(job, record)
        if stop is None:
            return self._continue(job, payload, record)
        return await self._finish(job, payload, record, stop, facts)

    def _ended_before_start(self, job: HostJob, payload: TunePayload) -> TuneOutcome | None:
        """A later step whose tune was cancelled (or ended) after it was queued ends here, before it touches the
        host. The control key is read before the record: whoever ends a tune writes its status before clearing
        the key, so one of the two always shows the cancel."""
        r = job.ctx.redis
        tune_id = str(payload.tune_id)
        control = state.control(r, tune_id)
        record = state.load(r, tune_id)
        if record is None:
            return None
        if record.status in (state.CANCELLED, state.FINISHED):
            return TuneOutcome(
                record.id,
                record.status,
                f"tune {record.id} already ended ({record.status}); step {payload.step} ran no trial",
                trials=tuple(t.to_dict() for t in record.trials),
                pruned=record.pruned,
                run_ids=tuple(t.run_id for t in record.trials if t.run_id),
            )
        if control is not None and control[0] == state.CONTROL_CANCEL:
            return self._stopped(job, record, control, f"{control[0]} by {control[1]}")
        return None

    def _stop_reason(self, job: HostJob, record: TuneRecord) -> str | None:
        control = state.control(job.ctx.redis, record.id)
        if control is not None:
            return f"{control[0]} by {control[1]}"
        if len(record.trials) >= record.budget:
            return f"the budget of {record.budget} trials is spent"
        if record.deadline is not None and time.time() >= record.deadline:
            return "time= is up"
        return None

    async def _trial(
        self,
        job: HostJob,
        payload: TunePayload,
        record: TuneRecord,
        study: optuna.Study,
        number: int,
        params: dict[str, str | int],
        facts: EngineFacts,
    ) -> TuneRecord:
        from workers.tune import study as tune_study

        ctx = job.ctx
        k = len(record.trials) + 1
        ctx.progress(ProgressPhase.SWEEP, f"trial {k} of {record.budget}: {label_of(params)}")
        trial = await run_trial(
            job,
            tune_id=record.id,
            space=payload.space,
            params=params,
            number=k,
            bench=payload.bench,
            evaluate=payload.eval,
            facts=facts,
            incumbent=_incumbent(job, record.trials),
            reference_eval=_reference_eval(record.trials),
        )
        trial = replace(trial, optuna_number=number, params=params)
        if trial.status == DONE:
            tune_study.tell_done(
                study, number, values_for(payload.objective, trial.goodput_rps or 0.0, trial.tokens_per_joule)
            )
        elif trial.status == PRUNED:
            tune_study.tell_pruned(study, number, trial.reason)
        else:
            tune_study.tell_failed(study, number, trial.reason)
        trials = (*record.trials, trial)
        record = state.update(job.ctx.redis, record, trials=trials)
        ctx.progress(ProgressPhase.SWEEP, _live_line(record))
        return record

    def _continue(self, job: HostJob, payload: TunePayload, record: TuneRecord) -> TuneOutcome:
        """Queue the next step at the back of the host's line; teammates' jobs queued meanwhile go first."""
        ctx, config = job.ctx, job.config
        step = len(record.trials) + 1
        nxt = replace(payload, tune_id=record.id, step=step)
        faults.pause_at(faults.TUNE_BEFORE_NEXT_STEP, ctx.job_id)
        queued = queue.enqueue(
            ctx.redis,
            record.host,
            nxt.kind,
            nxt.to_dict(),
            user=ctx.user,
            channel=payload.channel,
            summary=step_summary(record.id, step, record.budget),
            job_timeout_s=config.limits.job_timeout_s,
            outcome_kind=nxt.outcome_kind,
        )
        record = state.update(ctx.redis, record, status=state.QUEUED, current_job=queued.job_id, step=step)
        control = state.control(ctx.redis, record.id)
        if control is not None and control[0] == state.CONTROL_CANCEL:
            # The cancel came while this step enqueued the next one: take it back out of the line.
            queue.cancel(ctx.redis, queued.job_id, by=control[1], is_admin=True)
            return self._stopped(job, record, control, f"{control[0]} by {control[1]}")
        message = f"tune {record.id}: trial {step} of {record.budget} queued as job {queued.job_id}"
        if queued.ahead > 1:
            message += f" behind {queued.ahead - 1} job(s) of others"
        if record.trials:  # what this step found, for the thread: the trial's line, the incumbent, the ETA
            message = f"{_live_line(record)}\n{message}"
        return TuneOutcome(
            record.id, "continuing", message, next_job=queued.job_id, trials=tuple(t.to_dict() for t in record.trials)
        )

    def _stopped(self, job: HostJob, record: TuneRecord, control: tuple[str, str], why: str) -> TuneOutcome:
        """The tune paused or cancelled by ``control``, every result kept. Its status is written before the
        control key is cleared (:meth:`_ended_before_start` reads them the other way round)."""
        r = job.ctx.redis
        status = state.PAUSED if control[0] == state.CONTROL_PAUSE else state.CANCELLED
        state.update(r, record, status=status, current_job=None, note=why)
        state.clear_control(r, record.id)
        verb = "paused" if status == state.PAUSED else "cancelled"
        more = f": /tune resume {record.id} continues it" if status == state.PAUSED else ""
        return TuneOutcome(
            record.id,
            status,
            f"tune {record.id} {verb} ({why}) after {len(record.trials)} trial(s), every result kept{more}",
            trials=tuple(t.to_dict() for t in record.trials),
            pruned=record.pruned,
            table=report.trials_table(record.trials),
            run_ids=tuple(t.run_id for t in record.trials if t.run_id),
        )

    async def _finish(
        self, job: HostJob, payload: TunePayload, record: TuneRecord, why: str, facts: EngineFacts
    ) -> TuneOutcome:
        r = job.ctx.redis
        table = report.trials_table(record.trials)
        trials = tuple(t.to_dict() for t in record.trials)
        run_ids = tuple(t.run_id for t in record.trials if t.run_id)
        control = state.control(r, record.id)
        if control is not None:
            return self._stopped(job, record, control, why)
        done = sorted(
            (t for t in record.trials if t.status == DONE),
            key=lambda t: _objective_key(payload.objective, t),
            reverse=True,
        )
        if payload.objective == BOTH:
            done = report.pareto_front(record.trials) or done
        finalists = done[:MAX_FINALISTS]
        confirmed, winner = await confirm(job, record.id, payload.space, finalists, payload.bench, payload.eval, facts)
        result: JsonObject = {"why_stopped": why}
        winner_json: JsonObject | None = None
        if winner is not None:
            params = dict(winner.trial.params)
            winner_json = {
                "trial": winner.trial.number,
                "config": winner.trial.config,
                "params": params_json(params),
                "goodput_rps": winner.trial.goodput_rps,
                "tokens_per_joule": winner.trial.tokens_per_joule,
                "knee": winner.trial.knee,
                "running_config": winner.running_config,
                "launch": launch_line(payload.space, params, record.host, job.config.default_host),
                "confirm_run": winner.run_id,
                "baseline": baseline_verdict(job, winner),
            }
        if payload.objective == BOTH:
            result["pareto"] = [t.to_dict() for t in report.pareto_front(record.trials)]
        state.update(
            r, record, status=state.FINISHED, current_job=None, note=why, result={**result, "winner": winner_json}
        )
        if winner_json is not None:
            message = (
                f"tune {record.id} done ({why}): winner trial {winner_json['trial']}: {winner_json['config']}, "
                f"confirmed with repeat=3; reproduce it with {winner_json['launch']}"
            )
        else:
            message = f"tune {record.id} done ({why}): no config met the SLO and the accuracy gate after confirmation"
        return TuneOutcome(
            record.id,
            state.FINISHED,
            message,
            trials=trials,
            pruned=record.pruned,
            confirmed=tuple(c.to_dict() for c in confirmed),
            winner=winner_json,
            table=table,
            run_ids=run_ids,
            extra=result,
        )


#: The ``tune`` job.
tune_job = TuneBody()
