"""Following a job to its end on a terminal: its events as text, then the plots of its results.

``benchbot say --wait``, the console and the demo all follow jobs the same way. The runs a finished job
names are read once (:func:`read_result_runs`) and drawn by :func:`bot.plots.draw_for_result`, the one place
that knows which plots a finished job has (the Slack thread draws through it too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import redis as redis_lib

from bot import render
from workers.jobs import events
from workers.jobs.outcomes import SweepOutcome, parse_outcome, run_ids_of
from workers.results import store
from workers.results.record import RunRecord
from workers.tune.outcome import TuneOutcome

if TYPE_CHECKING:
    from bot.plot_kit import PlotInfo

#: Exit codes of ``benchbot say``: the job succeeded, it failed, or the command was refused.
EXIT_OK, EXIT_JOB_FAILED, EXIT_REFUSED = 0, 1, 2


class EventRecord(TypedDict):
    """One event as ``say --json`` prints it."""

    id: str
    job: str
    type: str
    ts: float
    data: Mapping[str, object]


@dataclass(frozen=True)
class Followed:
    """How a followed job ended: the exit code, its events, the plots drawn and the runs it stored."""

    code: int
    events: list[EventRecord]
    plots: list[str]
    runs: tuple[RunRecord, ...] = ()


def read_result_runs(r: redis_lib.Redis, result: Mapping[str, object]) -> store.ResultRuns:
    """The runs a finished job's result (its ``succeeded`` data) names, read once."""
    outcome = parse_outcome(result)
    return store.result_runs(r, run_ids_of(outcome), sweep=isinstance(outcome, SweepOutcome))


def draw_result(runs: store.ResultRuns, out_dir: Path) -> list[PlotInfo]:
    """The plots of those runs (:func:`bot.plots.draw_for_result`); matplotlib loads only when there are runs."""
    if not runs.runs:
        return []
    from bot import plots

    return plots.draw_for_result(runs, out_dir)


def plots_for_result(r: redis_lib.Redis, result: Mapping[str, object], out_dir: Path) -> list[str]:
    """PNG paths of a finished job's plots: its runs read once, then drawn."""
    return [str(info.path) for info in draw_result(read_result_runs(r, result), out_dir)]


def follow_job(
    r: redis_lib.Redis,
    job_id: str,
    *,
    as_json: bool,
    out_dir: Path,
    timeout_s: float | None = None,
    emit: Callable[[str], object] = print,
) -> Followed:
    """Print a job's events until it ends; draw its plots; return how it ended."""
    seen: list[EventRecord] = []
    paths: list[str] = []
    runs: tuple[RunRecord, ...] = ()
    code = EXIT_JOB_FAILED
    following: str | None = job_id
    while following is not None:  # a tune's step names the next step's job: follow the chain to its end
        job_events = events.follow(r, following, timeout_s=timeout_s)
        following = None
        for event in job_events:
            seen.append(EventRecord(id=event.id, job=event.job, type=event.type, ts=event.ts, data=event.data))
            if not as_json:
                emit(render.event_text(event))
            if event.type == events.SUCCEEDED and isinstance(event.data.get("next_job"), str):
                following = str(event.data["next_job"])
                continue
            if event.type != events.SUCCEEDED:
                continue
            code = EXIT_OK
            tuned = parse_outcome(event.data)
            if isinstance(tuned, TuneOutcome):  # a tune's figures come from its result, not from one run
                from bot.tune_plots import draw_tune

                paths = [str(info.path) for info in draw_tune(tuned, out_dir)]
                if paths and not as_json:
                    emit("plots:\n" + "\n".join(f"  {p}" for p in paths))
                continue
            result = read_result_runs(r, event.data)
            runs = result.runs
            paths = [str(info.path) for info in draw_result(result, out_dir)]
            if paths and not as_json:
                emit("plots:\n" + "\n".join(f"  {p}" for p in paths))
    return Followed(code, seen, paths, runs)
