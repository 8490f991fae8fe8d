"""A tune's Slack thread (the local stand-in) tells its story: every later step's header replies in the tune's
thread, each trial's line names the incumbent, and at the end the trials table, the goodput-per-trial plot
and (``objective=both``) the Pareto front of goodput against tokens per joule are uploaded there.

The tune is given a ``time=`` budget instead of a trial count (so every kept config is a candidate) and
stops on the clock: its owner pauses it during trial 1, the 5 s run out meanwhile (a trial takes longer),
and the resumed step, queued without Slack like every later step, finds the time up and confirms trial 1:
one trial, so the figures come at the cost of one trial and one confirmation.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bot.slack_standin import SlackHarness, UploadedFile
from bot.slack_standin.web_api import Message
from tests.integration.harness import BenchbotHost
from tests.util import wait_until
from workers.jobs import events
from workers.tune import state

pytestmark = pytest.mark.slow

CHANNEL = "C0TUNE"
TUNE = "moe=cutlass,triton nextn=on,off slo ttft=2s itl=60ms objective=both time=5s in=32 out=8 max=8"


def _first_job(h: BenchbotHost) -> str | None:
    entries = h.r.xrange(events.GLOBAL_STREAM, count=1)
    return events.Event.from_entry(*entries[0]).job if entries else None


def _ended(h: BenchbotHost, job_id: str) -> events.Event:
    wait_until(lambda: events.is_terminal(h.r, job_id), timeout=200, what=f"job {job_id} to end")
    terminal = events.job_events(h.r, job_id)[-1]
    assert terminal.type == "succeeded", (terminal.data, h.worker_logs())
    return terminal


@pytest.mark.timeout(300)
def test_a_tune_on_the_clock_posts_its_steps_table_goodput_plot_and_pareto_front_in_its_thread(
    redis_url: str, tmp_path: Path
) -> None:
    with (
        BenchbotHost(redis_url, tmp_path, workers=1, lease_ttl_s=10) as h,
        SlackHarness(h.config, redis_url, tmp_path, progress_interval_s=0.2) as slack,
    ):
        answer = slack.command("/tune", TUNE, user="alice", channel=CHANNEL)
        assert answer.status == 200, answer
        tune_id = str(wait_until(lambda: _first_job(h), timeout=10, what="the tune to be queued"))
        wait_until(
            lambda: any(
                e.type == events.PROGRESS and str(e.data.get("message", "")).startswith("trial 1 of 4")
                for e in events.follow(h.r, tune_id, timeout_s=0.2, block_ms=50)
            ),
            timeout=120,
            what="the tune's first trial to start",
        )
        # Its owner pauses it during trial 1; the 5 s of time= run out meanwhile (a trial takes longer).
        assert h.run("alice", f"/tune pause {tune_id}").ok
        assert _ended(h, tune_id).data["status"] == state.PAUSED
        record = state.require(h.r, tune_id)
        assert record.budget == 4 and record.deadline is not None, "time= makes every kept config a candidate"
        wait_until(lambda: time.time() > (record.deadline or 0), timeout=10, what="time= to run out")
        resumed = h.run("alice", f"/tune resume {tune_id}")  # queued without Slack: its thread is the tune's
        assert resumed.ok and resumed.job_id, resumed.text
        data = _ended(h, resumed.job_id).data
        assert data["status"] == state.FINISHED and data["why_stopped"] == "time= is up", data
        trials = data["trials"]
        assert len(trials) == 1 and len(data["confirmed"]) == 1, "the clock stopped it before trial 2"
        assert data["pareto"] and {t["status"] for t in data["pareto"]} == {"done"}, data["pareto"]

        # One header in the channel: the tune's. The resumed step's header is a reply in its thread.
        (header,) = wait_until(lambda: slack.standin.top_level(CHANNEL), timeout=10, what="the tune's header")
        names = {f"tune-{tune_id}-goodput.png", f"tune-{tune_id}-pareto.png"}

        def figures() -> list[UploadedFile]:
            items = slack.standin.thread(CHANNEL, header.ts)
            return [i for i in items if isinstance(i, UploadedFile) and i.filename in names]

        pngs = wait_until(lambda: len(figures()) == 2 and figures(), timeout=60, what="the tune's two figures")
        assert all(p.data.startswith(b"\x89PNG") and p.thread_ts == header.ts for p in pngs)
        replies = [i for i in slack.standin.thread(CHANNEL, header.ts) if isinstance(i, Message)]
        texts = "\n".join(m.text for m in replies)
        assert f"Tune {tune_id}: paused" in texts and f"Tune {tune_id}: done" in texts, texts
        assert trials[0]["config"] in texts and "finalist trial 1" in texts, texts  # its verdict, winner or not
        assert any(f"tune {tune_id}: trial 2 of 4 (resumed)" in m.text for m in replies), texts
        assert len(slack.standin.top_level(CHANNEL)) == 1, [m.text for m in slack.standin.top_level(CHANNEL)]
