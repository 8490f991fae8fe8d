"""A host whose wall clock is stepped (the soak's ``clock_step`` fault): leases and the effect journal stay right.

The host's programs run with ``bench/stepped_clock`` first on ``PYTHONPATH`` and an offset file, as the soak's
simulated hosts do: their ``time.time()`` jumps an hour back or ahead, their boot clock does not. The lease's
deadline reaches the host on its boot clock, so the host refuses an action past it and allows one before it
whatever its wall clock says; the journal's lock window, on the boot clock as ``window_boot``, stays inside the
worker's span while the wall-clock ``window`` is off by the step; and the checker orders windows by the boot clock.
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

from bench import history_check
from bench.soak import STEPPED_CLOCK_DIR, boot_to_wall
from workers.errors import StaleFenceError
from workers.host.local import LocalTransport
from workers.host.transport import HostFence
from workers.jobs.effects import EffectJournal, host_effects

ROOT = Path(__file__).resolve().parents[1]
HOUR = 3600.0


def test_a_stepped_host_clock_moves_neither_the_lease_deadline_nor_the_journal_order(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    offset = tmp_path / "clock"
    offset.write_text(f"{HOUR}\n")
    env = {"PYTHONPATH": f"{STEPPED_CLOCK_DIR}:{ROOT}", "BENCHBOT_SIM_CLOCK_FILE": str(offset)}

    async def scenario() -> tuple[float, int]:
        async with LocalTransport(name="box", env=env) as t:
            seen = await t.run([sys.executable, "-c", "import time; print(time.time())"], timeout=30)
            t.on_effect = EffectJournal(redis_client, "box", "7")
            live = HostFence.for_port(str(tmp_path), 4242, 3, deadline=lambda: time.monotonic() + 60)
            await t.claim_host(live)
            spawned = await t.spawn_engine(
                [sys.executable, "-c", "import time; time.sleep(60)"], log_path=str(tmp_path / "e.log"), fence=live
            )
            try:
                offset.write_text(f"{-HOUR}\n")  # stepped two hours back: the lease's 60 s are still 60 s
                time.sleep(0.1)  # the stepped clock rereads its offset every 50 ms
                result = await t.signal_process(spawned.pid, spawned.start_ticks, "CONT", fence=live)
                assert result.outcome == "sent"
                lapsed = HostFence.for_port(str(tmp_path), 4242, 3, deadline=lambda: time.monotonic() - 1)
                with pytest.raises(StaleFenceError, match="lease"):
                    await t.signal_process(spawned.pid, spawned.start_ticks, "KILL", fence=lapsed)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(spawned.pgid, signal.SIGKILL)
            return float(seen.stdout), spawned.pid

    host_time, _ = asyncio.run(scenario())
    assert abs(host_time - (time.time() + HOUR)) < 30  # the seam works: the host's programs saw the step
    journal = host_effects(redis_client, "box")
    assert [(e["op"], e["outcome"]) for e in journal] == [
        ("claim", "ok"),
        ("spawn", "asked"),
        ("spawn", "ok"),
        ("signal", "sent"),
        ("signal", "stale"),
    ]
    to_wall = boot_to_wall()
    windowed = [e for e in journal if "window" in e]
    for e, step in zip(windowed[:3], (HOUR, HOUR, -HOUR), strict=True):
        taken, released = (t + to_wall for t in e["window_boot"])
        assert e["began"] - 0.05 <= taken <= released <= e["ended"] + 0.05, e  # the boot clock: the truth
        assert abs(e["window"][0] - taken - step) < 30, e  # the wall clock: off by the step
    # The checker reads the windows off the boot clock: the stepped wall windows (an hour ahead, then an hour
    # back) put the signal before the claim and the spawn, and them after the job that signalled.
    header = {"src": "soak", "boot_to_wall": to_wall}
    assert _ops_in_order(history_check.History([header, *_effects(journal)])) == ["claim", "spawn", "signal"]
    assert _ops_in_order(history_check.History(_effects(journal))) == ["signal", "claim", "spawn"]  # wall clock


def _effects(journal: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{"src": "effect", "host": "box", **e} for e in journal if "window" in e]


def _ops_in_order(h: history_check.History) -> list[object]:
    return [e.get("op") for e in h.effects["box"]]
