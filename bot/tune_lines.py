"""Where each unfinished tune stands, for ``/queue`` and ``/status``: trial k of N, the step's place in the
host's line, the incumbent, or who paused it.

A tune runs as one step job per trial, so the host's line alone shows only the current step ("tune 5:
trial 2 of 6"); between two steps, or while paused, the line shows nothing of it at all. These lines come
from the tune's own record (:mod:`workers.tune.state`), read once per answer for the hosts asked about.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import redis

from workers.jobs.events import JobState
from workers.jobs.queue import JobInfo
from workers.tune import report, state

#: How many of the newest tunes are looked at (a tune older than the newest 50 is long finished).
RECENT_TUNES = 50
_ACTIVE = frozenset({state.RUNNING, state.QUEUED, state.PAUSED})


def active_tunes(r: redis.Redis, hosts: Iterable[str]) -> list[state.TuneRecord]:
    """The unfinished tunes (running, queued between trials, paused) on ``hosts``, newest first."""
    wanted = set(hosts)
    return [t for t in state.recent(r, RECENT_TUNES) if t.status in _ACTIVE and t.host in wanted]


def _step_words(record: state.TuneRecord, jobs: Sequence[JobInfo]) -> str:
    step = next((j for j in jobs if j.job_id == record.current_job), None)
    if step is None:
        return f"its step #{record.current_job} ended without a result: /tune resume {record.id} continues it"
    if step.state == JobState.RUNNING:
        return f"running as #{step.job_id}"
    ahead = int(step.position or 1) - 1
    return f"queued as #{step.job_id}, " + ("next in line" if ahead == 0 else f"{ahead} job(s) of others ahead")


def tune_line(record: state.TuneRecord, jobs: Sequence[JobInfo], control: tuple[str, str] | None = None) -> str:
    """``tune 5 on gpu-1 (@alice): trial 2 of 6, running as #9; incumbent: trial 1 (moe=..., 1.23 req/s)``;
    ``control``: a pause or cancel asked for and not yet read by the step (it is read after the trial)."""
    head = f"tune {record.id} on {record.host} (@{record.user}): "
    done = len(record.trials)
    if record.status == state.PAUSED:
        paused = record.note.replace(f"{state.CONTROL_PAUSE} by ", "paused by ", 1) if record.note else "paused"
        head += f"{paused} after {done} of {record.budget} trials: /tune resume {record.id}"
    else:
        head += f"trial {done + 1} of {record.budget}, {_step_words(record, jobs)}"
        if control is not None:
            head += f", {control[0]} asked by {control[1]}: it {control[0]}s after this trial"
    best = report.incumbent_of(record.trials)
    if best is not None:
        head += f"; incumbent: trial {best.number} ({best.config}, {best.goodput_rps or 0.0:.2f} req/s)"
    return head


def tune_lines(r: redis.Redis, listing: Mapping[str, Sequence[JobInfo]]) -> list[str]:
    """One line per unfinished tune on the listed hosts (``listing``: the hosts' jobs, as /queue read them)."""
    return [tune_line(t, listing.get(t.host, ()), state.control(r, t.id)) for t in active_tunes(r, listing)]


def with_tunes(text: str, lines: Sequence[str]) -> str:
    """``text`` with a "tunes:" section under it when there are unfinished tunes."""
    return text + "\n\ntunes:\n" + "\n".join(f"  {line}" for line in lines) if lines else text
