"""How long the client waited for a CPU core while a level ran: the kernel's own figures, read around the level.

Event-loop lag alone cannot say *why* the loop ran late. With the client's CPU share low, the usual cause
on a small box is that the kernel did not schedule it: the engine (or anything else) filled the cores. Two
kernel counters say so directly and cost one small file read each:

- ``/proc/self/schedstat``: this process's main thread (where the event loop runs): its second field is the
  run delay, nanoseconds it spent runnable but waiting for a core (``sched_info``, Linux >= 2.6);
- ``/proc/pressure/cpu``: the box's CPU pressure (PSI, Linux >= 4.20): ``some total=`` is microseconds in
  which at least one runnable task waited for a core.

Either may be absent (another OS, a kernel without schedstats or PSI): a missing figure is None, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SCHEDSTAT = Path("/proc/self/schedstat")
PRESSURE = Path("/proc/pressure/cpu")


def run_delay_ns(path: Path = SCHEDSTAT) -> int | None:
    """This thread's total run-queue wait so far (ns), None when the kernel does not say."""
    try:
        return int(path.read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None


def pressure_some_us(path: Path = PRESSURE) -> int | None:
    """The box's total "some" CPU stall so far (µs), None without PSI."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("some "):
                fields = dict(part.split("=", 1) for part in line.split()[1:])
                return int(fields["total"])
    except (OSError, KeyError, ValueError):
        return None
    return None


@dataclass(frozen=True)
class CpuWaitMark:
    """Both counters at one instant (``take``); two marks give the wait between them (``since``)."""

    run_delay_ns: int | None
    pressure_us: int | None

    @classmethod
    def take(cls) -> CpuWaitMark:
        return cls(run_delay_ns(), pressure_some_us())

    def since(self, earlier: CpuWaitMark) -> tuple[float | None, float | None]:
        """(seconds this process waited for a core, seconds the box had a task waiting) between the marks."""
        delay = (
            (self.run_delay_ns - earlier.run_delay_ns) / 1e9
            if self.run_delay_ns is not None and earlier.run_delay_ns is not None
            else None
        )
        pressure = (
            (self.pressure_us - earlier.pressure_us) / 1e6
            if self.pressure_us is not None and earlier.pressure_us is not None
            else None
        )
        return delay, pressure
