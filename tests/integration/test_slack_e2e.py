"""Issue 6, the whole way: a signed Slack slash command -> bolt app -> Redis queue -> a real worker ->
the simulated host -> the notifier -> one header edited in place and one thread, on the Slack stand-in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.slack_standin import SlackHarness, UploadedFile
from tests.integration.harness import BenchbotHost
from tests.util import wait_until
from workers.jobs import events

CHANNEL = "C0TEAM"


def _first_job(h: BenchbotHost) -> str | None:
    entries = h.r.xrange(events.GLOBAL_STREAM, count=1)
    return events.Event.from_entry(*entries[0]).job if entries else None


@pytest.mark.slow
def test_signed_launch_then_bench_ends_as_one_header_and_one_thread_with_config_table_and_png(
    redis_url: str, tmp_path: Path
) -> None:
    with (
        BenchbotHost(redis_url, tmp_path, workers=1) as h,
        SlackHarness(h.config, redis_url, tmp_path, progress_interval_s=0.2) as slack,
    ):
        answer = slack.command(
            "/launch", "cutlass cudnn then bench 1,4 in=64 out=16 n=8", user="alice", channel=CHANNEL
        )
        assert answer.status == 200, answer
        job = wait_until(lambda: _first_job(h), timeout=10, what="the job to be queued")
        wait_until(lambda: events.is_terminal(h.r, job), timeout=60, what="the job to end")
        terminal = events.job_events(h.r, job)[-1]
        assert terminal.type == "succeeded", (terminal.data, h.worker_logs())
        run_id = terminal.data["run_id"]

        headers = wait_until(lambda: slack.standin.top_level(CHANNEL), timeout=10, what="the header")
        ts = headers[0].ts

        def finished_thread() -> list:
            items = slack.standin.thread(CHANNEL, ts)
            files = [i for i in items if isinstance(i, UploadedFile)]
            done = "done" in slack.standin.messages[(CHANNEL, ts)].text
            return items if done and files and any(f"Bench {run_id}" in getattr(i, "text", "") for i in items) else []

        thread = wait_until(finished_thread, timeout=30, what="the thread with the bench table and the plot")

        # ONE header, edited in place to its final state
        assert len(slack.standin.top_level(CHANNEL)) == 1
        head = slack.standin.messages[(CHANNEL, ts)]
        assert head.edits and f"#{job} done" in head.text and "launch cutlass cudnn" in head.text
        # ONE thread: every reply anywhere in the channel hangs under that header
        replies = [m for m in slack.standin.messages.values() if m.thread_ts is not None]
        assert replies and {m.thread_ts for m in replies} == {ts}

        texts = [json.dumps(m.blocks) + m.text for m in thread if not isinstance(m, UploadedFile)]
        config = next(t for t in texts if "Verified config" in t)
        assert "flashinfer_cutlass MoE" in config and "flashinfer_cudnn FP4" in config
        table = next(t for t in texts if f"Bench {run_id}" in t)
        assert "conc" in table and "tok/s" in table
        assert texts.index(config) < texts.index(table)  # the verified config comes before its numbers

        pngs = [f for f in thread if isinstance(f, UploadedFile)]
        assert pngs and all(f.data.startswith(b"\x89PNG") and f.filename.endswith(".png") for f in pngs)
        uploads = slack.standin.calls_to("files.completeUploadExternal")
        assert uploads and {c.body.get("thread_ts") for c in uploads} == {ts}
        assert slack.standin.calls_to("files.getUploadURLExternal")  # the files_upload_v2 flow, not files.upload
        assert not slack.standin.calls_to("files.upload")
