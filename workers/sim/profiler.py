"""The simulators' torch-profiler endpoints: SGLang's ``/start_profile`` + ``/stop_profile``, vLLM's too.

Behaviour as the engines' wheels have it (see ``workers/engines/sglang/profile.py`` and
``workers/engines/vllm/profile.py``): a capture counts forward steps (the scheduler's ``forwards``),
stops by itself after ``num_steps`` (SGLang) / ``max_iterations`` (vLLM, whose session stays open until
``/stop_profile``), and then every TP rank writes one small gzipped Chrome trace, named as the engine
names it, so a bench's profile has real files on the "host" to find and size. A second start while one
runs is refused the engine's way.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

POLL_S = 0.005


@dataclass
class Capture:
    """One capture in progress."""

    output_dir: Path
    names: list[str]  # one file name per TP rank
    start_forwards: int
    target: int | None  # forward count at which it stops by itself; None: until stop
    t0: float = field(default_factory=time.time)
    written: bool = False


class SimProfiler:
    """Start/stop a capture; files are written when it stops (by itself or when asked)."""

    def __init__(self, ranks: int, forwards: Callable[[], int], log: Callable[[str], None] | None = None) -> None:
        self.ranks = max(1, ranks)
        self.forwards = forwards
        self.log = log or (lambda line: None)
        self.capture: Capture | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def active(self) -> bool:
        return self.capture is not None and not self.capture.written

    def start(self, output_dir: str, names: list[str], steps: int | None) -> None:
        """Begin a capture; ValueError (the engine's message) when one is already running."""
        if self.active:
            raise ValueError("Profiling is already in progress. Call /stop_profile first.")
        now = self.forwards()
        self.capture = Capture(Path(output_dir).expanduser(), names, now, now + steps if steps else None)
        self.log(f"Profiling starts. Traces will be saved to: {output_dir}")
        if steps:
            self._task = asyncio.get_running_loop().create_task(self._stop_after_steps(self.capture))

    def stop(self) -> None:
        """Stop the running capture and write its files; ValueError when none runs."""
        if not self.active or self.capture is None:
            raise ValueError("Profiling is not in progress. Call /start_profile first.")
        self._write(self.capture)

    async def _stop_after_steps(self, capture: Capture) -> None:
        while not capture.written and capture.target is not None and self.forwards() < capture.target:
            await asyncio.sleep(POLL_S)
        if not capture.written:
            self._write(capture)

    def _write(self, capture: Capture) -> None:
        capture.written = True
        steps = max(0, self.forwards() - capture.start_forwards)
        t1 = time.time()
        capture.output_dir.mkdir(parents=True, exist_ok=True)
        span_us = max(1.0, (t1 - capture.t0) * 1e6)
        for rank, name in enumerate(capture.names):
            events = [
                {
                    "name": "forward",
                    "ph": "X",
                    "pid": rank,
                    "tid": 0,
                    "ts": capture.t0 * 1e6 + i * span_us / max(1, steps),
                    "dur": span_us / max(1, steps),
                    "args": {"step": i},
                }
                for i in range(steps)
            ]
            trace = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"simulated": True, "rank": rank}}
            (capture.output_dir / name).write_bytes(gzip.compress(json.dumps(trace).encode()))
        self.log(f"Stop profiling... {steps} steps, {len(capture.names)} trace file(s) in {capture.output_dir}")
