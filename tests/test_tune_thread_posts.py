"""What a tune's thread gets, without Slack or workers: a step that queued the next posts its trial's line
(incumbent, margin, ETA); the last step posts the trials table and the figures, the Pareto front for
``objective=both`` (its points are the front, not every trial); a pause posts the table and no figure."""

from __future__ import annotations

from pathlib import Path

from bot.job_threads import HeaderState, ThreadEvent, ThreadMessage, ThreadTunePlots, posts
from workers.jobs import events
from workers.jobs.events import Event
from workers.tune import report
from workers.tune.outcome import TuneOutcome
from workers.tune.state import ACCURACY_DROP, DONE, TrialRecord

TRIALS = (  # goodput vs tokens per joule: 1 and 3 are the front, 2 is beaten by 3 on both, 4 is wrong
    TrialRecord(1, "moe=cutlass nextn=on", {}, DONE, goodput_rps=2.0, tokens_per_joule=0.5, run_id="r1"),
    TrialRecord(2, "moe=triton nextn=on", {}, DONE, goodput_rps=1.0, tokens_per_joule=0.6, run_id="r2"),
    TrialRecord(3, "moe=triton nextn=off", {}, DONE, goodput_rps=1.5, tokens_per_joule=0.9, run_id="r3"),
    TrialRecord(4, "moe=cutlass nextn=off", {}, ACCURACY_DROP, goodput_rps=3.0, tokens_per_joule=1.0, run_id="r4"),
)


def _succeeded(outcome: TuneOutcome, job: str = "9") -> list[object]:
    event = ThreadEvent.parse(Event(job=job, type=events.SUCCEEDED, ts=0.0, data=outcome.to_dict(), id="1-1"))
    return list(posts(event, HeaderState(job_id=job), None))


def test_a_step_that_queued_the_next_posts_its_trials_line_and_no_figure() -> None:
    line = report.live_line(TRIALS[2], TRIALS[:3], 6, 300.0)
    assert "incumbent: trial 1 (moe=cutlass nextn=on, 2.00 req/s, +33.3 % over the next best); ETA 5 min" in line
    outcome = TuneOutcome("5", "continuing", f"{line}\ntune 5: trial 4 of 6 queued as job 9", next_job="9")
    (message,) = _succeeded(outcome)
    assert isinstance(message, ThreadMessage) and line in message.message["text"]


def test_the_last_step_posts_the_table_and_both_figures_and_the_front_is_the_front(tmp_path: Path) -> None:
    front = report.pareto_front(TRIALS)
    assert [t.number for t in front] == [1, 3], "an accuracy drop is never on the front, a beaten trial neither"
    outcome = TuneOutcome(
        "5",
        "done",
        "tune 5 done (the budget of 4 trials is spent)",
        trials=tuple(t.to_dict() for t in TRIALS),
        table=report.trials_table(TRIALS),
        extra={"why_stopped": "budget", "pareto": [t.to_dict() for t in front]},
    )
    table, figures = _succeeded(outcome)
    assert isinstance(table, ThreadMessage) and "Tune 5: done" in table.message["text"]
    assert all(t.config in table.message["text"] for t in TRIALS) and "accuracy drop" in table.message["text"]
    assert isinstance(figures, ThreadTunePlots)
    uploads = figures.uploads(tmp_path)
    assert [u["filename"] for u in uploads] == ["tune-5-goodput.png", "tune-5-pareto.png"]
    assert all(Path(u["file"]).read_bytes().startswith(b"\x89PNG") for u in uploads)
    assert "2 configs on the Pareto front" in uploads[1]["alt_txt"]
    assert "the incumbent reaches 2.00 req/s" in uploads[0]["alt_txt"], "the wrong config's 3.0 is no incumbent"
    single = TuneOutcome("6", "done", "done", trials=outcome.trials, table=outcome.table)  # objective=goodput
    assert [u["filename"] for u in _succeeded(single)[1].uploads(tmp_path)] == ["tune-6-goodput.png"]  # type: ignore[attr-defined]


def test_a_paused_tune_posts_its_table_and_draws_nothing(tmp_path: Path) -> None:
    paused = TuneOutcome("7", "paused", "tune 7 paused", trials=(TRIALS[0].to_dict(),), table="t")
    table, figures = _succeeded(paused)
    assert isinstance(table, ThreadMessage) and "Tune 7: paused" in table.message["text"]
    assert isinstance(figures, ThreadTunePlots) and figures.uploads(tmp_path) == []
