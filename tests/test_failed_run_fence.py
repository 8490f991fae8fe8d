"""A failed cell or trial is stored only while the job still holds its host (workers/jobs/failed_run.py).

The long soak found a sweep job reported "worker died" (its lease lapsed while its worker was paused) whose
process, resumed, stored a failed run afterwards. Here the lease is taken away under a real JobContext on the
real Redis: the store is refused with LeaseLostError and no run appears; while the lease holds, it is stored.
"""

from __future__ import annotations

import pytest
import redis

from tests.util import wait_until
from workers.errors import LeaseLostError
from workers.jobs import lease
from workers.jobs.context import JobContext
from workers.jobs.failed_run import store_failed_run
from workers.results import store

DIAGNOSIS = {"category": "launch_failed", "summary": "the server exited"}


def _store(ctx: JobContext, label: str) -> str:
    record = store_failed_run(
        ctx, host="h1", label=label, params={}, diagnosis=DIAGNOSIS, sweep_id="s1", kind="sweep-cell"
    )
    return record.id


def test_a_failed_run_is_stored_while_the_lease_holds_and_refused_once_it_is_lost(
    redis_client: redis.Redis,
) -> None:
    ctx = JobContext(redis_client=redis_client, job_id="7", host="h1", user="alice", lease_ttl_s=1.0)
    with pytest.raises(LeaseLostError), ctx:
        held = _store(ctx, "while held")
        redis_client.delete(lease.lease_key("h1"))  # what a lapse past the TTL (and the reaper) leaves
        wait_until(lambda: ctx.lease is not None and ctx.lease.lost, timeout=10, what="the lease to be lost")
        _store(ctx, "after the lease was lost")
    runs = store.list_runs(redis_client, n=10)
    assert [run.id for run in runs] == [held]
    assert [run.label for run in runs] == ["while held"]
