"""A job's Slack thread: which message owns it, each event read once, and the header state events fold into.

The Slack front end records where a job's thread lives when it posts the job's header
(:func:`record_thread`, :func:`workers.keys.slack_thread`, kept a month); the notifier
(:mod:`bot.notifier`) reads it back for each event, parses the event once (:meth:`ThreadEvent.parse`:
scrubbed of secrets, its data in its typed form from :mod:`workers.jobs.events` and
:mod:`workers.jobs.outcomes`), folds it into the header state (:func:`fold`, a pure function, so a
redelivered event folds the same way) and saves it. Jobs started from the console or ``say`` have no record.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict, cast

import redis as redis_lib

from workers import keys
from workers.jobs import events
from workers.jobs.events import CancelledData, Event, EventType, FailedData, ProgressData, QueuedData, StartedData
from workers.jobs.outcomes import (
    BenchOutcome,
    EvalOutcome,
    LaunchOutcome,
    Outcome,
    ReadyData,
    StopOutcome,
    SweepOutcome,
    parse_outcome,
    run_ids_of,
)
from workers.jobs.payloads import JsonValue
from workers.secrets import scrub_secrets

log = logging.getLogger(__name__)

THREAD_KEY_PREFIX = keys.SLACK_THREAD_PREFIX
THREAD_TTL_S = 30 * 24 * 3600
#: What a header shows before any event arrived (taken from the queued Reply's data).
#: ``outcome_kind`` is the shape the job's typed payload will produce (``launch+bench`` for a launch with
#: ``then bench``): the header's buttons depend on it, never on the summary's words.
HEADER_FIELDS = ("job_id", "user", "channel", "host", "kind", "outcome_kind", "summary", "position", "ahead")


class HeaderState(TypedDict, total=False):
    """What a job's header shows, folded from its events; stored as JSON in the thread record.

    Every key is optional: a header starts from the queued Reply's data (or nothing, for a console job)
    and each event adds what it knows. ``config_posted`` is thread state, not shown: the verified config
    goes into the thread once (a ``ready`` event or a launch's success).
    """

    job_id: str
    user: str
    channel: str
    host: str | None
    kind: str
    outcome_kind: str | None
    summary: str
    position: int | None
    ahead: int | None
    measures: Mapping[str, JsonValue]  # a queued bench's ``Expectation`` (the Reply's data, first header only)
    phase: str
    worker: str | None
    progress: str | None
    ready_summary: str | None
    diff_count: int
    result_kind: str | None
    run_id: str
    run_ids: list[str]
    sweep_id: str
    stopped: JsonValue  # the stopped server's JSON, None when nothing was running
    eval_summary: str
    eval_flagged: bool
    eval_drops: list[str]
    category: str | None
    error: str | None
    cancelled_by: str | None
    config_posted: bool


class ThreadRecord(TypedDict):
    """Where a job's thread lives (``ts`` None until its header is posted) and its header state."""

    schema: int
    channel: str
    ts: str | None
    state: HeaderState


#: Redis key of the record of the Slack message that owns a job.
thread_key = keys.slack_thread


def _opt_text(value: object) -> str | None:
    return None if value is None else str(value)


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def header_of(data: Mapping[str, object], job_id: str) -> HeaderState:
    """The header a queued job shows before any event arrived, from the queued Reply's data.

    The same fields as :data:`HEADER_FIELDS` plus what a bench ``measures`` (shown on the first header only:
    the record keeps :data:`HEADER_FIELDS`).
    """
    state = HeaderState(phase="queued", job_id=str(job_id))
    for key in ("user", "channel", "kind", "summary"):
        if key in data:
            state[key] = str(data[key])
    if "host" in data:
        state["host"] = _opt_text(data["host"])
    if "outcome_kind" in data:
        state["outcome_kind"] = _opt_text(data["outcome_kind"])
    if "position" in data:
        state["position"] = _opt_int(data["position"])
    if "ahead" in data:
        state["ahead"] = _opt_int(data["ahead"])
    measures = data.get("measures")
    if isinstance(measures, Mapping):
        state["measures"] = cast(Mapping[str, JsonValue], measures)
    return state


def record_thread(
    r: redis_lib.Redis, job_id: str, channel: str, ts: str | None, header: HeaderState | None = None
) -> ThreadRecord:
    """Remember that the message (channel, ts) is job ``job_id``'s header (its thread's parent).

    ``header`` is what the header shows before any event arrived (:func:`header_of` the queued Reply's data).
    """
    state = HeaderState(phase="queued")
    state.update(cast(HeaderState, {k: v for k, v in (header or {}).items() if k in HEADER_FIELDS}))
    state["job_id"] = str(job_id)
    thread = ThreadRecord(schema=1, channel=channel, ts=ts, state=state)
    save_thread(r, str(job_id), thread)
    return thread


def get_thread(r: redis_lib.Redis, job_id: str) -> ThreadRecord | None:
    """The thread record of a job, or None for jobs no Slack message owns."""
    raw = r.get(thread_key(job_id))
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        log.warning("job %s: unreadable thread record ignored", job_id)
        return None
    if not isinstance(data, dict) or not data.get("channel"):
        return None
    if not isinstance(data.get("state"), dict):
        data["state"] = {}
    return cast(ThreadRecord, data)  # the Redis edge: what save_thread wrote


def save_thread(r: redis_lib.Redis, job_id: str, thread: ThreadRecord) -> None:
    """Store a thread record (header state included) for a month."""
    r.set(thread_key(job_id), json.dumps(thread, default=str, separators=(",", ":")), ex=THREAD_TTL_S)


# --------------------------------------------------------------------------- one event, read once


EventData = QueuedData | StartedData | ProgressData | ReadyData | Outcome | FailedData | CancelledData | None


def _typed(kind: EventType, data: Mapping[str, object]) -> EventData:
    if kind == events.QUEUED:
        return QueuedData.from_dict(data)
    if kind == events.STARTED:
        return StartedData.from_dict(data)
    if kind == events.PROGRESS:
        return ProgressData.from_dict(data)
    if kind == events.READY:
        return ReadyData.from_dict(data)
    if kind == events.SUCCEEDED:
        return parse_outcome(data)
    if kind == events.FAILED:
        return FailedData.from_dict(data)
    return CancelledData.from_dict(data)


@dataclass(frozen=True)
class ThreadEvent:
    """One job event as its thread shows it: parsed once, scrubbed of secrets, its data in its typed form.

    ``typed`` is the event's data through its type (``QueuedData``, ``ReadyData`` ..., the job's
    ``Outcome`` for ``succeeded``); None where the data is not readable so (a ``ready`` without a config,
    a result of no known kind). ``data`` is the scrubbed JSON itself, read only for a result of no known kind.
    """

    id: str
    job: str
    type: EventType
    typed: EventData
    data: Mapping[str, object]

    @classmethod
    def parse(cls, event: Event) -> ThreadEvent:
        """The one parse of an event: everything shown from it is scrubbed here, whatever the worker hid."""
        data = scrub_secrets(dict(event.data))
        return cls(event.id, event.job, event.type, _typed(event.type, data), data)

    @property
    def outcome(self) -> Outcome | None:
        """The typed result of a ``succeeded`` event (None for other events and results of no known kind)."""
        typed = self.typed  # only a ``succeeded`` event's data parses to an outcome
        return (
            typed
            if isinstance(typed, LaunchOutcome | BenchOutcome | StopOutcome | SweepOutcome | EvalOutcome)
            else None
        )

    @property
    def run_ids(self) -> tuple[str, ...]:
        """The stored runs a ``succeeded`` event's result names (none for any other event)."""
        return run_ids_of(self.outcome)

    @property
    def sweep(self) -> bool:
        """Whether the result is a sweep's (its runs are the cells, compared with each other, no baseline)."""
        return isinstance(self.outcome, SweepOutcome)


# --------------------------------------------------------------------------- the header state


def _fold_queued(out: HeaderState, queued: QueuedData) -> None:
    # Fields the queued Reply already gave win (setdefault); the place in line is the event's.
    for key, value in (
        ("user", queued.user),
        ("channel", queued.channel),
        ("host", queued.host),
        ("kind", queued.kind),
        ("outcome_kind", queued.outcome_kind),
        ("summary", queued.summary),
    ):
        if value:
            out.setdefault(key, value)  # type: ignore[misc]  # every key here is a str field
    out.update(HeaderState(phase="queued", position=queued.position, ahead=queued.ahead))


def _fold_result(out: HeaderState, event: ThreadEvent) -> None:
    outcome = event.outcome
    out.update(
        HeaderState(
            phase="done",
            result_kind=outcome.kind.value if outcome is not None else _opt_text(event.data.get("kind")),
            progress=None,
        )
    )
    # The header state is stored JSON (the thread record): the outcome's facts go in as plain values.
    if isinstance(outcome, BenchOutcome | LaunchOutcome | EvalOutcome):
        if outcome.run_id:
            out["run_id"] = outcome.run_id
        evaluated = (
            outcome
            if isinstance(outcome, EvalOutcome)
            else outcome.eval
            if isinstance(outcome, LaunchOutcome)
            else None
        )
        if evaluated is not None:  # the accuracy verdict shows in the header: a red flag is seen at once
            out.update(HeaderState(eval_summary=evaluated.summary, eval_flagged=evaluated.flagged))
    elif isinstance(outcome, SweepOutcome):
        out.update(HeaderState(run_ids=list(outcome.run_ids), sweep_id=outcome.sweep_id))
        drops = [c.label for c in outcome.cells if c.eval is not None and c.eval.flagged]
        if drops:
            out["eval_drops"] = drops
    elif isinstance(outcome, StopOutcome):
        out["stopped"] = outcome.stopped.to_dict() if outcome.stopped is not None else None
    else:  # a result of no known kind: what it names, as it says it
        data = event.data
        if "run_id" in data:
            out["run_id"] = str(data["run_id"])
        run_ids = data.get("run_ids")
        if isinstance(run_ids, list):
            out["run_ids"] = [str(r) for r in run_ids]
        if "sweep_id" in data:
            out["sweep_id"] = str(data["sweep_id"])
        if "stopped" in data:
            out["stopped"] = cast(JsonValue, data["stopped"])
    if isinstance(outcome, LaunchOutcome):
        out["config_posted"] = True  # a launch's success posts its config unless its ready event did
        if not out.get("ready_summary"):
            out["ready_summary"] = outcome.config.summary


def fold(state: HeaderState, event: Event | ThreadEvent) -> HeaderState:
    """The header state after ``event``: a pure function, so a redelivered event folds the same way.

    A raw :class:`~workers.jobs.events.Event` is parsed first (:meth:`ThreadEvent.parse`); the notifier
    hands the event it already parsed.
    """
    parsed = event if isinstance(event, ThreadEvent) else ThreadEvent.parse(event)
    out = HeaderState(**state)
    out.setdefault("job_id", parsed.job)
    typed = parsed.typed
    if isinstance(typed, QueuedData):
        _fold_queued(out, typed)
    elif isinstance(typed, StartedData):
        out.update(HeaderState(phase="running", worker=typed.worker, progress=None))
    elif isinstance(typed, ProgressData):
        if out.get("phase") in (None, "queued"):
            out["phase"] = "running"
        phase, msg = typed.phase, typed.message
        out["progress"] = f"{phase}: {msg}" if phase and msg else (msg or phase or None)
    elif parsed.type == events.READY:
        ready = typed if isinstance(typed, ReadyData) else None
        out.update(
            HeaderState(
                phase="ready",
                ready_summary=ready.config.summary if ready is not None else None,
                progress=None,
                diff_count=len(ready.diff) if ready is not None else 0,
            )
        )
        if ready is not None:
            out["config_posted"] = True  # the ready event posts the verified config
    elif parsed.type == events.SUCCEEDED:
        _fold_result(out, parsed)
    elif isinstance(typed, FailedData):
        out.update(
            HeaderState(
                phase="failed",
                progress=None,
                category=typed.category,
                error=_opt_text((typed.diagnosis or {}).get("summary")) or typed.message or None,
            )
        )
    elif isinstance(typed, CancelledData):
        out.update(HeaderState(phase="cancelled", progress=None, cancelled_by=typed.by))
    return out
