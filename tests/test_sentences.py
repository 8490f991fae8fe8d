"""One wording for the terminal and Slack: ``bot/render.py`` and ``bot/blocks.py`` say the same sentences."""

from __future__ import annotations

import json
from dataclasses import replace

from bot import blocks, render
from bot.job_threads import HeaderState
from tests.factories import make_config
from workers.engines.args import ArgDiff
from workers.jobs import events
from workers.jobs.events import Event
from workers.jobs.outcomes import ReadyData
from workers.observation import LaunchedBy, RunningConfig


def _config(**changes: object) -> RunningConfig:
    return replace(RunningConfig.from_dict(make_config(host="gpu-1")), **changes)


def _blocks_text(message: blocks.Message) -> str:
    return json.dumps(message["blocks"], ensure_ascii=False)


def test_the_queued_line_is_the_same_in_text_and_in_the_slack_header() -> None:
    data = {"user": "alice", "summary": "launch nextn cudnn", "host": "gpu-1", "job_id": "17", "ahead": 2}
    assert render.queued_text(data) == "@alice: launch nextn cudnn on gpu-1, queued #17, 2 ahead"
    assert blocks.header_line({**data, "phase": "queued"}) == render.queued_text(data)
    assert blocks.header_line({**data, "ahead": 0, "phase": "queued"}) == render.queued_text({**data, "ahead": 0})


def test_a_diff_from_the_ask_reads_the_same_in_both() -> None:
    diff = ArgDiff("--mem-fraction-static", "0.9", 0.88)
    ready = ReadyData(config=_config(), diff=(diff,))
    text = render.event_text(Event(job="7", type=events.READY, ts=1.0, data=ready.to_dict()))
    assert "! --mem-fraction-static: asked 0.9, server reports 0.88" in text
    slack = _blocks_text(blocks.config_message(ready.config, ready.diff))
    assert "`--mem-fraction-static`: asked 0.9, server reports 0.88" in slack


def test_an_unmanaged_server_reads_the_same_in_both() -> None:
    config = _config(managed=False)
    assert "UNMANAGED: benchbot did not start this server" in render.config_lines(config)
    assert "*UNMANAGED*: benchbot did not start this server" in _blocks_text(blocks.config_message(config))


def test_who_launched_a_server_reads_the_same_in_both() -> None:
    """Slack used to print the launch record's dict here; both now name the person and the job."""
    config = _config(managed=True, launched_by=LaunchedBy(user="alice", job="7", at=None))
    assert render.config_lines(config)[0].startswith("launched by @alice (job 7) ")
    slack = _blocks_text(blocks.config_message(config))
    assert "launched by @alice (job 7)" in slack and "'user'" not in slack


def test_a_cancel_and_a_diagnosis_read_the_same_in_both() -> None:
    cancelled = render.event_text(Event(job="7", type=events.CANCELLED, ts=1.0, data={"by": "bob"}))
    assert cancelled == "[#7] cancelled by @bob"
    header = blocks.header_message({"job_id": "7", "user": "alice", "phase": "cancelled", "cancelled_by": "bob"})
    assert "cancelled by @bob" in _blocks_text(header)
    done = "the engine was stopped (pid 42)"  # issue 36 item 10: what the job did before the cancel landed
    after = render.event_text(Event(job="7", type=events.CANCELLED, ts=1.0, data={"by": "bob", "done": done}))
    assert after == f"[#7] cancelled by @bob after {done}"
    state: HeaderState = {"job_id": "7", "user": "alice", "phase": "cancelled", "cancelled_by": "bob"}
    assert f"cancelled by @bob after {done}" in _blocks_text(blocks.header_message({**state, "cancelled_after": done}))
    diagnosis = {"category": "oom", "summary": "the KV cache does not fit"}
    assert render.diagnosis_lines(diagnosis)[0] == "diagnosis: oom: the KV cache does not fit"
    assert "*oom*: the KV cache does not fit" in _blocks_text(blocks.diagnosis_message("", diagnosis))
