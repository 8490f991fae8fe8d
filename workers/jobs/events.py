"""Job lifecycle events on Redis streams.

Every event goes to two streams in one atomic step:

* :data:`workers.keys.EVENTS`: the global stream read by the Slack notifier through a consumer group, so a
  restarted notifier gets each event exactly once (ack what you delivered; claim what a dead consumer
  left pending);
* :func:`workers.keys.job_events`: one job's history, for ``say --wait`` and for re-rendering a thread.

A job has exactly one terminal event (succeeded, failed or cancelled): the publish script sets a
marker and refuses anything, terminal or not, once the marker exists. That lets the job itself, the
worker that notices a dead horse and the reaper race without double reports.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import redis

from workers import keys
from workers.jobs import job_metrics
from workers.redis_conn import text_client

if TYPE_CHECKING:
    from workers.json_value import JsonObject, JsonValue, RawJson

SCHEMA = 1
GLOBAL_STREAM = keys.EVENTS
# ~ trimming keeps the newest entries; the notifier is expected to be minutes behind, not days.
GLOBAL_MAXLEN = 20_000
JOB_MAXLEN = 2_000
JOB_EVENTS_TTL_S = 7 * 24 * 3600
DEFAULT_GROUP = "notifier"


class EventType(StrEnum):
    """What happened to a job. The values are the wire strings (``"type"`` in the JSON), unchanged."""

    QUEUED = "queued"
    STARTED = "started"
    PROGRESS = "progress"
    READY = "ready"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobState(StrEnum):
    """Where a job stands, as ``/queue`` and ``cancel`` see it (see ``queue.JobInfo``).

    Beside the events because a job's ending *is* its terminal event's type: the three endings share
    their values with :class:`EventType`.
    """

    QUEUED = "queued"  # not picked by a worker yet
    WAITING = "waiting"  # picked, waiting in line for the host
    RUNNING = "running"  # holds the host
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ProgressPhase(StrEnum):
    """The ``phase`` of a ``progress`` event: which step of its job a worker is at."""

    WAITING = "waiting"  # in line for the host
    CLEANUP = "cleanup"  # stopping what a dead launch left
    ENGINE = "engine"  # learning which engine the host runs
    OBSERVE = "observe"
    STOP = "stop"
    SPAWN = "spawn"
    WATCH = "watch"  # waiting for the engine to answer
    SMOKE = "smoke"
    BENCH = "bench"
    SWEEP = "sweep"
    LAUNCH = "launch"
    SLO = "slo"  # an SLO search trying one load
    EVAL = "eval"  # an accuracy check asking its questions


# The old names, kept: they are the enum members themselves, so ``== "queued"`` still holds.
QUEUED = EventType.QUEUED
STARTED = EventType.STARTED
PROGRESS = EventType.PROGRESS
READY = EventType.READY
SUCCEEDED = EventType.SUCCEEDED
FAILED = EventType.FAILED
CANCELLED = EventType.CANCELLED
TYPES = frozenset(EventType)
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})

_PUBLISH = """
if redis.call('EXISTS', KEYS[3]) == 1 then return false end
if ARGV[2] == '1' then redis.call('SET', KEYS[3], ARGV[6], 'EX', ARGV[5]) end
local gid = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'event', ARGV[1])
local jid = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'event', ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[5])
return {gid, jid}
"""


# As _PUBLISH, but KEYS[4] blocks it: returns -1 (nothing written) while that key exists. The job's
# "succeeded" goes through it with the cancel flag as KEYS[4], so a cancel is either seen by the job
# (which then cleans up and ends cancelled) or arrives after the ending (and is told the job ended).
_PUBLISH_UNLESS = """
if redis.call('EXISTS', KEYS[3]) == 1 then return false end
if redis.call('EXISTS', KEYS[4]) == 1 then return -1 end
if ARGV[2] == '1' then redis.call('SET', KEYS[3], ARGV[6], 'EX', ARGV[5]) end
local gid = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'event', ARGV[1])
local jid = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'event', ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[5])
return {gid, jid}
"""

# ---- event data ----------------------------------------------------------------------------------
#
# ``Event.data`` is the JSON the stream carries; these are its typed forms for the small events, read once
# by whoever shows them (``from_dict`` tolerates keys older writers left out). ``ready`` and
# ``succeeded`` carry a launch's or a job's result: ``workers.jobs.outcomes`` (ReadyData, parse_outcome).


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _int(value: object, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass(frozen=True)
class QueuedData:
    """``queued``: who asked for what, where, and the place in the host's line."""

    job_id: str
    user: str
    channel: str
    host: str
    kind: str
    summary: str
    position: int = 0
    ahead: int = 0
    outcome_kind: str | None = None  # ``workers.jobs.payloads.OutcomeKind``: launch+bench for a launch that benches

    def to_dict(self) -> dict[str, JsonValue]:
        return {
            "job_id": self.job_id,
            "user": self.user,
            "channel": self.channel,
            "host": self.host,
            "kind": self.kind,
            "summary": self.summary,
            "position": self.position,
            "ahead": self.ahead,
            **({"outcome_kind": self.outcome_kind} if self.outcome_kind else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> QueuedData:
        return cls(
            job_id=str(data.get("job_id") or ""),
            user=str(data.get("user") or ""),
            channel=str(data.get("channel") or ""),
            host=str(data.get("host") or ""),
            kind=str(data.get("kind") or ""),
            summary=str(data.get("summary") or ""),
            position=_int(data.get("position")),
            ahead=_int(data.get("ahead")),
            outcome_kind=_opt_str(data.get("outcome_kind")),
        )


@dataclass(frozen=True)
class StartedData:
    """``started``: the worker that took the job, and the fencing token of its lease."""

    worker: str | None
    fence: int | None = None
    host: str | None = None

    def to_dict(self) -> dict[str, JsonValue]:
        return {"worker": self.worker, "fence": self.fence, "host": self.host}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> StartedData:
        fence = data.get("fence")
        return cls(_opt_str(data.get("worker")), fence if isinstance(fence, int) else None, _opt_str(data.get("host")))


@dataclass(frozen=True)
class ProgressData:
    """``progress``: the step (:class:`ProgressPhase`, kept as the string for phases of other writers) and a line."""

    phase: str
    message: str

    def to_dict(self) -> dict[str, JsonValue]:
        return {"phase": str(self.phase), "message": self.message}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ProgressData:
        return cls(str(data.get("phase") or ""), str(data.get("message") or ""))


@dataclass(frozen=True)
class FailedData:
    """``failed``: the sentence for people and, when known, the diagnosis (category, summary, evidence, log tail)."""

    message: str
    diagnosis: dict[str, JsonValue] | None = None

    @property
    def category(self) -> str | None:
        value = (self.diagnosis or {}).get("category")
        return None if value is None else str(value)

    @property
    def log_tail(self) -> list[str]:
        tail = (self.diagnosis or {}).get("log_tail")
        return [str(line) for line in tail] if isinstance(tail, list) else []

    def to_dict(self) -> dict[str, JsonValue]:
        return {"message": self.message, "diagnosis": self.diagnosis}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> FailedData:
        diagnosis = data.get("diagnosis")
        return cls(str(data.get("message") or ""), dict(diagnosis) if isinstance(diagnosis, Mapping) else None)


@dataclass(frozen=True)
class CancelledData:
    """``cancelled``: who cancelled, the sentence that says so, and what the job had done on the host
    before the cancel landed (``done``: "the engine was stopped (pid 123)"; "" when nothing)."""

    by: str | None
    message: str = ""
    done: str = ""

    def to_dict(self) -> dict[str, JsonValue]:
        return {"by": self.by, "message": self.message, "done": self.done}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> CancelledData:
        return cls(_opt_str(data.get("by")), str(data.get("message") or ""), str(data.get("done") or ""))


PUBLISHED = "published"
BLOCKED = "blocked"
ENDED = "ended"


job_stream = keys.job_events
terminal_key = keys.job_terminal


def _entry_text(value: str | bytes) -> str:
    """A stream entry's id or field as str. Bytes arrive only where a caller read the stream with a
    bytes client of its own (a test, a tool) and hands the entry to :meth:`Event.from_entry`."""
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class Event:
    """One versioned event. ``id`` is the entry id in the stream it was read from ("" before that)."""

    job: str
    type: EventType
    ts: float
    data: RawJson = field(default_factory=dict)  # decoded from the stream: typed by events.*Data.from_dict
    id: str = ""
    schema: int = SCHEMA

    @property
    def terminal(self) -> bool:
        """True for succeeded, failed and cancelled."""
        return self.type in TERMINAL

    def to_json(self) -> str:
        """The wire form: ``{"schema":1,"job":..,"type":..,"ts":..,"data":{...}}``."""
        return json.dumps(
            {"schema": self.schema, "job": self.job, "type": self.type, "ts": self.ts, "data": self.data},
            separators=(",", ":"),
            default=str,
        )

    @classmethod
    def from_entry(cls, entry_id: str | bytes, fields: Mapping[Any, Any]) -> Event:
        """Decode one stream entry: str from benchbot's decoding clients, bytes from a caller's own client."""
        body = json.loads(_entry_text(fields["event"] if "event" in fields else fields[b"event"]))
        return cls(
            job=str(body["job"]),
            type=EventType(str(body["type"])),
            ts=float(body["ts"]),
            data=dict(body.get("data") or {}),
            id=_entry_text(entry_id),
            schema=int(body.get("schema", SCHEMA)),
        )


def _count_ending(r: redis.Redis, event: Event) -> None:
    """The operators' count of a job's ending (:mod:`workers.jobs.job_metrics`): its state, and for a failure its
    diagnosis's category; the counter gets those facts, never the event's data."""
    diagnosis = event.data.get("diagnosis") if event.type == EventType.FAILED else None
    category = diagnosis.get("category") if isinstance(diagnosis, Mapping) else None
    job_metrics.record_ending(
        r, job_metrics.Ending(event.job, str(event.type), event.ts, str(category) if category else None)
    )


def publish(r: redis.Redis, job_id: str, type_: EventType | str, data: JsonObject | None = None) -> Event | None:
    """Append an event to both streams; None (and nothing written) if the job already ended."""
    if type_ not in TYPES:
        raise ValueError(f"unknown event type {type_!r}")
    event = Event(job=str(job_id), type=EventType(type_), ts=time.time(), data=dict(data or {}))
    ids = text_client(r).eval(
        _PUBLISH,
        3,
        GLOBAL_STREAM,
        job_stream(event.job),
        terminal_key(event.job),
        event.to_json(),
        "1" if event.terminal else "0",
        GLOBAL_MAXLEN,
        JOB_MAXLEN,
        JOB_EVENTS_TTL_S,
        str(type_),
    )
    if not ids:
        return None
    if event.terminal:  # written now, so counted once (workers/jobs/job_metrics.py)
        _count_ending(r, event)
    return Event(job=event.job, type=event.type, ts=event.ts, data=event.data, id=ids[1])


def publish_unless(
    r: redis.Redis, job_id: str, type_: EventType | str, data: JsonObject | None, blocker_key: str
) -> tuple[str, Event | None]:
    """Publish unless ``blocker_key`` exists, in one atomic step.

    Returns (PUBLISHED, event), (BLOCKED, None) while the blocker exists, or (ENDED, None) when the
    job had already ended (nothing written in the last two cases).
    """
    if type_ not in TYPES:
        raise ValueError(f"unknown event type {type_!r}")
    event = Event(job=str(job_id), type=EventType(type_), ts=time.time(), data=dict(data or {}))
    reply = text_client(r).eval(
        _PUBLISH_UNLESS,
        4,
        GLOBAL_STREAM,
        job_stream(event.job),
        terminal_key(event.job),
        blocker_key,
        event.to_json(),
        "1" if event.terminal else "0",
        GLOBAL_MAXLEN,
        JOB_MAXLEN,
        JOB_EVENTS_TTL_S,
        str(type_),
    )
    if reply is None:
        return ENDED, None
    if isinstance(reply, int):
        return BLOCKED, None
    if event.terminal:
        _count_ending(r, event)
    return PUBLISHED, Event(job=event.job, type=event.type, ts=event.ts, data=event.data, id=reply[1])


def is_terminal(r: redis.Redis, job_id: str) -> bool:
    """Whether the job has published its one terminal event."""
    return bool(r.exists(terminal_key(job_id)))


def terminal_type(r: redis.Redis, job_id: str) -> EventType | None:
    """succeeded / failed / cancelled, or None while the job has not ended."""
    value = text_client(r).get(terminal_key(job_id))
    return EventType(value) if value is not None else None


def job_events(r: redis.Redis, job_id: str) -> list[Event]:
    """The whole history of one job, oldest first."""
    return [Event.from_entry(i, f) for i, f in text_client(r).xrange(job_stream(job_id))]


def follow(
    r: redis.Redis,
    job_id: str,
    after_id: str = "0",
    block_ms: int = 1000,
    timeout_s: float | None = None,
) -> Iterator[Event]:
    """Yield the job's events after ``after_id`` as they come; ends after the terminal event.

    Also ends when ``timeout_s`` passes with nothing new, or when the job is already over and
    nothing is left to read (a caller that resumes after the terminal event must not hang).
    ``block_ms`` stays well under redis-py's default 5 s socket timeout.
    """
    r = text_client(r)
    stream = job_stream(job_id)
    last = after_id
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        wait_ms = block_ms
        if deadline is not None:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return
            wait_ms = max(1, min(block_ms, left_ms))
        reply = r.xread({stream: last}, block=wait_ms, count=100)
        if not reply:
            if not is_terminal(r, job_id):
                continue
            # The ending may have been published between the empty read and that check: read once more.
            reply = r.xread({stream: last}, count=100)
            if not reply:
                return
        for entry_id, fields in reply[0][1]:
            event = Event.from_entry(entry_id, fields)
            last = event.id
            yield event
            if event.terminal:
                return


# ---- consumer group on the global stream (the notifier) ---------------------------------------


def ensure_group(r: redis.Redis, group: str = DEFAULT_GROUP, start_id: str = "$") -> bool:
    """Create the consumer group (and the stream) once; True if it was created now.

    ``start_id="$"`` delivers only events published after creation; pass "0" to replay history.
    """
    try:
        r.xgroup_create(GLOBAL_STREAM, group, id=start_id, mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" in str(exc):
            return False
        raise
    return True


def _decode_read(reply: Any) -> list[Event]:
    events: list[Event] = []
    for _stream, entries in reply or []:
        for entry_id, fields in entries:
            if fields:  # a pending entry trimmed away comes back with no fields
                events.append(Event.from_entry(entry_id, fields))
    return events


def read_group(
    r: redis.Redis, consumer: str, group: str = DEFAULT_GROUP, block_ms: int = 5000, count: int = 100
) -> list[Event]:
    """New events for ``consumer``; they stay pending until :func:`ack`."""
    reply = text_client(r).xreadgroup(group, consumer, {GLOBAL_STREAM: ">"}, count=count, block=block_ms)
    return _decode_read(reply)


def read_pending(r: redis.Redis, consumer: str, group: str = DEFAULT_GROUP, count: int = 100) -> list[Event]:
    """Events delivered to ``consumer`` earlier but never acked: what a restart must redo first."""
    reply = text_client(r).xreadgroup(group, consumer, {GLOBAL_STREAM: "0"}, count=count)
    return _decode_read(reply)


def claim_stale(
    r: redis.Redis, consumer: str, group: str = DEFAULT_GROUP, min_idle_ms: int = 60_000, count: int = 100
) -> list[Event]:
    """Take over entries another (dead) consumer left unacked for ``min_idle_ms`` (XAUTOCLAIM)."""
    r = text_client(r)
    events: list[Event] = []
    start = "0-0"
    while len(events) < count:
        reply = r.xautoclaim(GLOBAL_STREAM, group, consumer, min_idle_ms, start_id=start, count=count)
        next_start, entries = reply[0], reply[1]
        events.extend(Event.from_entry(i, f) for i, f in entries if f)
        if next_start == "0-0":
            break
        start = next_start
    return events


def ack(r: redis.Redis, ids: Iterable[str], group: str = DEFAULT_GROUP) -> int:
    """Mark events delivered; returns how many were pending."""
    ids = list(ids)
    if not ids:
        return 0
    return int(r.xack(GLOBAL_STREAM, group, *ids))
