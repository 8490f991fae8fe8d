"""Issue 35 without a worker: signed events through bolt (HTTP and Socket Mode), against a real Redis and the
Slack stand-in: mentions in and outside a job's thread, edits, why, cancel, notes, the Home tab."""

from __future__ import annotations

import json
import threading

import pytest

from bot.job_threads import get_thread
from bot.slack_standin import APP_TOKEN, BOT_TOKEN, SlackHarness, SlackStandIn, SocketModeStandIn
from bot.thread_talk import command_text, remember
from tests.factories import make_run
from tests.util import wait_until
from workers.config import EMBEDDED_TOML, parse_config
from workers.jobs import events
from workers.results import notes, store

CHANNEL = "C0TEAM"


@pytest.fixture
def harness(redis_url, redis_client, tmp_path, state_dir):
    with SlackHarness(parse_config(EMBEDDED_TOML, "test"), redis_url, tmp_path, notifier=False) as h:
        yield h


def _queued(r) -> list[str]:
    return list(dict.fromkeys(events.Event.from_entry(i, f).job for i, f in r.xrange(events.GLOBAL_STREAM)))


def _thread_texts(h: SlackHarness, ts: str) -> list[str]:
    return [m.text + json.dumps(getattr(m, "blocks", [])) for m in h.standin.thread(CHANNEL, ts)]


def _job_thread(h: SlackHarness, r) -> tuple[str, str]:
    """A queued launch+bench and its header, as /launch leaves them."""
    h.command("/launch", "cutlass cudnn then bench 1,8", user="alice")
    header = wait_until(lambda: h.standin.top_level(CHANNEL), what="the header")[0]
    job = _queued(r)[0]
    wait_until(lambda: r.exists(f"benchbot:slack:talk:{CHANNEL}:{header.ts}"), what="the thread's record")
    return job, header.ts


def test_command_text_knows_a_command_from_talk():
    assert command_text("<@U0BENCHBOT> again out=512", "U0BENCHBOT") == "again out=512"
    assert command_text("benchbot: compare baseline", "U0BENCHBOT") == "compare baseline"
    assert command_text("<@U0SOMEONE> what do you think?", "U0BENCHBOT") is None
    assert command_text("looks good to me", "U0BENCHBOT") is None


def test_url_verification_and_a_mention_outside_a_thread_get_the_slash_command(harness):
    body = json.dumps({"type": "url_verification", "token": "t", "challenge": "ch4llenge"})
    from bot.slack_standin import signed_headers

    answer = harness.post(body, signed_headers(body, content_type="application/json"))
    assert answer.status == 200 and "ch4llenge" in answer.body
    ts, _ = harness.say_in_thread("again out=512")  # a mention in the channel, in no job's thread
    reply = wait_until(lambda: harness.standin.thread(CHANNEL, ts), what="the answer under the mention")[0]
    assert "not a benchbot job's thread" in reply.text and "Use the slash command instead: /bench " in reply.text


def test_cancel_and_why_in_a_thread_and_an_edit_changes_nothing(harness, redis_client):
    job, ts = _job_thread(harness, redis_client)
    # an edit of a message in the thread (and its deletion) arrive as subtypes: nothing is queued or cancelled
    for subtype in ("message_changed", "message_deleted"):
        edit = {"type": "message", "subtype": subtype, "channel": CHANNEL, "ts": "1.2", "thread_ts": ts}
        edit["message"] = {"type": "message", "user": "alice", "text": "<@U0BENCHBOT> cancel", "ts": "1.1"}
        assert harness.event(edit).status == 200
    harness.say_in_thread("help", thread_ts=ts, user="alice")
    wait_until(lambda: any("again [opts]" in t for t in _thread_texts(harness, ts)), what="the thread help")
    assert not events.is_terminal(redis_client, job) and _queued(redis_client) == [job]

    harness.say_in_thread("cancel", thread_ts=ts, user="bob")  # not bob's job
    wait_until(lambda: any("<@bob>" in t for t in _thread_texts(harness, ts)), what="bob's refusal")
    assert not events.is_terminal(redis_client, job)
    harness.say_in_thread("cancel", thread_ts=ts, user="alice")
    wait_until(lambda: events.is_terminal(redis_client, job), what="the job to be cancelled")

    diagnosis = {"category": "unsupported_arch", "summary": "kernel built for SM100 only", "log_tail": ["boom SM120"]}
    remember(redis_client, CHANNEL, ts, "991")
    events.publish(redis_client, "991", events.FAILED, {"message": "launch failed", "diagnosis": diagnosis})
    harness.say_in_thread("why", thread_ts=ts)
    why = wait_until(lambda: [t for t in _thread_texts(harness, ts) if "SM100 only" in t], what="the diagnosis")[0]
    assert "unsupported_arch" in why and "boom SM120" in why


def test_notes_are_kept_scrubbed_and_listed_and_the_home_tab_is_published(harness, redis_client):
    job, ts = _job_thread(harness, redis_client)
    talk, received = harness.app.benchbot_events, harness.app.benchbot_events.received
    harness.say_in_thread("a remark before any run", thread_ts=ts, mention=False)
    # events are handled in a pool: read after the run below exists, the remark would become its note
    wait_until(lambda: talk.received > received, what="the remark before any run to be read")
    store.save_run(redis_client, make_run("r7", host="sim", levels=(1, 8)))
    events.publish(redis_client, job, events.SUCCEEDED, {"kind": "bench", "run_id": "r7"})
    harness.say_in_thread("r7 looks right", thread_ts=ts, mention=False, user="bob")
    wait_until(lambda: notes.notes_of(redis_client, "r7"), what="the note")
    harness.say_in_thread("notes", thread_ts=ts)
    listed = wait_until(lambda: [t for t in _thread_texts(harness, ts) if "Notes on r7" in t], what="notes")[0]
    assert "@bob: r7 looks right" in listed and "before any run" not in listed
    assert [n.by for n in notes.notes_of(redis_client, "r7")] == ["bob"]
    for i in range(6):  # a long answer: its message shows the head, the whole text comes as a file in the thread
        notes.add_note(redis_client, "r7", "carol", f"long remark {i} " + "x" * 1500)
    harness.say_in_thread("notes", thread_ts=ts)
    upload = wait_until(lambda: harness.standin.calls_to("files.completeUploadExternal"), what="the notes file")[0]
    assert upload.body["thread_ts"] == ts
    whole = next(f for f in harness.standin.files.values() if f.completed)
    assert b"long remark 5" in whole.data and b"@bob: r7 looks right" in whole.data

    harness.command("/launch", "nextn cudnn", user="carol")
    wait_until(lambda: len(_queued(redis_client)) == 2, what="carol's job")
    home = {"type": "app_home_opened", "user": "carol", "channel": "D0CAROL", "tab": "home"}
    assert harness.event(home).status == 200
    view = wait_until(lambda: harness.standin.views.get("carol"), what="carol's Home view")
    text = json.dumps(view)
    assert view["type"] == "home" and "sim" in text and "Your jobs" in text
    buttons = [e for b in view["blocks"] for e in b.get("elements", []) if e.get("type") == "button"]
    assert [(b["action_id"], b["value"]) for b in buttons] == [("cancel_job", _queued(redis_client)[1])]


def test_socket_mode_delivers_a_mention_and_acks_it(redis_url, redis_client, monkeypatch, state_dir):
    from bot.slack_app import run_slack

    config = parse_config(EMBEDDED_TOML, "test")
    with SlackStandIn() as standin, SocketModeStandIn() as socket_mode:
        standin.socket_mode_url = socket_mode.url
        monkeypatch.setenv("SLACK_BOT_TOKEN", BOT_TOKEN)
        monkeypatch.setenv("SLACK_APP_TOKEN", APP_TOKEN)
        monkeypatch.setenv("SLACK_API_URL", standin.base_url)
        stop = threading.Event()
        runner = threading.Thread(target=lambda: run_slack(config, redis_url, notify=False, stop=stop), daemon=True)
        runner.start()
        try:
            socket_mode.wait_connected()
            ts = standin.user_message(CHANNEL, "alice", "<@U0BENCHBOT> help")
            mention = {
                "type": "app_mention",
                "user": "alice",
                "text": "<@U0BENCHBOT> help",
                "ts": ts,
                "channel": CHANNEL,
            }
            payload = {"type": "event_callback", "event_id": "EvSOCKET1", "team_id": "T0STANDIN", "event": mention}
            envelope = socket_mode.push("events_api", payload)
            assert socket_mode.wait_ack(envelope)["envelope_id"] == envelope
            socket_mode.push("events_api", payload, retry_attempt=1)  # Slack's retry: the same event_id
            wait_until(lambda: standin.thread(CHANNEL, ts), what="the answer in the mention's thread")
            wait_until(lambda: len(socket_mode.acks) == 2, what="the retry's ack")
            assert len(standin.thread(CHANNEL, ts)) == 1
        finally:
            stop.set()
            runner.join(10)


def test_a_job_asked_for_in_a_dm_between_people_gets_its_thread_in_the_owners_dm(harness, redis_client):
    harness.command("/launch", "cutlass cudnn", user="alice", channel="D0ALICEBOB")
    header = wait_until(lambda: harness.standin.top_level("D0BOTALICE"), what="the header in alice's DM")[0]
    assert "launch cutlass cudnn" in header.text and not harness.standin.top_level("D0ALICEBOB")
    assert harness.standin.calls_to("conversations.open")[0].body["users"] == "alice"
    job = _queued(redis_client)[0]
    # the record is written once Slack answered the post, a moment after the header shows: poll for it
    thread = wait_until(lambda: get_thread(redis_client, job), what="the thread's record")
    assert thread["channel"] == "D0BOTALICE"
