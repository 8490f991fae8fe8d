"""The effect journal: each fenced actuator operation is written to the host's stream with its fence and lock window.

A real local transport, the real actuator and a real Redis: a claim, a spawn and a signal under fence 3 are
journaled (job, fence, outcome, pid, the host's fence-lock window inside the worker's span), a stale
fence's refused signal is journaled as ``stale``, and an operation without a fence (``descendants``) is not.
The soak's checker reads this stream (``bench/history_check.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import redis

from workers import redis_conn
from workers.errors import StaleFenceError
from workers.host.local import LocalTransport
from workers.host.transport import HostFence
from workers.jobs.effects import EffectJournal, host_effects


def test_fenced_operations_are_journaled_with_their_fence_and_window(redis_client: redis.Redis, tmp_path: Path) -> None:
    async def scenario() -> int:
        async with LocalTransport(name="box") as t:
            t.on_effect = EffectJournal(redis_client, "box", "7")
            fence = HostFence.for_port(str(tmp_path), 4242, 3)
            await t.claim_host(fence)
            spawned = await t.spawn_engine(
                [sys.executable, "-c", "import time; time.sleep(60)"], log_path=str(tmp_path / "e.log"), fence=fence
            )
            try:
                await t.process_descendants(spawned.pid, spawned.start_ticks)  # read-only: not journaled
                t.on_effect = EffectJournal(redis_client, "box", "6")
                with pytest.raises(StaleFenceError):
                    await t.signal_process(
                        spawned.pid, spawned.start_ticks, "TERM", fence=HostFence.for_port(str(tmp_path), 4242, 2)
                    )
                t.on_effect = EffectJournal(redis_client, "box", "7")
                result = await t.signal_process(spawned.pid, spawned.start_ticks, "KILL", group=True, fence=fence)
                assert result.outcome == "sent"
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(spawned.pgid, signal.SIGKILL)
            return spawned.pid

    pid = asyncio.run(scenario())
    journal = host_effects(redis_client, "box")
    assert [(e["job"], e["op"], e["fence"], e["outcome"]) for e in journal] == [
        ("7", "claim", 3, "ok"),
        ("7", "spawn", 3, "asked"),  # before the actuator ran: an engine outlives a job killed mid-spawn
        ("7", "spawn", 3, "ok"),
        ("6", "signal", 2, "stale"),
        ("7", "signal", 3, "sent"),
    ]
    assert journal[2]["pid"] == pid and journal[4]["pid"] == pid and journal[4]["signal"] == "KILL"
    assert "pid" not in journal[1] and journal[1]["began"] == journal[2]["began"]  # the ask and its answer pair up
    for e in journal:
        if e["outcome"] in ("stale", "asked"):
            assert "window" not in e  # refused before or without an action: no lock window reported as one
            continue
        began, ended, (taken, released) = e["began"], e["ended"], e["window"]
        assert began <= taken <= released <= ended, e
    assert not {"argv", "env"} & (set(journal[1]) | set(journal[2]))  # what it ran is not kept (secrets live there)


def test_records_kept_through_a_redis_outage_are_written_when_the_job_ends(tmp_path: Path) -> None:
    """The long soak's three lost spawns: the records were pending when the job ended, and one try was all."""
    directory = tmp_path / "redis"
    r = redis.Redis(unix_socket_path=str(redis_conn.start_redis_server(directory, appendonly=True)))
    try:
        journal = EffectJournal(r, "box", "9")
        journal({"op": "spawn", "fence": 4, "outcome": "asked", "began": 1.0, "ended": 1.0})  # written
        redis_conn.stop_redis_server(directory)
        journal({"op": "spawn", "fence": 4, "outcome": "ok", "pid": 4242, "began": 1.0, "ended": 1.2})  # kept

        async def end_of_job() -> bool:
            drained = asyncio.ensure_future(journal.drain(wait_s=60))
            deadline = time.monotonic() + 30
            while journal.failed_flushes < 2:  # the end of the job is waiting for Redis
                assert time.monotonic() < deadline and not drained.done(), "the drain did not wait for Redis"
                await asyncio.sleep(0.05)
            await asyncio.to_thread(redis_conn.start_redis_server, directory, appendonly=True)
            return await drained

        assert asyncio.run(end_of_job()) is True
        assert [(e["outcome"], e.get("pid")) for e in host_effects(r, "box")] == [("asked", None), ("ok", 4242)]
    finally:
        redis_conn.stop_redis_server(directory)
