"""What both views of the simulated GPUs show: ``nvidia-smi --query-gpu`` and ``nvidia-smi dmon``.

The figures each derives from the sim servers' registry entries (the live load ``gpu_load.py`` publishes):
here, below both views, so the query tool and dmon read one definition without importing each other.
"""

from __future__ import annotations

from workers.sim.profile import GpuProfile

IDLE_MIB = 3  # what an idle card shows


def power_w(profile: GpuProfile, util_pct: int) -> float:
    """Board power at ``util_pct``: 40 W idle rising to 70 % of the power limit at full load."""
    return 40 + util_pct * (profile.power_limit_w - 40) / 100 * 0.7


def util_by_gpu(entries: list[dict]) -> dict[int, int]:
    """SM utilisation per GPU index: the busiest server on it."""
    util: dict[int, int] = {}
    for e in entries:
        for g in e.get("gpus", []):
            util[int(g)] = max(util.get(int(g), 0), int(e.get("util", 0)))
    return util
