"""The eval's fence gate end to end: a stale eval resumed after another job took the host asks nothing.

Its own file (and host): the pause hook must be in the environment of every worker serving the host, so
no worker of another test's host may share the queue. Same method as tests/integration/test_fence.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import BenchbotHost
from tests.integration.test_eval_jobs import FAST_SIM, N
from tests.integration.test_fence import (
    engine_requests,
    pause_env,
    queue_job,
    resume_and_wait_exit,
    rq_failure,
    wait_paused,
)
from workers.jobs import faults
from workers.results import store

pytestmark = pytest.mark.slow


def test_an_eval_paused_past_its_lease_sends_no_question_to_the_next_jobs_engine(
    redis_url: str, tmp_path: Path
) -> None:
    """The fence gate runs before every eval request: a stale eval resumed after another job launched its
    own engine asks it nothing and stores nothing."""
    marker = tmp_path / "paused.json"
    env = pause_env(faults.BEFORE_EVAL_REQUEST, marker)
    with BenchbotHost(redis_url, tmp_path, workers=2, env=env, sim_env=FAST_SIM) as h:
        stale = queue_job(h, "alice", f"/launch cutlass cudnn then eval n={N}")
        pid = wait_paused(h, marker, stale)
        fresh = queue_job(h, "bob", "/launch cutlass cudnn --enable-metrics")
        terminal, _ = h.wait(fresh, timeout=90)
        assert terminal.type == "succeeded", terminal.data
        before = engine_requests(h.port)

        resume_and_wait_exit(pid)

        assert "LeaseLostError" in rq_failure(h, stale)
        assert engine_requests(h.port) == before, "the stale eval sent questions to the new job's engine"
        assert store.list_runs(h.r, n=100) == []  # the stale eval stored nothing
