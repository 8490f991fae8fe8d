"""Issue 35 item 3 and notes, without Slack: the ETA of a waiting job from the host's job history, the owner's
notices when a job that waited starts and ends, and notes on a run (scrubbed, capped, exported)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from bot.dispatch import Dispatcher
from bot.job_threads import HeaderState, ThreadEvent, owner_notice, posts
from tests.factories import make_run
from workers import keys
from workers.config import EMBEDDED_TOML, parse_config
from workers.errors import BenchbotError
from workers.jobs import events
from workers.jobs.events import Event
from workers.results import export, notes, store


@pytest.fixture
def dispatcher(redis_client, tmp_path):
    return Dispatcher(parse_config(EMBEDDED_TOML, "test"), redis_client, plots_dir=tmp_path, observe_timeout_s=0.2)


def test_a_waiting_job_gets_an_eta_from_past_jobs_and_queue_shows_it(dispatcher, redis_client):
    first = dispatcher.handle("alice", "C1", "/launch cutlass cudnn")
    assert "eta_s" not in first.data  # nothing ahead: it starts when a worker takes it
    no_history = dispatcher.handle("bob", "C1", "/launch nextn cudnn")
    assert no_history.data["ahead"] == 1 and "eta_s" not in no_history.data  # no job ever ended: no guess
    redis_client.hset(keys.METRICS_DURATIONS, json.dumps(["launch", "sum"]), 600.0)
    redis_client.hset(keys.METRICS_DURATIONS, json.dumps(["launch", "count"]), 4)
    third = dispatcher.handle("carol", "C1", "/launch cutlass cudnn")
    assert third.data["ahead"] == 2 and third.data["eta_s"] == 300  # two launches of 150 s each ahead
    assert "ETA ~5 min" in third.text
    listing = dispatcher.handle("carol", "C1", "/queue")
    line = next(x for x in listing.text.splitlines() if f"#{third.job_id}" in x)
    assert "2 ahead, ETA ~5 min" in line


def _event(job: str, type_: str, data: dict) -> ThreadEvent:
    return ThreadEvent.parse(Event(job=job, type=events.EventType(type_), ts=0.0, data=data, id="1-1"))


def test_the_owner_of_a_job_that_waited_hears_when_it_starts_and_ends():
    waited = HeaderState(user="U0ALICE", channel="C1", host="gpu-1", ahead=2, job_id="7")
    started = owner_notice(_event("7", events.STARTED, {"worker": "w1"}), waited)
    assert started == "<@U0ALICE> your job #7 started on gpu-1"
    assert owner_notice(_event("7", events.FAILED, {"message": "boom"}), waited) == "<@U0ALICE> your job #7 failed"
    in_dm = HeaderState(waited, channel="D0ALICE")
    assert owner_notice(_event("7", events.SUCCEEDED, {"kind": "stop"}), in_dm) == "your job #7 is done"
    assert owner_notice(_event("7", events.CANCELLED, {"by": "U0ALICE"}), waited) is None  # she knows
    at_once = HeaderState(waited, ahead=0)
    assert owner_notice(_event("7", events.STARTED, {"worker": "w1"}), at_once) is None
    names = [p.name for p in posts(_event("7", events.STARTED, {"worker": "w1"}), waited, None)]
    assert names == ["owner"]


def test_notes_are_scrubbed_capped_refused_for_unknown_runs_and_exported(redis_client, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_supersecretvalue123")
    store.save_run(redis_client, make_run("r1", host="gpu-1"))
    notes.add_note(redis_client, "r1", "alice", "used hf_supersecretvalue123 to pull", at=1_700_000_000)
    with pytest.raises(BenchbotError):
        notes.add_note(redis_client, "r404", "alice", "no such run")
    with pytest.raises(BenchbotError):
        notes.add_note(redis_client, "r1", "alice", "   ")
    assert not redis_client.exists(keys.run_notes("r404"))
    for i in range(notes.MAX_NOTES + 5):
        notes.add_note(redis_client, "r1", "bob", "x" * (notes.MAX_NOTE_CHARS + 10) if i == 0 else f"n{i}")
    kept = notes.notes_of(redis_client, "r1")
    assert len(kept) == notes.MAX_NOTES and kept[-1].text == f"n{notes.MAX_NOTES + 4}"
    assert notes.note_counts(redis_client, ["r1"]) == {"r1": notes.MAX_NOTES}
    redis_client.delete(keys.run_notes("r1"))
    notes.add_note(redis_client, "r1", "alice", "used hf_supersecretvalue123 to pull", at=1_700_000_000)
    assert "supersecret" not in notes.notes_of(redis_client, "r1")[0].text
    out = io.StringIO()
    export.export_runs(redis_client, "jsonl", out)
    line = json.loads(out.getvalue())
    assert line["notes"][0]["by"] == "alice" and "supersecret" not in json.dumps(line)
    out = io.StringIO()
    export.export_runs(redis_client, "csv", out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert rows[0]["notes"].startswith("@alice 2023-11-14T22:13:20Z: used")
    assert "notes" in notes.show_run(redis_client, "r1").lower() and "@alice" in notes.show_run(redis_client, "r1")
