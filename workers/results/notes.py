"""Notes on a run: what the team said about it in its Slack thread, kept with the run's record.

A plain reply in a result thread (not a command to benchbot) becomes a note: who wrote it, when, and
the text, scrubbed of secrets like everything benchbot stores, cut to :data:`MAX_NOTE_CHARS`. A run
keeps its newest :data:`MAX_NOTES` notes (a Redis list, oldest first, under :func:`workers.keys.run_notes`),
so a busy thread cannot grow a record without bound. ``/runs`` shows the count, ``runs show`` and
``@benchbot notes`` list them, and the export carries them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import redis as redis_lib

from workers import keys
from workers.errors import BenchbotError
from workers.redis_conn import text_client
from workers.results.store import get_run
from workers.secrets import scrub_secrets

MAX_NOTE_CHARS = 2000
MAX_NOTES = 200


@dataclass(frozen=True)
class Note:
    """One teammate's remark on a run."""

    by: str
    at: float
    text: str

    def to_dict(self) -> dict[str, str | float]:
        return {"by": self.by, "at": self.at, "text": self.text}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Note:
        at = data.get("at")
        return cls(
            str(data.get("by") or ""), float(at) if isinstance(at, int | float) else 0.0, str(data.get("text") or "")
        )


def add_note(r: redis_lib.Redis, run_id: str, by: str, text: str, *, at: float | None = None) -> Note:
    """Store a note on an existing run (scrubbed, cut, the oldest dropped past :data:`MAX_NOTES`)."""
    record = get_run(r, run_id)  # an unknown run is a friendly error, and stores nothing
    clean = str(scrub_secrets(text.strip()))
    if not clean:
        raise BenchbotError("an empty note is not stored")
    if len(clean) > MAX_NOTE_CHARS:
        clean = clean[: MAX_NOTE_CHARS - 1] + "…"
    note = Note(by=by, at=time.time() if at is None else at, text=clean)
    pipe = r.pipeline(transaction=True)
    pipe.rpush(keys.run_notes(record.id), json.dumps(note.to_dict(), separators=(",", ":")))
    pipe.ltrim(keys.run_notes(record.id), -MAX_NOTES, -1)
    pipe.execute()
    return note


def notes_of(r: redis_lib.Redis, run_id: str) -> list[Note]:
    """A run's notes, oldest first (unreadable entries are skipped)."""
    out = []
    for raw in text_client(r).lrange(keys.run_notes(run_id), 0, -1):
        try:
            data = json.loads(raw)
        except ValueError:
            continue
        if isinstance(data, dict):
            out.append(Note.from_dict(data))
    return out


def note_counts(r: redis_lib.Redis, run_ids: Iterable[str]) -> dict[str, int]:
    """How many notes each run has, in one round trip."""
    ids = list(run_ids)
    pipe = r.pipeline(transaction=False)
    for run_id in ids:
        pipe.llen(keys.run_notes(run_id))
    return {run_id: int(count) for run_id, count in zip(ids, pipe.execute(), strict=True)}


def format_notes(run_id: str, notes: list[Note]) -> str:
    """The notes as lines for Slack and the terminal: ``2026-12-06 19:40 @alice: text``."""
    if not notes:
        return f"{run_id} has no notes yet: a plain reply in its thread becomes one"
    stamp = lambda ts: time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))  # noqa: E731
    lines = [f"Notes on {run_id} ({len(notes)}):"]
    lines += [f"{stamp(n.at)} @{n.by}: {n.text}" for n in notes]
    return "\n".join(lines)


def show_run(r: redis_lib.Redis, run_id: str) -> str:
    """``benchbot runs show r12``: the run's row as ``/runs`` shows it, its levels, and its notes."""
    from workers.results import tables

    record = get_run(r, run_id)
    parts = [tables.format_runs_table([record])]
    if record.levels:
        parts.append(tables.format_levels_table(record))
    parts.append(format_notes(record.id, notes_of(r, record.id)))
    return "\n\n".join(parts)
