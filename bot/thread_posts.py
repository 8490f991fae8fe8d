"""What a job's Slack thread gets, decided in one place: besides the header, the observed config, the result
table, the plots, the diagnosis of a failure and its log tail.

:func:`posts` decides from three values handed in: the event (parsed once, and scrubbed of secrets there:
:class:`bot.job_threads.ThreadEvent`), the header state before it (whether the config is in the thread
already) and the runs its result names (read once by the notifier: :func:`workers.results.store.result_runs`).
Each post is built from those values alone: nothing here reads Redis. The notifier (:mod:`bot.notifier`)
only delivers the posts, in order, and retries each on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from bot import blocks
from bot.job_threads import HeaderState, ThreadEvent
from bot.sentences import PLAIN, invalid_words
from workers.jobs import events
from workers.jobs.events import FailedData
from workers.jobs.outcomes import LaunchOutcome, ReadyData, SweepOutcome
from workers.results import tables
from workers.results.record import RunRecord
from workers.results.store import ResultRuns
from workers.secrets import scrub_secrets

if TYPE_CHECKING:
    from bot.plot_kit import PlotInfo
    from workers.evaluation.runner import EvalRun

log = logging.getLogger(__name__)


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


Post = ThreadMessage | ThreadFiles | ThreadPlots


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
    elif isinstance(typed, FailedData):
        out.append(ThreadMessage("diagnosis", blocks.diagnosis_message(typed.message, typed.diagnosis)))
        upload = log_tail_upload(job_id, typed)
        if upload is not None:
            out.append(ThreadFiles("log", (upload,)))
    return out


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
