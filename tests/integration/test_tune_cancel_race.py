"""A ``/cancel`` that lands while one tune trial ends and the next step is being enqueued ends the tune.

The step is paused (``workers.jobs.faults``' SIGSTOP hook, a real worker on a real Redis) exactly at that
seam: its trial is stored and its between-trials check has passed, the next step not yet queued. The owner
cancels; the step resumes and must not leave a next step queued or running: the tune is cancelled with its
one trial, and a step that a worker had already taken when the tune ended runs no trial when it starts.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from tests.integration.harness import CHANNEL, HOST, BenchbotHost
from tests.integration.test_fence import pause_env, wait_paused
from workers.jobs import events, faults, queue
from workers.jobs.payloads import TunePayload, parse_payload
from workers.tune import state

pytestmark = pytest.mark.slow

TUNE = "/tune moe=cutlass,triton nextn=on,off slo ttft=2s itl=60ms budget=4 in=32 out=8 max=8"


def _record(h: BenchbotHost, tune_id: str) -> state.TuneRecord:
    record = state.load(h.r, tune_id)
    assert record is not None, f"tune {tune_id} has no record"
    return record


@pytest.mark.timeout(300)
def test_a_cancel_while_the_next_step_is_enqueued_ends_the_whole_tune(redis_url: str, tmp_path: Path) -> None:
    marker = tmp_path / "paused.json"
    env = pause_env(faults.TUNE_BEFORE_NEXT_STEP, marker)
    # The lease outlives the pause: the paused step's heartbeat is stopped with it.
    with BenchbotHost(redis_url, tmp_path, workers=1, lease_ttl_s=30, env=env) as h:
        reply = h.run("alice", TUNE)
        assert reply.ok and reply.job_id, reply.text
        tune_id = reply.job_id
        pid = wait_paused(h, marker, tune_id, timeout=200)  # after trial 1, before the next step is queued
        at_seam = _record(h, tune_id)
        assert [t.number for t in at_seam.trials] == [1] and at_seam.current_job == tune_id, at_seam

        cancelled = h.run("alice", f"/cancel {tune_id}")
        assert cancelled.ok and "ends after its current trial" in cancelled.text, cancelled.text
        os.kill(pid, signal.SIGCONT)

        terminal, _ = h.wait(tune_id, timeout=60)
        assert terminal.type == "succeeded", (terminal.data, h.worker_logs())
        assert terminal.data["status"] == state.CANCELLED and terminal.data["next_job"] is None, terminal.data
        final = _record(h, tune_id)
        assert final.status == state.CANCELLED and final.note == "cancel by alice" and final.current_job is None
        assert [t.number for t in final.trials] == [1], "no trial after the cancel"
        assert state.control(h.r, tune_id) is None
        steps = [j for j in queue.list_jobs(h.r, HOST) if j.kind == "tune" and j.job_id != tune_id]
        assert all(j.state == events.CANCELLED for j in steps), [(j.job_id, j.state) for j in steps]
        for step in steps:  # the next step was taken back out of the line: it never started
            seen = list(events.follow(h.r, step.job_id, timeout_s=0.2, block_ms=50))
            assert not any(e.type == events.STARTED for e in seen), [e.type for e in seen]

        # A step a worker had already taken when the tune ended: it starts, sees the tune is over, runs nothing.
        first = parse_payload(queue.job_payload(h.r, tune_id))
        assert isinstance(first, TunePayload)
        stray = replace(first, tune_id=tune_id, step=2)
        queued = queue.enqueue(
            h.r,
            HOST,
            stray.kind,
            stray.to_dict(),
            user="alice",
            channel=CHANNEL,
            summary=state.step_summary(tune_id, 2, final.budget),
            job_timeout_s=h.config.limits.job_timeout_s,
            outcome_kind=stray.outcome_kind,
        )
        late, _ = h.wait(queued.job_id, timeout=60)
        assert late.type == "succeeded", (late.data, h.worker_logs())
        assert late.data["status"] == state.CANCELLED and "ran no trial" in str(late.data["message"]), late.data
        after = _record(h, tune_id)
        assert after.status == state.CANCELLED and [t.number for t in after.trials] == [1], after
