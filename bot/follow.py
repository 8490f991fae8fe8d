"""Following a job to its end on a terminal: its events as text, then the plots of its results.

``benchbot say --wait``, the console and the demo all follow jobs the same way; the plots are drawn by
:func:`bot.plots.plots_for_result`, the one place that knows which plots a finished job has.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bot import render
from workers.jobs import events

#: Exit codes of ``benchbot say``: the job succeeded, it failed, or the command was refused.
EXIT_OK, EXIT_JOB_FAILED, EXIT_REFUSED = 0, 1, 2


def follow_job(
    r: Any,
    job_id: str,
    *,
    as_json: bool,
    out_dir: Path,
    timeout_s: float | None = None,
    emit: Callable[[str], Any] = print,
) -> tuple[int, list[dict[str, Any]], list[str]]:
    """Print a job's events until it ends; draw its plots; return (exit code, events, plot paths)."""
    seen: list[dict[str, Any]] = []
    paths: list[str] = []
    code = EXIT_JOB_FAILED
    for event in events.follow(r, job_id, timeout_s=timeout_s):
        record = {"id": event.id, "job": event.job, "type": event.type, "ts": event.ts, "data": event.data}
        seen.append(record)
        if not as_json:
            emit(render.event_text(event))
        if event.type == events.SUCCEEDED:
            code = EXIT_OK
            from bot import plots  # matplotlib only once there is something to draw

            paths = plots.plots_for_result(r, event.data, out_dir)
            if paths and not as_json:
                emit("plots:\n" + "\n".join(f"  {p}" for p in paths))
    return code, seen, paths


def result_runs(r: Any, seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stored runs a finished job produced, whole (per-level metrics as data, not a table string)."""
    from workers.jobs.outcomes import parse_outcome, run_ids_of
    from workers.results import store

    if not seen or seen[-1]["type"] != "succeeded":
        return []
    ids = run_ids_of(parse_outcome(seen[-1]["data"]))
    return [run.to_dict() for run in store.get_runs(r, ids)] if ids else []
