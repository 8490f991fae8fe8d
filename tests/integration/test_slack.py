"""The Slack front end end to end: signed requests over HTTP to the real bolt app, a real Redis, and
the local Slack stand-in recording what the app posted."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from pathlib import Path

import pytest
import redis

from bot.commands import COMMANDS
from bot.job_threads import get_thread
from bot.slack_app import MANIFEST_PATH, render_manifest
from bot.slack_standin import (
    APP_TOKEN,
    BOT_TOKEN,
    SIGNING_SECRET,
    SlackHarness,
    SlackStandIn,
    SocketModeStandIn,
    signed_headers,
)
from tests.factories import make_run
from tests.util import wait_until
from workers.config import EMBEDDED_TOML, parse_config
from workers.jobs import events
from workers.results import store

ACCESS_TOML = EMBEDDED_TOML.replace('default_host = "sim"', 'default_host = "sim"\n[access]\nusers = ["alice"]\n', 1)


@pytest.fixture
def config():
    return parse_config(EMBEDDED_TOML, "test")


@pytest.fixture
def harness(config, redis_url, redis_client, tmp_path, state_dir):
    with SlackHarness(config, redis_url, tmp_path, notifier=False) as h:
        yield h


NO_WORKER = "no worker is serving sim: its jobs wait until one starts (`benchbot worker --host sim`)"


def _queued_events(r: redis.Redis) -> list[events.Event]:
    return [
        events.Event.from_entry(i, f)
        for i, f in r.xrange(events.GLOBAL_STREAM)
        if json.loads(f[b"event"])["type"] == events.QUEUED
    ]


def _buttons(message_blocks: list[dict]) -> dict[str, str]:
    out = {}
    for block in message_blocks:
        for element in block.get("elements", []):
            if element.get("type") == "button":
                out[element["action_id"]] = element["value"]
    return out


# --------------------------------------------------------------------------- ack and signatures


def test_help_is_acked_at_once_and_answered_ephemeral(harness):
    answer = harness.command("/help")
    assert answer.status == 200
    assert answer.elapsed_s < 3.0
    hook = wait_until(lambda: harness.webhooks(), what="the help answer on response_url")[0]
    assert hook.body["response_type"] == "ephemeral"
    assert "benchbot commands" in hook.body["text"]
    assert "/launch" in json.dumps(hook.body["blocks"])
    assert not harness.standin.calls_to("chat.postMessage")  # nothing in the channel


def test_unsigned_wrongly_signed_and_stale_requests_get_401(harness):
    body = harness.command_body("/help")
    assert harness.post(body, {"Content-Type": "application/x-www-form-urlencoded"}).status == 401
    wrong = signed_headers(body, secret="not-the-secret")
    assert harness.post(body, wrong).status == 401
    stale = signed_headers(body, timestamp=int(time.time()) - 6 * 60)
    assert harness.post(body, stale).status == 401
    tampered = signed_headers(body)
    assert harness.post(body.replace("help", "stop"), tampered).status == 401
    # and a correctly signed request still works, so the 401s were about the signatures
    assert harness.post(body, signed_headers(body)).status == 200
    wait_until(lambda: len(harness.webhooks()) == 1, what="the one accepted request's answer")


def test_access_refusal_is_ephemeral_and_enqueues_nothing(redis_url, redis_client, tmp_path, state_dir):
    config = parse_config(ACCESS_TOML, "access-test")
    with SlackHarness(config, redis_url, tmp_path, notifier=False) as h:
        answer = h.command("/launch", "cutlass cudnn", user="bob")
        assert answer.status == 200 and answer.elapsed_s < 3.0
        hook = wait_until(lambda: h.webhooks(), what="the refusal")[0]
        assert hook.body["response_type"] == "ephemeral"
        assert "access list" in hook.body["text"]
        assert _queued_events(redis_client) == []
        assert not h.standin.calls_to("chat.postMessage")


def test_bad_input_is_refused_ephemeral(harness, redis_client):
    harness.command("/launch", "cutlass; rm -rf /")
    hook = wait_until(lambda: harness.webhooks(), what="the refusal")[0]
    assert hook.body["response_type"] == "ephemeral"
    assert "never runs shell commands" in hook.body["text"]
    assert _queued_events(redis_client) == []


# --------------------------------------------------------------------------- jobs


def test_queued_job_posts_exactly_one_header_with_cancel_and_retries_do_not_double(harness, redis_client):
    trigger = "1234567.1.retryme"
    answer = harness.command("/launch", "nextn cudnn", trigger_id=trigger)
    assert answer.status == 200 and answer.elapsed_s < 3.0
    header_call = wait_until(lambda: harness.standin.calls_to("chat.postMessage"), what="the header")[0]
    # Slack retries a delivery it thinks timed out: same trigger_id, X-Slack-Retry-Num set
    assert harness.command("/launch", "nextn cudnn", trigger_id=trigger, retry_num=1).status == 200
    assert harness.command("/launch", "nextn cudnn", trigger_id=trigger, retry_num=2).status == 200
    wait_until(lambda: harness.app.benchbot.duplicates == 2, what="both retries to be recognised")
    queued = _queued_events(redis_client)
    assert len(queued) == 1
    job_id = queued[0].job
    header = harness.standin.top_level("C0TEAM")
    assert len(header) == 1
    assert header_call.body["channel"] == "C0TEAM"
    assert header[0].text == f"@alice: launch nextn cudnn on sim, queued #{job_id}, next in line"
    assert _buttons(header[0].blocks) == {"cancel_job": job_id}
    thread = wait_until(lambda: get_thread(redis_client, job_id), what="the thread record")
    assert (thread["channel"], thread["ts"]) == ("C0TEAM", header[0].ts)
    # A queued job answers in the channel; only that no worker serves the host is said privately (16.3).
    notes = wait_until(lambda: harness.webhooks(), what="the no-worker note")
    assert [(n.body["response_type"], n.body["text"]) for n in notes] == [("ephemeral", NO_WORKER)]
    assert len(harness.standin.calls_to("chat.postMessage")) == 1


def test_bench_this_double_click_creates_one_job_and_cancel_answers_privately(harness, redis_client):
    harness.command("/launch", "cutlass cudnn")
    wait_until(lambda: harness.standin.top_level(), what="the first header")
    job_id = _queued_events(redis_client)[0].job
    header = harness.standin.top_level()[0]
    # Bench this on the (still queued) launch, clicked twice: two deliveries, one bench job
    harness.click("bench_this", job_id, message_ts=header.ts)
    harness.click("bench_this", job_id, message_ts=header.ts)
    wait_until(lambda: len(harness.standin.top_level()) == 2, what="the bench's header")
    wait_until(lambda: harness.app.benchbot.duplicates == 1, what="the second click to be dropped")
    kinds = sorted(e.data["kind"] for e in _queued_events(redis_client))
    assert kinds == ["bench", "launch"]
    bench_header = harness.standin.top_level()[1]
    assert bench_header.text.startswith("@alice: bench 1,8,32")
    assert "cancel_job" in _buttons(bench_header.blocks)
    # Cancel answers privately; the header is the notifier's to edit
    harness.click("cancel_job", job_id, message_ts=header.ts)
    hook = wait_until(lambda: [h for h in harness.webhooks() if h.body["text"] != NO_WORKER], what="the cancel answer")[
        0
    ]
    assert hook.body["response_type"] == "ephemeral"
    assert job_id in hook.body["text"]
    cancelled = wait_until(
        lambda: [e for e in events.job_events(redis_client, job_id) if e.type == events.CANCELLED],
        what="the cancelled event",
    )
    assert cancelled[0].data.get("by") == "alice"
    assert len(harness.standin.top_level()) == 2


def test_rerun_double_click_creates_one_job(harness, redis_client):
    harness.command("/stop")
    header = wait_until(lambda: harness.standin.top_level(), what="the first header")[0]
    job_id = _queued_events(redis_client)[0].job
    harness.click("rerun_job", job_id, message_ts=header.ts)
    harness.click("rerun_job", job_id, message_ts=header.ts)
    wait_until(lambda: harness.app.benchbot.duplicates == 1, what="the second click to be dropped")
    wait_until(lambda: len(harness.standin.top_level()) == 2, what="the re-run's header")
    assert [e.data["kind"] for e in _queued_events(redis_client)] == ["stop", "stop"]
    # Nothing private but the note that no worker serves the host (16.3).
    assert {n.body["text"] for n in harness.webhooks()} <= {NO_WORKER}


def test_compare_posts_table_in_channel_and_pngs_in_its_thread(harness, redis_client):
    for run_id, speed in (("r1", 1.0), ("r2", 1.3)):
        store.save_run(redis_client, make_run(run_id, speed=speed, host="sim"))
    harness.command("/compare", "r1 r2")
    upload = wait_until(
        lambda: harness.standin.calls_to("files.completeUploadExternal"), timeout=30, what="the plots upload"
    )[0]
    answer = harness.standin.top_level("C0TEAM")
    assert len(answer) == 1
    assert "r1" in answer[0].text and "r2" in answer[0].text
    assert upload.body["thread_ts"] == answer[0].ts
    files = harness.standin.thread("C0TEAM", answer[0].ts)
    assert files and all(f.data.startswith(b"\x89PNG") for f in files)


# --------------------------------------------------------------------------- Socket Mode


def test_socket_mode_session_receives_a_slash_command_and_acks_it(
    config, redis_url, redis_client, monkeypatch, state_dir
):
    from bot.slack_app import run_slack

    with SlackStandIn() as standin, SocketModeStandIn() as socket_mode:
        standin.socket_mode_url = socket_mode.url
        monkeypatch.setenv("SLACK_BOT_TOKEN", BOT_TOKEN)
        monkeypatch.setenv("SLACK_APP_TOKEN", APP_TOKEN)
        monkeypatch.delenv("SLACK_SIGNING_SECRET", raising=False)
        monkeypatch.setenv("SLACK_API_URL", standin.base_url)
        stop = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            try:
                run_slack(config, redis_url, notify=False, stop=stop)
            except BaseException as exc:
                failure.append(exc)

        runner = threading.Thread(target=serve, daemon=True)
        runner.start()
        try:
            socket_mode.wait_connected()
            assert standin.calls_to("apps.connections.open")
            envelope = socket_mode.push(
                "slash_commands",
                {
                    "command": "/help",
                    "text": "launch",
                    "user_id": "alice",
                    "user_name": "alice",
                    "channel_id": "C0TEAM",
                    "team_id": "T0STANDIN",
                    "api_app_id": "A0STANDIN",
                    "response_url": standin.webhook_url(),
                    "trigger_id": "99.1.socket",
                },
            )
            ack = socket_mode.wait_ack(envelope)
            assert ack["envelope_id"] == envelope
            hook = wait_until(lambda: standin.calls_to("webhook"), what="the help answer")[0]
            assert hook.body["response_type"] == "ephemeral"
            assert "/launch <presets" in hook.body["text"]
        finally:
            stop.set()
            runner.join(10)
        assert not runner.is_alive()
        assert failure == []


# --------------------------------------------------------------------------- secrets and manifest


def test_tokens_and_signing_secret_never_reach_the_logs(harness, caplog):
    caplog.set_level(logging.DEBUG)
    harness.command("/help")
    harness.command("/launch", "cutlass")
    wait_until(lambda: harness.standin.calls_to("chat.postMessage") and harness.webhooks(), what="answers")
    text = caplog.text
    assert "slack" in text.lower()  # the logs did record the requests ...
    for secret in (BOT_TOKEN, SIGNING_SECRET, BOT_TOKEN.split("-", 1)[1]):
        assert secret not in text  # ... but never a secret


def test_manifest_lists_exactly_the_grammars_commands():
    text = MANIFEST_PATH.read_text()
    assert text == render_manifest(), "deploy/slack-manifest.yml is stale: regenerate it from render_manifest()"
    commands = re.findall(r"^\s*- command: /(\w+)$", text, re.MULTILINE)
    assert sorted(commands) == sorted(COMMANDS)
    assert len(commands) == len(set(commands))
    hints = re.findall(r'^\s*usage_hint: "(.*)"$', text, re.MULTILINE)
    assert len(hints) == len(commands)
    for command in ("launch", "bench", "eval"):  # a group is taken where a host is (issue 38)
        assert "[on HOST|GROUP]" in hints[commands.index(command)], command
    for scope in ("commands", "chat:write", "files:write"):
        assert re.search(rf"^\s*- {re.escape(scope)}$", text, re.MULTILINE)
    assert re.search(r"^\s*socket_mode_enabled: true$", text, re.MULTILINE)
    assert re.search(r"interactivity:\n\s*is_enabled: true", text)


def test_docs_name_the_env_vars():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "slack.md").read_text()
    for name in ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN", "SLACK_API_URL", "slack-manifest.yml"):
        assert name in doc


def test_app_and_notifier_together_cancel_edits_the_jobs_one_header(
    config, redis_url, redis_client, tmp_path, state_dir
):
    with SlackHarness(config, redis_url, tmp_path, notifier=True) as h:
        h.command("/launch", "cutlass cudnn")
        header = wait_until(lambda: h.standin.top_level(), what="the header")[0]
        job_id = _queued_events(redis_client)[0].job
        h.click("cancel_job", job_id, message_ts=header.ts)
        wait_until(
            lambda: "cancelled" in h.standin.messages[("C0TEAM", header.ts)].text,
            what="the notifier to edit the header",
        )
        edited = h.standin.messages[("C0TEAM", header.ts)]
        assert edited.text == f"@alice: launch cutlass cudnn on sim, #{job_id} cancelled"
        assert "cancelled by @alice" in json.dumps(edited.blocks)
        assert _buttons(edited.blocks) == {"rerun_job": job_id}
        assert len(h.standin.top_level()) == 1
