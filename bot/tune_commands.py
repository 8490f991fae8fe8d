"""``/tune`` on the bot's side: check and prune the space with the requester's rights, ``dry-run``, queue the
first step; ``/tune pause|resume ID``; ``/cancel`` of a tune (after its current trial, results kept).

Kept out of ``bot/dispatch.py`` (which only routes here) so the tune's rules live in one place.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from bot.commands import TuneRequest
from bot.commands.tune import DEFAULT_BUDGET, MAX_BUDGET
from bot.replies import Reply
from workers.errors import BenchbotError
from workers.jobs import queue
from workers.jobs.events import TERMINAL
from workers.jobs.payloads import TunePayload, parse_payload
from workers.tune import state
from workers.tune.space import DEFAULT_TRIAL_S, estimate_text, label_of, parse_space, prune
from workers.tune.state import step_summary

if TYPE_CHECKING:
    from bot.dispatch import Dispatcher


def _span(seconds: float) -> str:
    """``2.0 h``, ``45 min``, ``30 s``: a time= budget as it was meant."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def handle_tune(dispatcher: Dispatcher, user: str, channel: str, request: TuneRequest) -> Reply:
    if request.action == "pause":
        return _pause(dispatcher, user, str(request.tune_id))
    if request.action == "resume":
        return _resume(dispatcher, user, channel, str(request.tune_id))
    config = dispatcher.config
    host = config.host(request.host)
    admin = config.access.is_admin(user)
    space = parse_space(request.space, config, host, admin=admin)
    kept, pruned = prune(space, config, host)
    if not kept:
        raise BenchbotError(f"every config of that space is pruned ({pruned[0].reason}): change the space")
    # time= is a deadline: every kept config is a candidate and the clock stops the search (after the
    # trial in flight); budget= counts trials. Neither: DEFAULT_BUDGET trials.
    budget = request.budget or (MAX_BUDGET if request.time_s else DEFAULT_BUDGET)
    budget = min(budget, len(kept))
    fits = max(1, min(budget, int((request.time_s or 0) // DEFAULT_TRIAL_S)))
    assert request.spec is not None
    lines = [
        f"/tune on {host.name}: {space.describe()}",
        f"{space.size} configs, {len(pruned)} pruned before any launch, {len(kept)} to search"
        f" ({'a grid in seeded random order' if len(kept) <= 32 else 'seeded TPE'}); budget {budget} trials"
        + (f" or until time={_span(request.time_s)} is up" if request.time_s else ""),
        f"SLO search: {request.spec.label}; objective {request.objective}"
        + (f"; quick eval {request.eval.label}" if request.eval else "; no accuracy check (add eval)"),
        *(f"  pruned {label_of(p.params)}: {p.reason}" for p in pruned[:20]),
        f"estimated time: {estimate_text(budget)} (the engine version may prune more on the worker)"
        if not request.time_s
        else f"time={_span(request.time_s)} fits {estimate_text(fits)}",
    ]
    if request.dry_run:
        data: dict[str, object] = {
            "space": space.to_dict(),
            "size": space.size,
            "kept": len(kept),
            "pruned": [p.to_dict() for p in pruned],
            "budget": budget,
            "estimate": estimate_text(fits if request.time_s else budget),
        }
        return Reply(ok=True, kind="tune-dry-run", text="\n".join(lines), data=data)
    payload = TunePayload(
        request.host,
        user,
        channel,
        space=space,
        bench=request.spec,
        objective=request.objective,
        budget=budget,
        time_s=request.time_s,
        eval=request.eval,
        seed=request.seed,
    )
    summary = tune_summary(payload)
    reply = dispatcher._enqueue(payload, summary)
    return Reply(
        ok=True,
        kind="queued",
        text=reply.text + "\n" + "\n".join(lines[1:]),
        ephemeral=False,
        job_id=reply.job_id,
        data={**reply.data, "tune": {"budget": budget, "kept": len(kept), "pruned": [p.to_dict() for p in pruned]}},
    )


def tune_summary(payload: TunePayload) -> str:
    """A tune's first job in /queue: ``tune moe=cutlass,triton nextn=on,off (4 trials)``."""
    return f"tune {payload.space.describe()} ({payload.budget} trials)"


def rerun_payload(payload: TunePayload) -> TunePayload:
    """Re-run (the button on a tune's header or on any step's) starts a new tune with the same request: a
    step's own payload would otherwise start a second chain of steps on the tune it belongs to."""
    return replace(payload, tune_id=None, step=1)


def _owned(dispatcher: Dispatcher, user: str, tune_id: str) -> state.TuneRecord:
    record = state.load(dispatcher.redis, tune_id)
    if record is None:
        info = queue.job_info(dispatcher.redis, tune_id)
        if info is not None and info.kind == "tune":
            raise BenchbotError(f"tune {tune_id} has not started its first trial yet: /cancel {tune_id} removes it")
        raise BenchbotError(f"there is no tune {tune_id}: /runs and /queue list what there is")
    if record.user != user and not dispatcher.config.access.is_admin(user):
        raise BenchbotError(f"tune {tune_id} belongs to {record.user}; only they or an admin can change it")
    return record


def _pause(dispatcher: Dispatcher, user: str, tune_id: str) -> Reply:
    record = _owned(dispatcher, user, tune_id)
    if record.status in (state.FINISHED, state.CANCELLED, state.PAUSED):
        raise BenchbotError(f"tune {tune_id} is {record.status}; there is nothing to pause")
    state.set_control(dispatcher.redis, tune_id, state.CONTROL_PAUSE, user)
    return Reply(ok=True, kind="tune", text=f"tune {tune_id} pauses after its current trial (/tune resume {tune_id})")


def _step_alive(dispatcher: Dispatcher, record: state.TuneRecord) -> bool:
    if record.current_job is None:
        return False
    info = queue.job_info(dispatcher.redis, record.current_job)
    return info is not None and info.state not in TERMINAL and info.state not in queue.RQ_ENDED


def _resume(dispatcher: Dispatcher, user: str, channel: str, tune_id: str) -> Reply:
    """Continue a paused tune, or one whose step died with its worker: a new step at the back of the line."""
    record = _owned(dispatcher, user, tune_id)
    if record.status in (state.FINISHED, state.CANCELLED):
        raise BenchbotError(f"tune {tune_id} is {record.status}: start a new /tune")
    if _step_alive(dispatcher, record):
        raise BenchbotError(f"tune {tune_id} is {record.status} as job {record.current_job}: it goes on by itself")
    state.clear_control(dispatcher.redis, tune_id)
    parsed = parse_payload(queue.job_payload(dispatcher.redis, tune_id))
    if not isinstance(parsed, TunePayload):
        raise BenchbotError(f"job {tune_id} is not a tune")
    step = len(record.trials) + 1
    payload = replace(parsed, tune_id=tune_id, step=step, channel=channel or parsed.channel)
    reply = dispatcher._enqueue(payload, step_summary(tune_id, step, record.budget) + " (resumed)")
    state.update(dispatcher.redis, record, status=state.QUEUED, current_job=reply.job_id, step=step)
    return Reply(
        ok=True,
        kind="queued",
        text=f"tune {tune_id} resumes: {reply.text}",
        ephemeral=False,
        job_id=reply.job_id,
        data=reply.data,
    )


def cancel_tune(dispatcher: Dispatcher, user: str, job_id: str) -> Reply | None:
    """``/cancel`` of a tune (its id or a step's job): after the current trial, every result kept; None
    when ``job_id`` is not a tune's (the ordinary cancel applies)."""
    info = queue.job_info(dispatcher.redis, job_id)
    record = state.load(dispatcher.redis, job_id)
    if record is None and info is not None and info.kind == "tune":
        payload = queue.job_payload(dispatcher.redis, job_id)
        tune_id = payload.get("tune_id") if isinstance(payload, dict) else None
        record = state.load(dispatcher.redis, str(tune_id)) if tune_id else None
    if record is None:
        return None
    record = _owned(dispatcher, user, record.id)
    if record.status in (state.FINISHED, state.CANCELLED):
        return Reply(ok=True, kind="cancel", text=f"tune {record.id} already ended ({record.status})")
    # The flag first: it sticks for the whole tune. A step reads it before it enqueues the next one, again
    # once it has, and when it starts, so whichever step is in flight now, no trial after this one begins.
    state.set_control(dispatcher.redis, record.id, state.CONTROL_CANCEL, user)
    record = state.require(dispatcher.redis, record.id)  # what the steps wrote up to the flag
    if record.status in (state.FINISHED, state.CANCELLED):
        return Reply(ok=True, kind="cancel", text=f"tune {record.id} already ended ({record.status})")
    if record.status == state.PAUSED:  # no trial runs and none will start until a resume: end it now
        state.update(dispatcher.redis, record, status=state.CANCELLED, current_job=None, note=f"cancel by {user}")
        state.clear_control(dispatcher.redis, record.id)
        return Reply(
            ok=True,
            kind="cancel",
            job_id=record.id,
            text=f"cancelled tune {record.id} (it was paused); its {len(record.trials)} trial(s) are kept",
        )
    step = queue.job_info(dispatcher.redis, record.current_job) if record.current_job else None
    if step is not None and step.state == "queued":  # between trials: end it now
        queue.cancel(dispatcher.redis, step.job_id, by=user, is_admin=True)
        state.update(dispatcher.redis, record, status=state.CANCELLED, current_job=None, note=f"cancel by {user}")
        state.clear_control(dispatcher.redis, record.id)  # after the status: a step reads the flag, then the status
        return Reply(
            ok=True,
            kind="cancel",
            job_id=record.id,
            text=f"cancelled tune {record.id} between trials; its {len(record.trials)} trial(s) are kept",
        )
    return Reply(
        ok=True,
        kind="cancel",
        job_id=record.id,
        text=f"tune {record.id} ends after its current trial; every result is kept",
    )
