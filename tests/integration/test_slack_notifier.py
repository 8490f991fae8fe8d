"""The notifier end to end: events published with workers.jobs.events, a real Redis consumer group, the
real WebClient talking to the local Slack stand-in (which can answer 429 and 500)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bot.follow import plots_for_result
from bot.job_threads import get_thread, record_thread
from bot.notifier import STEPS_KEY, Notifier
from bot.slack_app import make_client
from bot.slack_standin import BOT_TOKEN, UPLOAD, Message, SlackStandIn, UploadedFile
from tests.factories import make_config, make_run
from tests.util import wait_until
from workers.jobs import events
from workers.results import store

CHANNEL = "C0TEAM"


@pytest.fixture
def standin() -> Iterator[SlackStandIn]:
    with SlackStandIn() as s:
        yield s


@contextlib.contextmanager
def running(r: redis.Redis, standin: SlackStandIn, tmp_path, **kwargs) -> Iterator[Notifier]:
    kwargs.setdefault("consumer", "n1")
    kwargs.setdefault("progress_interval_s", 0.2)
    kwargs.setdefault("thread_wait_s", 5.0)
    n = Notifier(r, make_client(BOT_TOKEN, standin.base_url), plots_dir=tmp_path / "plots", block_ms=50, **kwargs)
    thread = n.start()
    try:
        yield n
    finally:
        n.stop()
    # a notifier left running would go on reading as a second consumer of the next test's stream
    assert not thread.is_alive(), "the notifier did not stop within stop()'s join"


def open_thread(r: redis.Redis, standin: SlackStandIn, job: str, summary: str = "launch cutlass cudnn") -> str:
    """What the Slack app does when it queues a job: post the header and record it."""
    client = make_client(BOT_TOKEN, standin.base_url)
    ts = client.chat_postMessage(channel=CHANNEL, text=f"@alice: {summary}")["ts"]
    record_thread(
        r,
        job,
        CHANNEL,
        ts,
        {
            "job_id": job,
            "user": "alice",
            "channel": CHANNEL,
            "host": "gpu-1",
            "kind": summary.split()[0],
            "summary": summary,
            "position": 1,
            "ahead": 0,
        },
    )
    return ts


def pending(r: redis.Redis) -> int:
    return int(r.xpending(events.GLOBAL_STREAM, events.DEFAULT_GROUP)["pending"])


def all_delivered(r: redis.Redis) -> bool:
    """Every published event was read by the group and acknowledged."""
    last = r.xrevrange(events.GLOBAL_STREAM, count=1)
    group = next(g for g in r.xinfo_groups(events.GLOBAL_STREAM) if g["name"] == events.DEFAULT_GROUP.encode())
    return bool(last) and group["last-delivered-id"] == last[0][0] and pending(r) == 0


def describe(items: list[Message | UploadedFile]) -> list[str]:
    """A thread as short labels: the first words of each message, the name of each file."""
    out = []
    for item in items:
        out.append(f"file:{item.filename}" if isinstance(item, UploadedFile) else " ".join(item.text.split()[:2]))
    return out


def header(standin: SlackStandIn, ts: str) -> Message:
    return standin.messages[(CHANNEL, ts)]


def buttons(message: Message) -> dict[str, str]:
    return {
        e["action_id"]: e["value"] for b in message.blocks for e in b.get("elements", []) if e.get("type") == "button"
    }


def publish_launch_start(r: redis.Redis, job: str) -> None:
    events.publish(
        r,
        job,
        events.QUEUED,
        {
            "position": 1,
            "ahead": 0,
            "summary": "launch cutlass cudnn",
            "user": "alice",
            "channel": CHANNEL,
            "host": "gpu-1",
            "kind": "launch",
        },
    )
    events.publish(r, job, events.STARTED, {"worker": "w1", "fence": 1})
    events.publish(r, job, events.PROGRESS, {"phase": "launch", "message": "waiting for /health"})
    events.publish(
        r,
        job,
        events.READY,
        {
            "config": make_config(host="gpu-1"),
            "diff": [{"arg": "--mem-fraction-static", "requested": "0.9", "observed": "0.88"}],
            "replaced": None,
        },
    )


def launch_bench_result(run_id: str) -> dict:
    """A ``launch ... then bench`` result as the worker writes it (``LaunchOutcome.to_dict``)."""
    return {
        "kind": "launch+bench",
        "config": make_config(host="gpu-1"),
        "diff": [],
        "bench": {"run_id": run_id, "valid": True, "invalid_reason": None, "table": ""},
        "run_id": run_id,
    }


EXPECTED_THREAD = ["Verified config", "Bench r1:", "file:r1-throughput.png", "file:r1-latency.png"]


# --------------------------------------------------------------------------- the happy path


@pytest.mark.parametrize("kind", ["bench", "sweep"])
def test_a_threads_plots_are_the_ones_the_cli_draws_for_the_result(redis_client, standin, tmp_path, kind):
    """The notifier and ``follow``/the console pick a finished job's plots in one place
    (:func:`bot.plots.draw_for_result`): same files, same bytes (drawing is deterministic)."""
    events.ensure_group(redis_client)
    if kind == "sweep":
        for run_id, speed in (("r1", 1.0), ("r2", 1.4)):
            store.save_run(redis_client, make_run(run_id, kind="sweep-cell", sweep_id="s1", speed=speed))
        result = {"kind": "sweep", "sweep_id": "s1", "run_ids": ["r1", "r2"], "cells": []}
    else:
        store.save_run(redis_client, make_run("r1", tags=("baseline",)))
        store.save_run(redis_client, make_run("r2", speed=1.4))
        result = {"kind": "bench", "run_id": "r2"}
    ts = open_thread(redis_client, standin, "9", summary=f"{kind} cutlass cudnn")
    with running(redis_client, standin, tmp_path):
        events.publish(redis_client, "9", events.SUCCEEDED, result)
        wait_until(lambda: all_delivered(redis_client), timeout=30, what="the result delivered")
    posted = {f.filename: f.data for f in standin.thread(CHANNEL, ts) if isinstance(f, UploadedFile)}
    drawn = {Path(p).name: Path(p).read_bytes() for p in plots_for_result(redis_client, result, tmp_path / "cli")}
    assert len(drawn) == (3 if kind == "sweep" else 2)
    assert posted == drawn


def test_job_becomes_one_header_edited_in_place_and_ordered_thread_replies(redis_client, standin, tmp_path):
    events.ensure_group(redis_client)
    store.save_run(redis_client, make_run("r1", host="gpu-1"))
    ts = open_thread(redis_client, standin, "7")
    with running(redis_client, standin, tmp_path):
        publish_launch_start(redis_client, "7")
        events.publish(redis_client, "7", events.PROGRESS, {"phase": "bench", "message": "level 8"})
        events.publish(redis_client, "7", events.SUCCEEDED, launch_bench_result("r1"))
        wait_until(lambda: len(standin.thread(CHANNEL, ts)) == 4, timeout=30, what="the whole thread")
        wait_until(lambda: all_delivered(redis_client), what="every event acked")
    assert len(standin.top_level()) == 1  # one header, never a second one
    final = header(standin, ts)
    assert final.text == "@alice: launch cutlass cudnn on gpu-1, #7 done"
    assert final.edits, "the header was edited in place"
    assert any("queued" in e["text"] or "running" in json.dumps(e["blocks"]) for e in final.edits)
    assert buttons(final) == {"rerun_job": "7", "compare_baseline": "r1"}
    ready_edit = next(e for e in final.edits if ":large_green_circle:" in json.dumps(e["blocks"]))
    assert "Bench this" in json.dumps(ready_edit["blocks"]) and "Cancel" in json.dumps(ready_edit["blocks"])
    thread = standin.thread(CHANNEL, ts)
    assert describe(thread) == EXPECTED_THREAD
    config_reply = json.dumps(thread[0].blocks)
    assert "--mem-fraction-static" in config_reply and "0.88" in config_reply  # the diff from what was asked
    assert "NVIDIA H200" in config_reply
    assert all(f.data.startswith(b"\x89PNG") for f in thread[2:])
    uploads = standin.calls_to("files.completeUploadExternal")
    assert [c.body["thread_ts"] for c in uploads] == [ts]
    assert redis_client.hlen(STEPS_KEY) == 0
    assert get_thread(redis_client, "7")["state"]["phase"] == "done"


def test_failure_posts_diagnosis_and_log_tail_file_without_secrets(redis_client, standin, tmp_path):
    events.ensure_group(redis_client)
    ts = open_thread(redis_client, standin, "8")
    tail = ["loading weights", "Authorization: Bearer xoxb-123456789-leakedtoken", "torch.OutOfMemoryError: CUDA"]
    with running(redis_client, standin, tmp_path):
        events.publish(redis_client, "8", events.STARTED, {"worker": "w1", "fence": 2})
        events.publish(
            redis_client,
            "8",
            events.FAILED,
            {
                "message": "the engine exited during start-up",
                "diagnosis": {
                    "category": "oom",
                    "summary": "out of GPU memory while loading",
                    "evidence_line": "torch.OutOfMemoryError: CUDA out of memory",
                    "log_tail": tail,
                },
            },
        )
        wait_until(lambda: len(standin.thread(CHANNEL, ts)) == 2, what="diagnosis and log")
        wait_until(lambda: all_delivered(redis_client), what="every event acked")
    diagnosis, log_file = standin.thread(CHANNEL, ts)
    assert isinstance(diagnosis, Message) and diagnosis.text.startswith("Failed (oom): out of GPU memory")
    assert isinstance(log_file, UploadedFile) and log_file.filename == "job-8-log-tail.txt"
    assert b"torch.OutOfMemoryError" in log_file.data
    assert b"leakedtoken" not in log_file.data
    final = header(standin, ts)
    assert "#8 failed" in final.text and "out of GPU memory" in json.dumps(final.blocks)
    assert buttons(final) == {"rerun_job": "8"}


# --------------------------------------------------------------------------- faults and restarts


def test_restart_and_injected_429_500_lose_and_double_nothing(redis_client, standin, tmp_path):
    events.ensure_group(redis_client)
    store.save_run(redis_client, make_run("r1", host="gpu-1"))
    ts = open_thread(redis_client, standin, "9")
    with running(redis_client, standin, tmp_path, consumer="n1"):
        publish_launch_start(redis_client, "9")
        wait_until(lambda: describe(standin.thread(CHANNEL, ts)) == EXPECTED_THREAD[:1], what="the config reply")
        # the next header edit is rate limited: n1 reads the event, cannot deliver it, and is stopped
        standin.fail_next("chat.update", 1, status=429, retry_after=30)
        events.publish(redis_client, "9", events.SUCCEEDED, launch_bench_result("r1"))
        wait_until(lambda: standin.calls_to("chat.update", ok_only=False)[-1].status == 429, what="the 429")
    assert pending(redis_client) == 1  # read, not delivered, so not acked
    # Slack keeps failing for a while after the restart: every kind of step meets a failure once
    standin.fail_next("chat.update", 1, status=500)
    standin.fail_next("chat.postMessage", 2, status=500)
    standin.fail_next(UPLOAD, 1, status=500)
    standin.fail_next("files.completeUploadExternal", 1, status=429, retry_after=0.2)
    with running(redis_client, standin, tmp_path, consumer="n1"):  # the same notifier, restarted
        wait_until(
            lambda: len(standin.thread(CHANNEL, ts)) >= 4 and all_delivered(redis_client),
            timeout=30,
            what="the rest of the thread",
        )
    assert describe(standin.thread(CHANNEL, ts)) == EXPECTED_THREAD
    assert len(standin.top_level()) == 1
    assert header(standin, ts).text.endswith("#9 done")
    assert redis_client.hlen(STEPS_KEY) == 0
    failed = [c for c in standin.calls if c.status != 200]
    assert [c.status for c in failed] == [429, 500, 500, 500, 500, 429]


def test_a_dead_consumers_pending_events_are_claimed_and_resume_after_the_accepted_steps(
    redis_client, standin, tmp_path
):
    events.ensure_group(redis_client)
    ts = open_thread(redis_client, standin, "10")
    with running(redis_client, standin, tmp_path, consumer="dead"):
        events.publish(redis_client, "10", events.STARTED, {"worker": "w1", "fence": 3})
        wait_until(lambda: all_delivered(redis_client), what="started delivered")
        # the header edit of `failed` is accepted, the diagnosis reply keeps failing: a step is left
        # (it fails every retry, so however slow this box is the consumer dies with it pending)
        standin.fail_next("chat.postMessage", 10_000, status=500)
        events.publish(redis_client, "10", events.FAILED, {"message": "boom", "diagnosis": None})
        wait_until(
            lambda: standin.calls_to("chat.postMessage", ok_only=False)[-1].status == 500, what="the failing reply"
        )
    standin.clear_failures()
    assert pending(redis_client) == 1
    updates_before = len(standin.calls_to("chat.update"))
    assert redis_client.hget(STEPS_KEY, events.job_events(redis_client, "10")[-1].id) == b"1"
    with running(redis_client, standin, tmp_path, consumer="heir", claim_idle_ms=0):
        wait_until(lambda: all_delivered(redis_client), what="the heir to deliver the claimed event")
    assert describe(standin.thread(CHANNEL, ts)) == ["Failed: boom"]
    assert len(standin.calls_to("chat.update")) == updates_before  # the accepted header edit was not redone
    assert "#10 failed" in header(standin, ts).text


def test_a_rate_limited_job_does_not_hold_up_another_jobs_thread(redis_client, standin, tmp_path):
    events.ensure_group(redis_client)
    ts_a = open_thread(redis_client, standin, "11")
    ts_b = open_thread(redis_client, standin, "12")
    standin.fail_next("chat.update", 1, status=429, retry_after=1)
    with running(redis_client, standin, tmp_path):
        events.publish(redis_client, "11", events.STARTED, {"worker": "w1", "fence": 4})
        events.publish(redis_client, "12", events.STARTED, {"worker": "w2", "fence": 5})
        wait_until(lambda: all_delivered(redis_client), what="both delivered")
    updates = standin.calls_to("chat.update")
    when = {c.body["ts"]: c.at for c in updates}
    first_429 = standin.calls_to("chat.update", ok_only=False)[0]
    assert first_429.status == 429 and first_429.body["ts"] == ts_a
    assert when[ts_b] < when[ts_a]  # B went through while A waited out its Retry-After
    assert when[ts_a] - first_429.at >= 0.99


def test_progress_edits_are_throttled_and_coalesced(redis_client, standin, tmp_path):
    events.ensure_group(redis_client)
    ts = open_thread(redis_client, standin, "13")
    for i in range(25):
        events.publish(redis_client, "13", events.PROGRESS, {"phase": "launch", "message": f"step {i}"})
    with running(redis_client, standin, tmp_path, progress_interval_s=0.5):
        wait_until(lambda: all_delivered(redis_client), what="all progress acked")
        wait_until(lambda: "step 24" in json.dumps(header(standin, ts).blocks), what="the last progress shown")
    assert 1 <= len(standin.calls_to("chat.update")) <= 3


def test_console_jobs_are_skipped_or_posted_to_the_default_channel(redis_client, standin, tmp_path):
    events.ensure_group(redis_client)
    with running(redis_client, standin, tmp_path, thread_wait_s=0.2):
        events.publish(
            redis_client,
            "20",
            events.QUEUED,
            {"user": "carol", "channel": "console", "host": "sim", "kind": "stop", "summary": "stop the engine"},
        )
        events.publish(redis_client, "20", events.SUCCEEDED, {"kind": "stop", "stopped": True})
        wait_until(lambda: all_delivered(redis_client), what="the console job's events acked")
    assert standin.calls == []
    with running(redis_client, standin, tmp_path, thread_wait_s=0.2, default_channel="C0DEFAULT"):
        events.publish(
            redis_client,
            "21",
            events.QUEUED,
            {"user": "carol", "channel": "console", "host": "sim", "kind": "stop", "summary": "stop the engine"},
        )
        events.publish(redis_client, "21", events.SUCCEEDED, {"kind": "stop", "stopped": True})
        wait_until(lambda: all_delivered(redis_client), what="the console job's events delivered")
    posted = standin.top_level("C0DEFAULT")
    assert len(posted) == 1
    assert posted[0].text == "@carol: stop the engine on sim, #21 done"
    assert get_thread(redis_client, "21")["ts"] == posted[0].ts
