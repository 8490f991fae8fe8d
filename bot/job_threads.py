"""A job's Slack thread: which message owns it, and the header state its events fold into.

The Slack front end records where a job's thread lives when it posts the job's header
(:func:`record_thread`, :func:`workers.keys.slack_thread`, kept a month); the notifier
(:mod:`bot.notifier`) reads it back for each event, folds the event into the header state
(:func:`fold`, a pure function, so a redelivered event folds the same way) and saves it. Jobs started
from the console or ``say`` have no record.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import redis as redis_lib

from workers import keys
from workers.jobs import events
from workers.jobs.events import CancelledData, Event, FailedData, ProgressData, StartedData
from workers.jobs.outcomes import (
    BenchOutcome,
    EvalOutcome,
    LaunchOutcome,
    ReadyData,
    StopOutcome,
    SweepOutcome,
    parse_outcome,
)

log = logging.getLogger(__name__)

THREAD_KEY_PREFIX = keys.SLACK_THREAD_PREFIX
THREAD_TTL_S = 30 * 24 * 3600
#: What a header shows before any event arrived (taken from the queued Reply's data).
#: ``outcome_kind`` is the shape the job's typed payload will produce (``launch+bench`` for a launch with
#: ``then bench``): the header's buttons depend on it, never on the summary's words.
HEADER_FIELDS = ("job_id", "user", "channel", "host", "kind", "outcome_kind", "summary", "position", "ahead")


#: Redis key of the record of the Slack message that owns a job.
thread_key = keys.slack_thread


def record_thread(
    r: redis_lib.Redis, job_id: str, channel: str, ts: str | None, header: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Remember that the message (channel, ts) is job ``job_id``'s header (its thread's parent).

    ``header`` is what the header shows before any event arrived (the queued Reply's data).
    """
    state: dict[str, Any] = {"phase": "queued"}
    state.update({k: v for k, v in (header or {}).items() if k in HEADER_FIELDS})
    state["job_id"] = str(job_id)
    thread = {"schema": 1, "channel": channel, "ts": ts, "state": state}
    save_thread(r, str(job_id), thread)
    return thread


def get_thread(r: redis_lib.Redis, job_id: str) -> dict[str, Any] | None:
    """The thread record of a job, or None for jobs no Slack message owns."""
    raw = r.get(thread_key(job_id))
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        log.warning("job %s: unreadable thread record ignored", job_id)
        return None
    return data if isinstance(data, dict) and data.get("channel") else None


def save_thread(r: redis_lib.Redis, job_id: str, thread: Mapping[str, Any]) -> None:
    """Store a thread record (header state included) for a month."""
    r.set(thread_key(job_id), json.dumps(thread, default=str, separators=(",", ":")), ex=THREAD_TTL_S)


def fold(state: Mapping[str, Any], event: Event) -> dict[str, Any]:
    """The header state after ``event``: a pure function, so a redelivered event folds the same way."""
    out = dict(state)
    out.setdefault("job_id", event.job)
    data = event.data
    kind = event.type
    if kind == events.QUEUED:
        for key in HEADER_FIELDS:
            if key in data and key != "job_id":
                out.setdefault(key, data[key])
        out.update(
            phase="queued",
            position=data.get("position", out.get("position")),
            ahead=data.get("ahead", out.get("ahead")),
        )
    elif kind == events.STARTED:
        out.update(phase="running", worker=StartedData.from_dict(data).worker, progress=None)
    elif kind == events.PROGRESS:
        if out.get("phase") in (None, "queued"):
            out["phase"] = "running"
        progress = ProgressData.from_dict(data)
        phase, msg = progress.phase, progress.message
        out["progress"] = f"{phase}: {msg}" if phase and msg else (msg or phase or None)
    elif kind == events.READY:
        ready = ReadyData.from_dict(data)
        out.update(
            phase="ready",
            ready_summary=ready.config.summary if ready is not None else None,
            progress=None,
            diff_count=len(ready.diff) if ready is not None else 0,
        )
    elif kind == events.SUCCEEDED:
        outcome = parse_outcome(data)
        out.update(
            phase="done", result_kind=outcome.kind.value if outcome is not None else data.get("kind"), progress=None
        )
        # The header state is stored JSON (the thread record): the outcome's facts go in as plain values.
        if isinstance(outcome, (BenchOutcome, LaunchOutcome, EvalOutcome)):
            run_id = outcome.run_id
            if run_id:
                out["run_id"] = run_id
            evaluated = outcome if isinstance(outcome, EvalOutcome) else getattr(outcome, "eval", None)
            if evaluated is not None:  # the accuracy verdict shows in the header: a red flag is seen at once
                out.update(eval_summary=evaluated.summary, eval_flagged=evaluated.flagged)
        elif isinstance(outcome, SweepOutcome):
            out.update(run_ids=list(outcome.run_ids), sweep_id=outcome.sweep_id)
            drops = [c.label for c in outcome.cells if c.eval is not None and c.eval.flagged]
            if drops:
                out["eval_drops"] = drops
        elif isinstance(outcome, StopOutcome):
            out["stopped"] = outcome.stopped.to_dict() if outcome.stopped is not None else None
        else:
            for key in ("run_id", "run_ids", "sweep_id", "stopped"):  # a result of no known kind
                if key in data:
                    out[key] = data[key]
        if isinstance(outcome, LaunchOutcome) and not out.get("ready_summary"):
            out["ready_summary"] = outcome.config.summary
    elif kind == events.FAILED:
        failed = FailedData.from_dict(data)
        out.update(
            phase="failed",
            progress=None,
            category=failed.category,
            error=(failed.diagnosis or {}).get("summary") or failed.message or None,
        )
    elif kind == events.CANCELLED:
        out.update(phase="cancelled", progress=None, cancelled_by=CancelledData.from_dict(data).by)
    return out
