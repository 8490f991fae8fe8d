"""What a tune's Slack thread gets, besides each step's header: after each trial its live line, at the end
the trials table (with the finalists and the winner) and the figures (goodput per trial with the
incumbent's line; for ``objective=both`` the Pareto front of goodput against tokens per joule).

A tune runs as one job per trial. Its first job's header owns the thread (the Slack front end recorded it
when it posted the queued reply); every later step was queued by a worker, so no Slack message owns it:
:func:`tune_of_step` names the tune such a step belongs to, and the notifier gives the step a thread record
that replies in the tune's thread (as a job asked for inside another job's thread does). Nothing here reads
Redis but :func:`tune_of_step`; the figures are drawn from the step's result alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import redis

from bot import blocks
from workers.errors import BenchbotError
from workers.jobs import queue
from workers.jobs.payloads import JobKind
from workers.tune.outcome import TuneOutcome
from workers.tune.report import outcome_text
from workers.tune.state import PAUSED

if TYPE_CHECKING:
    from bot.plot_kit import PlotInfo


def tune_of_step(r: redis.Redis, job_id: str) -> str | None:
    """The tune a later step job belongs to (its payload's ``tune_id``, when that is another job); else None."""
    info = queue.job_info(r, job_id)
    if info is None or info.kind != JobKind.TUNE:
        return None
    try:
        payload = queue.job_payload(r, job_id)
    except BenchbotError:  # RQ no longer keeps it: nothing to route by
        return None
    tune_id = payload.get("tune_id") if isinstance(payload, dict) else None
    return str(tune_id) if tune_id and str(tune_id) != job_id else None


def step_message(outcome: TuneOutcome) -> blocks.Message:
    """A step's closing words: a trial's live line and where the next trial waits; at the end, the table."""
    if outcome.next_job is not None:
        return blocks.text_message(outcome.message)
    return blocks.table_message(f"Tune {outcome.tune_id}: {outcome.status}", outcome_text(outcome))


def draw(outcome: TuneOutcome, out_dir: Path) -> list[PlotInfo]:
    """The tune's figures once it ended (none for a step that queued the next one, nor for a pause)."""
    if outcome.next_job is not None or outcome.status == PAUSED:
        return []
    from bot.tune_plots import draw_tune  # matplotlib loads only when there is something to draw

    return draw_tune(outcome, out_dir)
