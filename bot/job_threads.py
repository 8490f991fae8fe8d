"""A job's Slack thread, decided in one place: which message owns it, each event read once, the header state
events fold into, and everything else the thread gets (the observed config, the result table, the plots, the
diagnosis of a failure and its log tail).

The Slack front end records where a job's thread lives when it posts the job's header
(:func:`record_thread`, :func:`workers.keys.slack_thread`, kept a month); the notifier
(:mod:`bot.notifier`) reads it back for each event, parses the event once (:meth:`ThreadEvent.parse`:
scrubbed of secrets, its data in its typed form from :mod:`workers.jobs.events` and
:mod:`workers.jobs.outcomes`), folds it into the header state (:func:`fold`, a pure function, so a
redelivered event folds the same way) and saves it. :func:`posts` decides the rest from three values handed
in: the parsed event, the header state before it (whether the config is in the thread already) and the runs
its result names (read once by the notifier: :func:`workers.results.store.result_runs`). Nothing that decides
reads Redis; the notifier only delivers, in order, and retries each post on its own. Jobs started from the
console or ``say`` have no record.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict, cast

import redis as redis_lib

from bot import blocks, tune_thread
from bot.sentences import PLAIN, invalid_words
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
from workers.results import tables
from workers.results.record import RunRecord
from workers.results.store import ResultRuns
from workers.secrets import scrub_secrets
from workers.tune.outcome import TuneOutcome

if TYPE_CHECKING:
    from bot.plot_kit import PlotInfo
    from workers.evaluation.runner import EvalRun

log = logging.getLogger(__name__)

THREAD_KEY_PREFIX = keys.SLACK_THREAD_PREFIX
THREAD_TTL_S = 30 * 24 * 3600
#: What a header shows before any event arrived (taken from the queued Reply's data).
#: ``outcome_kind`` is the shape the job's typed payload will produce (``launch+bench`` for a launch with
#: ``then bench``): the header's buttons depend on it, never on the summary's words.
HEADER_FIELDS = ("job_id", "user", "channel", "host", "kind", "outcome_kind", "summary", "position", "ahead", "eta_s")


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
    eta_s: int | None  # while it waits: seconds until it should start (workers.jobs.eta), when history allows
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
    cancelled_after: str  # what the job had done before the cancel landed ("" when nothing)
    config_posted: bool


class ThreadRecord(TypedDict):
    """Where a job's thread lives (``ts`` None until its header is posted) and its header state.

    ``thread_ts``: set when the job was asked for inside another job's thread (``@benchbot again``): its
    header is a reply there and its story goes into that thread, not under its own header.
    """

    schema: int
    channel: str
    ts: str | None
    state: HeaderState
    thread_ts: NotRequired[str]


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
    if "eta_s" in data:
        state["eta_s"] = _opt_int(data["eta_s"])
    measures = data.get("measures")
    if isinstance(measures, Mapping):
        state["measures"] = cast(Mapping[str, JsonValue], measures)
    return state


def record_thread(
    r: redis_lib.Redis,
    job_id: str,
    channel: str,
    ts: str | None,
    header: HeaderState | None = None,
    *,
    thread_ts: str | None = None,
) -> ThreadRecord:
    """Remember that the message (channel, ts) is job ``job_id``'s header (its thread's parent).

    ``header`` is what the header shows before any event arrived (:func:`header_of` the queued Reply's data).
    """
    state = HeaderState(phase="queued")
    state.update(cast(HeaderState, {k: v for k, v in (header or {}).items() if k in HEADER_FIELDS}))
    state["job_id"] = str(job_id)
    thread = ThreadRecord(schema=1, channel=channel, ts=ts, state=state)
    if thread_ts:
        thread["thread_ts"] = thread_ts
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


def replies_ts(thread: ThreadRecord) -> str | None:
    """Where a job's thread replies go: the thread it was asked in, else under its own header."""
    return thread.get("thread_ts") or thread["ts"]


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
        out.update(HeaderState(phase="cancelled", progress=None, cancelled_by=typed.by, cancelled_after=typed.done))
    return out


# --------------------------------------------------------------------------- what the thread gets


class FileUpload(TypedDict, total=False):
    """One file of a ``files_upload_v2`` call: a path on disk (``file``) or text (``content``), named."""

    file: str
    content: str
    filename: str
    title: str
    alt_txt: str


@dataclass(frozen=True)
class ThreadMessage:
    """A reply in the thread."""

    name: str
    message: blocks.Message


@dataclass(frozen=True)
class ThreadFiles:
    """Files uploaded into the thread."""

    name: str
    uploads: tuple[FileUpload, ...]


@dataclass(frozen=True)
class ThreadPlots:
    """A result's plots: drawn when sent (matplotlib takes a while), kept by the sender until Slack took them."""

    job_id: str
    runs: ResultRuns
    name: str = "plots"

    @property
    def key(self) -> tuple[str, ...]:
        """Which drawing this is: the job and the runs drawn."""
        return (self.job_id, *self.runs.run_ids)

    def uploads(self, out_dir: Path) -> list[FileUpload]:
        """Draw the plots into ``out_dir``; their uploads, each with its title and alt text."""
        return plot_uploads(draw_plots(self.runs, self.job_id, out_dir))


@dataclass(frozen=True)
class ThreadTunePlots:
    """A tune's figures, drawn from its last step's result (:mod:`bot.tune_thread`) when sent."""

    job_id: str
    outcome: TuneOutcome
    name: str = "plots"

    @property
    def key(self) -> tuple[str, ...]:
        return (self.job_id, "tune", self.outcome.tune_id)

    def uploads(self, out_dir: Path) -> list[FileUpload]:
        return plot_uploads(tune_thread.draw(self.outcome, out_dir))


Post = ThreadMessage | ThreadFiles | ThreadPlots | ThreadTunePlots


def posts(event: ThreadEvent, before: HeaderState, runs: ResultRuns | None) -> list[Post]:
    """Everything the thread gets for ``event`` besides the header edit, in the order it is posted.

    ``before``: the header state before this event (the config goes in once); ``runs``: the runs a
    ``succeeded`` event's result names, read by the caller (None when it names none).
    """
    job_id = event.job
    typed = event.typed
    out: list[Post] = []
    if event.type == events.READY and isinstance(typed, ReadyData):
        out.append(ThreadMessage("config", config_message(typed, job_id)))
    elif event.type == events.SUCCEEDED:
        outcome = event.outcome
        if isinstance(outcome, LaunchOutcome) and not before.get("config_posted"):
            out.append(ThreadMessage("config", config_message(ReadyData(outcome.config, outcome.diff), job_id)))
        if runs is not None and runs.run_ids:
            if isinstance(outcome, SweepOutcome):
                results = sweep_results_message(runs, outcome.sweep_id)
            else:
                results = bench_results_message(runs)
            out += [ThreadMessage("results", results), ThreadPlots(job_id, runs)]
        if isinstance(typed, TuneOutcome):  # a trial's live line; at the end the trials table and figures
            out.append(ThreadMessage("results", tune_thread.step_message(typed)))
            out += [ThreadTunePlots(job_id, typed)] if typed.next_job is None else []
    elif isinstance(typed, FailedData):
        out.append(ThreadMessage("diagnosis", blocks.diagnosis_message(typed.message, typed.diagnosis)))
        upload = log_tail_upload(job_id, typed)
        if upload is not None:
            out.append(ThreadFiles("log", (upload,)))
    notice = owner_notice(event, before)
    if notice is not None:
        out.append(ThreadMessage("owner", blocks.text_message(notice)))
    return out


def owner_notice(event: ThreadEvent, before: HeaderState) -> str | None:
    """A job that waited behind others tells its owner when it starts and when it ends: a mention in its
    thread (in a DM, where the thread is the owner's own, the words without the mention). A job that
    started at once says nothing more than its header; a job its owner cancelled neither."""
    user, job_id = before.get("user"), event.job
    if not user or not before.get("ahead"):
        return None
    who = "" if str(before.get("channel") or "").startswith("D") else f"<@{user}> "
    if event.type == events.STARTED:
        return f"{who}your job #{job_id} started on {before.get('host') or 'its host'}"
    if isinstance(event.typed, CancelledData) and event.typed.by == user:
        return None
    endings = {events.SUCCEEDED: "is done", events.FAILED: "failed", events.CANCELLED: "was cancelled"}
    if event.type in endings:
        return f"{who}your job #{job_id} {endings[event.type]}"
    return None


def config_message(ready: ReadyData, job_id: str) -> blocks.Message:
    """The config a launch observed, with how it differs from what was asked."""
    return blocks.config_message(ready.config, ready.diff, ready.replaced, job_id=job_id, offer_bench=False)


def bench_results_message(runs: ResultRuns) -> blocks.Message:
    """The table of one bench, next to its host's baseline when there is another run tagged so."""
    record = runs.run
    if record is None:
        name = runs.run_ids[0] if runs.run_ids else "the job"
        return blocks.text_message(f"results of {name} could not be read: {runs.error}")
    records = [runs.baseline, record] if runs.baseline is not None else [record]
    note = None
    if not record.valid:
        note = invalid_words(PLAIN, record.invalid_reason)  # table_message escapes the note
    elif len(records) == 2:
        note = f"compared with the baseline of {record.host}, {records[0].id}"
    buttons = [blocks.button("Compare with baseline", "compare_baseline", record.id)] if len(records) == 1 else []
    name = record.label or record.config_summary or record.host
    evaluated = record.accuracy
    if evaluated is not None and not record.levels:  # an eval alone: its verdict is the result
        return eval_results_message(record, runs.eval_run, f"Eval {record.id}: {name}")
    msg = blocks.table_message(f"Bench {record.id}: {name}", tables.compare_table(records), note=note, buttons=buttons)
    if evaluated is not None:
        extra = _eval_blocks(record, runs.eval_run)
        msg = blocks.message(msg["text"] + "\n" + evaluated.summary, [*msg["blocks"], *extra])
    return msg


def _eval_blocks(record: RunRecord, eval_run: EvalRun | None) -> list[blocks.Block]:
    data = record.eval or {}
    evaluated = record.accuracy
    if evaluated is None:
        return []
    detail = ""
    comparison = data.get("comparison")
    if isinstance(comparison, Mapping) and data.get("baseline_run"):
        detail = f"baseline {data['baseline_run']} ({data.get('baseline_why') or 'the host baseline'})"
    detail += ("; " if detail else "") + f"{evaluated.task}: {evaluated.correct}/{evaluated.n} right"
    lo, hi = evaluated.ci95
    detail += f", 95 % CI {100 * lo:.1f}-{100 * hi:.1f} %"
    wrong = [f"{i.id}: {i.reason}" for i in (eval_run.items if eval_run else ()) if not i.correct][:3]
    return blocks.eval_blocks(evaluated.summary, evaluated.flagged, detail, wrong)


def eval_results_message(record: RunRecord, eval_run: EvalRun | None, title: str) -> blocks.Message:
    """An eval's verdict under its title, with the red flag when it dropped beyond noise."""
    evaluated = record.accuracy
    summary = evaluated.summary if evaluated is not None else "no readable eval"
    head = [blocks.section(f"*{blocks.escape(title)}*")]
    if not record.valid:
        head.append(blocks.context(blocks.escape(invalid_words(PLAIN, record.invalid_reason))))
    return blocks.message(f"{title}: {summary}", [*head, *_eval_blocks(record, eval_run)])


def sweep_results_message(runs: ResultRuns, sweep_id: str) -> blocks.Message:
    """The compare table of a sweep's cells."""
    title = f"Sweep {sweep_id}" if sweep_id else "Sweep"
    if runs.error:
        return blocks.text_message(f"results of {title[0].lower()}{title[1:]} could not be read: {runs.error}")
    return blocks.table_message(title, tables.compare_table(runs.runs))


def draw_plots(runs: ResultRuns, job_id: str, out_dir: Path) -> list[PlotInfo]:
    """The plots of a finished job (:func:`bot.plots.draw_for_result`); none when its runs could not be read."""
    if runs.error:
        log.warning("job %s: no plots, its runs could not be read (%s)", job_id, runs.error)
        return []
    from bot import plots  # matplotlib loads only when there is something to draw

    return plots.draw_for_result(runs, out_dir)


def plot_uploads(infos: Sequence[PlotInfo]) -> list[FileUpload]:
    """Slack file uploads of drawn plots, each with its title and alt text."""
    return [
        FileUpload(
            file=str(info.path),
            filename=Path(info.path).name,
            title=info.title or Path(info.path).stem,
            alt_txt=blocks.truncate(info.alt_text or Path(info.path).stem, 1000),
        )
        for info in infos
    ]


def log_tail_upload(job_id: str, failed: FailedData) -> FileUpload | None:
    """The engine's log tail of a failed job as a text file, or None when the diagnosis has none."""
    tail = failed.log_tail
    if not tail:
        return None
    content = "\n".join(str(line) for line in tail)
    return FileUpload(
        content=str(scrub_secrets(content)),
        filename=f"job-{job_id}-log-tail.txt",
        title=f"log tail of job {job_id}",
    )
