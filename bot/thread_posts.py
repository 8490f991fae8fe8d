"""What a job's Slack thread gets besides its header: the observed config, result tables, plots, the
diagnosis of a failure and its log tail.

Builders of Slack messages and file uploads from an event's data and the stored runs; the notifier
(:mod:`bot.notifier`) decides when each is sent and retries it. Everything shown is scrubbed of secrets
here (:func:`workers.secrets.scrub_secrets`), whatever the worker already hid.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis as redis_lib

from bot import blocks
from bot.sentences import PLAIN, invalid_words
from workers.errors import BenchbotError
from workers.jobs.events import FailedData
from workers.jobs.outcomes import ReadyData
from workers.results import store, tables
from workers.results.record import RunRecord
from workers.secrets import scrub_secrets

if TYPE_CHECKING:
    from bot.plots import PlotInfo

log = logging.getLogger(__name__)


def config_message(data: Mapping[str, Any], job_id: str) -> blocks.Message | None:
    """The config a launch observed (``ready``/``succeeded`` data with ``config``), with its diff.

    None when the data holds no readable observation.
    """
    ready = ReadyData.from_dict(scrub_secrets(dict(data)))
    if ready is None:
        return None
    return blocks.config_message(ready.config, ready.diff, ready.replaced, job_id=job_id, offer_bench=False)


def bench_results_message(r: redis_lib.Redis, run_id: str) -> blocks.Message:
    """The table of one bench, next to its host's baseline when there is another run tagged so."""
    try:
        record = store.get_run(r, run_id)
    except BenchbotError as exc:
        return blocks.text_message(f"results of {run_id} could not be read: {exc}")
    baseline = store.baseline_for(r, record.host)
    records = [baseline, record] if baseline is not None and baseline.id != record.id else [record]
    note = None
    if not record.valid:
        note = invalid_words(PLAIN, record.invalid_reason)  # table_message escapes the note
    elif len(records) == 2:
        note = f"compared with the baseline of {record.host}, {records[0].id}"
    buttons = [blocks.button("Compare with baseline", "compare_baseline", record.id)] if len(records) == 1 else []
    name = record.label or record.config_summary or record.host
    evaluated = record.accuracy
    if evaluated is not None and not record.levels:  # an eval alone: its verdict is the result
        return eval_results_message(r, record, f"Eval {record.id}: {name}")
    msg = blocks.table_message(f"Bench {record.id}: {name}", tables.compare_table(records), note=note, buttons=buttons)
    if evaluated is not None:
        extra = _eval_blocks(r, record)
        msg = blocks.message(msg["text"] + "\n" + evaluated.summary, [*msg["blocks"], *extra])
    return msg


def _eval_blocks(r: redis_lib.Redis, record: RunRecord) -> list[dict[str, Any]]:
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
    run = store.get_eval_run(r, record.id)
    wrong = [f"{i.id}: {i.reason}" for i in (run.items if run else ()) if not i.correct][:3]
    return blocks.eval_blocks(evaluated.summary, evaluated.flagged, detail, wrong)


def eval_results_message(r: redis_lib.Redis, record: RunRecord, title: str) -> blocks.Message:
    """An eval's verdict under its title, with the red flag when it dropped beyond noise."""
    evaluated = record.accuracy
    summary = evaluated.summary if evaluated is not None else "no readable eval"
    head = [blocks.section(f"*{blocks.escape(title)}*")]
    if not record.valid:
        head.append(blocks.context(blocks.escape(invalid_words(PLAIN, record.invalid_reason))))
    return blocks.message(f"{title}: {summary}", [*head, *_eval_blocks(r, record)])


def sweep_results_message(r: redis_lib.Redis, run_ids: Sequence[str], sweep_id: Any) -> blocks.Message:
    """The compare table of a sweep's cells."""
    records = store.get_runs(r, run_ids)
    title = f"Sweep {sweep_id}" if sweep_id else "Sweep"
    return blocks.table_message(title, tables.compare_table(records))


def draw_plots(r: redis_lib.Redis, job_id: str, result: Mapping[str, Any], out_dir: Path) -> list[PlotInfo]:
    """The plots of a finished job (:func:`bot.plots.draw_for_result`); none when its runs cannot be read."""
    from bot import plots  # matplotlib loads only when there is something to draw

    try:
        return plots.draw_for_result(r, result, out_dir)
    except BenchbotError as exc:
        log.warning("job %s: no plots, its runs could not be read (%s)", job_id, exc)
        return []


def plot_uploads(infos: Sequence[PlotInfo]) -> list[dict[str, Any]]:
    """Slack file uploads of drawn plots, each with its title and alt text."""
    return [
        {
            "file": str(info.path),
            "filename": Path(info.path).name,
            "title": info.title or Path(info.path).stem,
            "alt_txt": blocks.truncate(info.alt_text or Path(info.path).stem, 1000),
        }
        for info in infos
    ]


def diagnosis_message(data: Mapping[str, Any]) -> blocks.Message:
    """Why a job failed (``failed`` data: ``message`` and ``diagnosis``)."""
    failed = FailedData.from_dict(scrub_secrets(dict(data)))
    return blocks.diagnosis_message(failed.message, failed.diagnosis)


def log_tail_upload(job_id: str, data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The engine's log tail of a failed job as a text file, or None when the diagnosis has none."""
    tail = FailedData.from_dict(scrub_secrets(dict(data))).log_tail
    if not tail:
        return None
    content = "\n".join(str(line) for line in tail)
    return {
        "content": str(scrub_secrets(content)),
        "filename": f"job-{job_id}-log-tail.txt",
        "title": f"log tail of job {job_id}",
    }
