"""Issue 35: the thread is where the team talks to benchbot about a result.

A signed ``/launch`` -> a real worker on the simulated host -> its thread on the Slack stand-in; then
mentions and a plain reply in that thread arrive as signed Events API payloads, through bolt, as Slack
sends them (retries with the same event_id, the bot's own posts echoed back as message events).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.cli import main as cli_main
from bot.slack_standin import SlackHarness
from tests.factories import make_run
from tests.integration.harness import HOST, BenchbotHost
from tests.util import wait_until
from workers.jobs import events
from workers.results import notes, store

CHANNEL = "C0TEAM"
ACCESS = '[access]\nadmins = ["boss"]\n[access.commands]\ntag = ["boss"]\n'


def _jobs(h: BenchbotHost) -> list[str]:
    seen: list[str] = []
    for entry_id, fields in h.r.xrange(events.GLOBAL_STREAM):
        job = events.Event.from_entry(entry_id, fields).job
        if job not in seen:
            seen.append(job)
    return seen


def _thread_text(slack: SlackHarness, ts: str) -> str:
    items = slack.standin.thread(CHANNEL, ts)
    return "\n".join(getattr(m, "text", "") + json.dumps(getattr(m, "blocks", [])) for m in items)


def _ended(h: BenchbotHost, job: str) -> str:
    wait_until(lambda: events.is_terminal(h.r, job), timeout=90, what=f"job {job} to end")
    terminal = events.job_events(h.r, job)[-1]
    assert terminal.type == "succeeded", (terminal.data, h.worker_logs())
    return str(terminal.data.get("run_id") or "")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_result_thread_holds_the_whole_discussion(redis_url: str, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    # The CLI's --config sets BENCHBOT_CONFIG for the processes it starts: set here, it ends with the test.
    monkeypatch.setenv("BENCHBOT_CONFIG", "")  # recorded, so the teardown puts back what was (or wasn't) there
    monkeypatch.delenv("BENCHBOT_CONFIG")
    with (
        BenchbotHost(redis_url, tmp_path, workers=1, extra_toml=ACCESS) as h,
        SlackHarness(h.config, redis_url, tmp_path, progress_interval_s=0.2) as slack,
    ):
        assert slack.command("/launch", "nextn cudnn then bench 1,8 in=64 out=16 n=8", user="alice").status == 200
        first = wait_until(lambda: _jobs(h), what="the launch to be queued")[0]
        first_run = _ended(h, first)
        ts = wait_until(lambda: slack.standin.top_level(CHANNEL), what="the job's header")[0].ts
        wait_until(lambda: f"Bench {first_run}" in _thread_text(slack, ts), timeout=30, what="the first results")

        # again out=512: the same bench (levels, in=, n=) with out= changed, its story in this thread
        slack.say_in_thread("again out=512", thread_ts=ts)
        second = wait_until(lambda: _jobs(h)[1:], what="the second job")[0]
        talk_key = f"benchbot:slack:talk:{CHANNEL}:{ts}"
        payload = json.loads(wait_until(lambda: h.r.hget(talk_key, second), what="the job's place in the thread"))
        assert payload["bench"]["output_len"] == 512 and payload["bench"]["input_len"] == 64
        assert payload["bench"]["levels"] == [1, 8] and payload["bench"]["num_requests"] == 8
        second_run = _ended(h, second)
        wait_until(lambda: f"Bench {second_run}" in _thread_text(slack, ts), timeout=30, what="the second results")

        # compare baseline: this thread's newest run against the host's baseline, table and PNGs in the thread
        store.save_run(h.r, make_run("r900", host=HOST, levels=(1, 8)))
        store.tag_run(h.r, "r900", "baseline", by="boss", admin=True)
        slack.say_in_thread("compare baseline", thread_ts=ts)
        wait_until(
            lambda: (
                "r900" in _thread_text(slack, ts)
                and second_run in _thread_text(slack, ts)
                and slack.standin.calls_to("files.completeUploadExternal")[-1].body.get("thread_ts") == ts
            ),
            timeout=30,
            what="the comparison in the thread",
        )

        # tag baseline: refused for a member, done for an admin; both answers in the thread
        slack.say_in_thread("tag baseline", thread_ts=ts, user="alice")
        wait_until(lambda: "only boss may tag" in _thread_text(slack, ts), what="the refusal")
        assert store.baseline_for(h.r, HOST).id == "r900"
        slack.say_in_thread("tag baseline", thread_ts=ts, user="boss")
        wait_until(lambda: f"{second_run} is now tagged baseline" in _thread_text(slack, ts), what="the tag")
        assert store.baseline_for(h.r, HOST).id == second_run

        # a plain reply is a note on the thread's run; its retry (same event_id) is not a second note
        note_ts, note_event = slack.say_in_thread("cudnn wins at 8, token=xoxb-9-secret", thread_ts=ts, mention=False)
        wait_until(lambda: notes.notes_of(h.r, second_run), what="the note")
        jobs_before = len(_jobs(h))
        again_ts, again_event = slack.say_in_thread("again out=8", thread_ts=ts)
        wait_until(lambda: len(_jobs(h)) == jobs_before + 1, what="the third job")
        retries = ((note_event, note_ts, "cudnn wins", False), (again_event, again_ts, "again out=8", True))
        for event_id, message_ts, text, mention in retries:
            body = {
                "type": "app_mention" if mention else "message",
                "user": "alice",
                "text": text,
                "ts": message_ts,
                "channel": CHANNEL,
                "thread_ts": ts,
            }
            assert slack.event(body, event_id=event_id, retry_num=1).status == 200
        wait_until(lambda: slack.app.benchbot.duplicates >= 2, what="both retries to be dropped")

        # the bot's own posts, handed back as Slack's message events, trigger nothing
        talk = slack.app.benchbot_events
        handled, received = talk.handled, talk.received
        posted = len(slack.standin.bot_messages())
        assert slack.echo_bot_messages() >= 8  # benchbot's own: bolt drops them before any listener
        # another bot's posts (the same texts: "@alice: bench ... done", tables) reach the listener and stop there
        echoed = slack.echo_bot_messages(bot_id="B0OTHERBOT", user="U0OTHERBOT")
        wait_until(lambda: talk.received == received + echoed, what="the other bot's messages to be processed")

        slack.say_in_thread("notes", thread_ts=ts)
        wait_until(lambda: "Notes on " + second_run in _thread_text(slack, ts), what="the notes answer")
        assert slack.app.benchbot_events.handled == handled + 1  # only the notes mention did anything
        assert len(_jobs(h)) == jobs_before + 1  # no retry, no echo started a job
        assert len(notes.notes_of(h.r, second_run)) == 1
        note = notes.notes_of(h.r, second_run)[0]
        assert note.by == "alice" and "cudnn wins at 8" in note.text and "xoxb-9-secret" not in note.text
        assert len(slack.standin.bot_messages()) > posted

        # ONE thread: every message the bot posted, except the launch's header, hangs under it
        assert [m.ts for m in slack.standin.top_level(CHANNEL)] == [ts]
        assert {m.thread_ts for m in slack.standin.bot_messages() if m.ts != ts} == {ts}

        # runs show lists the note; /runs counts it
        assert cli_main(["--config", str(h.config_path), "runs", "show", second_run]) == 0
        shown = capsys.readouterr().out
        assert "cudnn wins at 8" in shown and "@alice" in shown
        listing = h.dispatcher.handle_command("alice", CHANNEL, "runs", "")
        assert "notes" in listing.text.splitlines()[0]
        _ended(h, _jobs(h)[-1])  # the short "again out=8" ends before the worker is stopped
