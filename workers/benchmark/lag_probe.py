"""How late the event loop runs a due callback, sampled while a level runs: the client's own lag.

A shard reports it (``ClientLoad.lag_ms``) so a level the client could not keep up with is flagged
instead of being mistaken for a slow server (``workers.benchmark.metrics``).
"""

from __future__ import annotations

import asyncio
import time


class LagProbe:
    """Sleeps in a loop and records the overshoot: how late the event loop runs a due callback.

    Any sleep length measures the same lag; 5 ms (200 samples/s) rather than 1 ms because every wake-up
    costs ~50 µs of CPU on a small VM, and a 1 ms probe would itself add 5 % CPU and some of the lag.
    """

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.samples_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        clock, sleep, append, period = time.perf_counter, asyncio.sleep, self.samples_ms.append, self.period_s
        while True:
            t0 = clock()
            await sleep(period)
            append(max(0.0, (clock() - t0 - period) * 1000))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> list[float]:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        return self.samples_ms
