"""``/tune``'s fairness controls end to end with a real worker: an admin pauses and resumes a tune, its owner
cancels it, and ``/queue`` and ``/status`` show where it stands between and during its trials.

One tune of four configs (``moe=cutlass,triton nextn=on,off``, small requests) runs two trials in all:
paused after the first, resumed by the admin, cancelled during the second. No confirmation runs (a
cancelled tune keeps its trials and names no winner), so the whole story takes two trials' time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import HOST, BenchbotHost
from tests.util import wait_until
from workers.jobs import events, queue
from workers.results import store
from workers.tune import state

pytestmark = pytest.mark.slow

TUNE = "/tune moe=cutlass,triton nextn=on,off slo ttft=2s itl=60ms budget=4 in=32 out=8 max=8"
ADMINS = '[access]\nadmins = ["root"]\n'


def _record(h: BenchbotHost, tune_id: str) -> state.TuneRecord:
    record = state.load(h.r, tune_id)
    assert record is not None, f"tune {tune_id} has no record"
    return record


def _unfinished_tune_jobs(h: BenchbotHost) -> list[queue.JobInfo]:
    return [j for j in queue.list_jobs(h.r, HOST) if j.kind == "tune" and j.state not in events.TERMINAL]


@pytest.mark.timeout(300)
def test_an_admin_pauses_and_resumes_a_tune_and_its_owners_cancel_keeps_every_trial(
    redis_url: str, tmp_path: Path
) -> None:
    with BenchbotHost(redis_url, tmp_path, workers=1, lease_ttl_s=10, extra_toml=ADMINS) as h:
        reply = h.run("alice", TUNE)
        assert reply.ok and reply.job_id, reply.text
        tune_id = reply.job_id
        wait_until(  # pause and cancel are read between trials: ask once the first trial is under way
            lambda: any(
                e.type == events.PROGRESS and str(e.data.get("message", "")).startswith("trial 1 of 4")
                for e in events.follow(h.r, tune_id, timeout_s=0.2, block_ms=50)
            ),
            timeout=120,
            what="the tune's first trial to start",
        )

        # A teammate who is neither its owner nor an admin is refused in one sentence; nothing changes.
        refused = h.run("carol", f"/tune pause {tune_id}")
        assert not refused.ok and "only they or an admin" in refused.text and "\n" not in refused.text, refused.text
        assert state.control(h.r, tune_id) is None

        paused = h.run("root", f"/tune pause {tune_id}")
        assert paused.ok and "pauses after its current trial" in paused.text, paused.text
        record = wait_until(
            lambda: (rec := _record(h, tune_id)).status == state.PAUSED and rec,
            timeout=150,
            what="the tune to pause after its first trial",
        )
        assert len(record.trials) == 1 and record.current_job is None
        assert _unfinished_tune_jobs(h) == [], "a paused tune queues no next trial"
        listed = h.run("bob", "/queue")
        assert f"tune {tune_id} on {HOST} (@alice): paused by root after 1 of 4 trials" in listed.text, listed.text
        assert f"/tune resume {tune_id}" in listed.text and "incumbent: trial 1" in listed.text

        resumed = h.run("root", f"/tune resume {tune_id}")
        assert resumed.ok and resumed.job_id, resumed.text
        step = resumed.job_id
        wait_until(
            lambda: _record(h, tune_id).status == state.RUNNING and _record(h, tune_id).current_job == step,
            timeout=60,
            what="the resumed tune's second trial to start",
        )
        for command in ("/queue", "/status"):
            shown = h.run("bob", command)
            assert f"tune {tune_id} on {HOST} (@alice): trial 2 of 4, running as #{step}" in shown.text, shown.text
            assert "incumbent: trial 1 (" in shown.text and shown.data["tunes"], shown.text

        cancelled = h.run("alice", f"/cancel {tune_id}")
        assert cancelled.ok and "ends after its current trial" in cancelled.text, cancelled.text
        terminal, _ = h.wait(step, timeout=150)
        assert terminal.type == "succeeded", (terminal.data, h.worker_logs())
        assert terminal.data["status"] == state.CANCELLED and terminal.data["next_job"] is None, terminal.data
        final = _record(h, tune_id)
        assert final.status == state.CANCELLED and final.note == "cancel by alice"
        assert [t.number for t in final.trials] == [1, 2], "the trial in flight ends; every result is kept"
        assert all(t.run_id and store.get_run(h.r, t.run_id) for t in final.trials), "each trial is a stored run"
        assert _unfinished_tune_jobs(h) == []
        assert f"tune {tune_id}" not in h.run("bob", "/queue").text, "an ended tune leaves /queue"
