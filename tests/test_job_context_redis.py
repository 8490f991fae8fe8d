"""A JobContext (in this process, no worker) whose Redis restarts under it.

A private redis-server with AOF that the test stops and starts again on the same socket. A job body
that holds the lease goes on through the outage (a progress line is dropped, not fatal) until its
lease, unrenewable for a whole TTL, is lost; its ending (``failed``, ``lease_lost``) is recorded once
Redis is back instead of being lost with a traceback. A job that was still waiting in line waits for
Redis, takes its place in line again and runs when its turn comes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.util import wait_until
from workers import redis_conn
from workers.errors import LeaseLostError
from workers.jobs import events, lease, waiting_line
from workers.jobs.context import LEASE_LOST_MESSAGE, JobContext

AOF = ["--appendfsync", "always"]


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[tuple[Path, redis.Redis]]:
    directory = tmp_path / "redis"
    sock = redis_conn.start_redis_server(directory, appendonly=True, extra_args=AOF)
    client = redis.Redis.from_url(f"unix://{sock}")  # as every benchbot process connects: no silent retries
    try:
        yield directory, client
    finally:
        client.close()
        redis_conn.stop_redis_server(directory)


def restart_later(directory: Path, seconds: float) -> threading.Timer:
    timer = threading.Timer(
        seconds, redis_conn.start_redis_server, args=(directory,), kwargs={"appendonly": True, "extra_args": AOF}
    )
    timer.start()
    return timer


def test_a_job_holding_the_lease_goes_on_through_an_outage_until_the_lease_is_lost_then_records_it(
    restartable: tuple[Path, redis.Redis], caplog: pytest.LogCaptureFixture
) -> None:
    directory, r = restartable
    ctx = JobContext(redis_client=r, job_id="7", host="h1", user="alice", lease_ttl_s=1.0)
    timer: threading.Timer | None = None
    with pytest.raises(LeaseLostError), ctx:
        redis_conn.stop_redis_server(directory)
        ctx.progress("bench", "measuring")  # dropped while Redis is away: the body goes on
        ctx.check()  # within the TTL the lease still holds and nobody can have cancelled
        wait_until(lambda: ctx.lease is not None and ctx.lease.lost, timeout=5, what="the lease to be lost")
        timer = restart_later(directory, 1.0)  # the ending below must wait for Redis, not be lost
        ctx.check()
    assert timer is not None
    timer.join()
    seen = events.job_events(r, "7")
    assert [e.type for e in seen] == ["started", "failed"]
    assert seen[-1].data["message"] == LEASE_LOST_MESSAGE
    assert seen[-1].data["diagnosis"]["category"] == "lease_lost"
    assert lease.current_holder(r, "h1") is None  # expired during the outage: the host is free
    assert "job 7: Redis is unreachable" in caplog.text and "job 7: Redis is back after" in caplog.text
    assert "Traceback" not in caplog.text


def test_a_job_waiting_in_line_survives_a_redis_restart_and_runs_when_its_turn_comes(
    restartable: tuple[Path, redis.Redis], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 25 item 7: it used to end failed/redis_unreachable ("queue it again"): lost for a restart."""
    directory, r = restartable
    blocker = lease.try_acquire(r, "h1", job="0", user="bob", ttl_s=60)
    assert isinstance(blocker, lease.Lease)
    outcome: list[object] = []

    def body() -> None:
        try:
            with JobContext(redis_client=r, job_id="8", host="h1", user="alice", seq=1, lease_ttl_s=1.0) as ctx:
                outcome.append(ctx.fence)
        except BaseException as exc:  # the test inspects whatever escaped
            outcome.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    wait_until(
        lambda: any(e.data.get("phase") == "waiting" for e in events.job_events(r, "8")),
        what="the job to wait for the host",
    )
    redis_conn.stop_redis_server(directory)
    timer = restart_later(directory, 1.5)
    timer.join()
    wait_until(lambda: "job 8: Redis is back after" in caplog.text, timeout=30, what="the job to see Redis back")
    assert thread.is_alive() and outcome == []  # still waiting its turn
    assert "8" in waiting_line.waiting_jobs(r, "h1")
    blocker.release()
    thread.join(timeout=30)
    assert outcome == [blocker.fence + 1], outcome
    assert [e.type for e in events.job_events(r, "8")][-1] == "succeeded"
    assert "Traceback" not in caplog.text
