"""``nvidia-smi dmon`` and ``nvidia-smi topo -m`` of the simulated host.

dmon prints two ``#`` header lines (column names, then units) and one row per GPU per sample, columns
right-aligned in 6-character cells and ``-`` where a value is not available, in nvidia-smi's group
order whatever order ``-s`` names them: p (pwr gtemp mtemp), u (sm mem enc dec jpg ofa), c (mclk pclk),
v (pviol tviol), m (fb bar1 ccpm), t (rxpci txpci, MB/s). The values come from the live load the sim
servers publish (``workers/sim/gpu_load.py``).
"""

from __future__ import annotations

import time

from workers.errors import BenchbotError
from workers.sim import registry
from workers.sim.gpu_state import IDLE_MIB, power_w, util_by_gpu
from workers.sim.profile import GpuProfile, load_profile

#: group letter -> ((column, unit), ...) in nvidia-smi's output order
GROUPS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("p", (("pwr", "W"), ("gtemp", "C"), ("mtemp", "C"))),
    ("u", (("sm", "%"), ("mem", "%"), ("enc", "%"), ("dec", "%"), ("jpg", "%"), ("ofa", "%"))),
    ("c", (("mclk", "MHz"), ("pclk", "MHz"))),
    ("v", (("pviol", "%"), ("tviol", "bool"))),
    ("m", (("fb", "MB"), ("bar1", "MB"), ("ccpm", "MB"))),
    ("t", (("rxpci", "MB/s"), ("txpci", "MB/s"))),
)
USAGE_ERROR = 'Invalid combination of input arguments. Please run "nvidia-smi dmon -h" for help.\n'


def _columns(select: str) -> list[tuple[str, str]]:
    return [col for letter, cols in GROUPS if letter in select for col in cols]


def _values(profile: GpuProfile, i: int, entries: list[dict]) -> dict[str, str]:
    util = util_by_gpu(entries).get(i, 0)
    used = registry.used_mib_by_gpu(entries).get(i, 0)
    rx = sum(float(e.get("pcie_rx_mbs", 0)) for e in entries if i in [int(g) for g in e.get("gpus", [])])
    tx = sum(float(e.get("pcie_tx_mbs", 0)) for e in entries if i in [int(g) for g in e.get("gpus", [])])
    return {
        "pwr": f"{power_w(profile, util):.0f}",
        "gtemp": str(34 + util // 3),
        "mtemp": str(40 + util // 4) if profile.nvlink else "-",  # HBM parts report memory temperature
        "sm": str(util),
        "mem": str(util // 2),
        "enc": "0",
        "dec": "0",
        "jpg": "0",
        "ofa": "0",
        "mclk": "12481" if used else "405",
        "pclk": "2430" if util else "180",
        "pviol": "0",
        "tviol": "0",
        "fb": str(min(profile.memory_mib, IDLE_MIB + used)),
        "bar1": "5",
        "ccpm": "0",
        "rxpci": f"{rx:.0f}",
        "txpci": f"{tx:.0f}",
    }


def run_dmon(argv: list[str]) -> tuple[int, str, str]:
    """``dmon [-s LETTERS] [-c COUNT] [-d SECONDS] [-i IDS] [--sim-state-dir=DIR]`` -> (code, stdout, stderr).

    Without ``-c`` the real tool runs until interrupted; the stand-in, a pure function, prints one sample.
    """
    select, count, delay, ids, state = "puc", 1, 1.0, None, None
    it = iter(argv)
    try:
        for arg in it:
            if arg == "-s":
                select = next(it)
            elif arg == "-c":
                count = max(1, int(next(it)))
            elif arg == "-d":
                delay = max(1.0, float(next(it)))
            elif arg in ("-i", "--id"):
                ids = [int(x) for x in next(it).split(",")]
            elif arg.startswith("--sim-state-dir="):
                state = arg.split("=", 1)[1] or None
            else:
                return 2, "", USAGE_ERROR
    except (StopIteration, ValueError):
        return 2, "", USAGE_ERROR
    if any(letter not in "pucvmet" for letter in select):
        return 2, "", USAGE_ERROR
    try:
        profile = load_profile(None)
    except BenchbotError as exc:
        return 2, "", f"{exc}\n"
    cols = _columns(select)
    indices = [i for i in range(profile.count) if ids is None or i in ids]
    out = [
        "# gpu " + "".join(f"{name:>7}" for name, _ in cols),
        "# Idx " + "".join(f"{unit:>7}" for _, unit in cols),
    ]
    for n in range(count):
        if n:
            time.sleep(delay)
        entries = registry.live_entries(registry.state_dir(state))
        for i in indices:
            vals = _values(profile, i, entries)
            out.append(f"{i:>5} " + "".join(f"{vals[name]:>7}" for name, _ in cols))
    return 0, "\n".join(out) + "\n", ""


def run_topo(argv: list[str]) -> tuple[int, str, str]:
    """``topo -m``: the GPU-to-GPU matrix (NV18 on NVLink boards, NODE/SYS over PCIe) and its legend."""
    for arg in argv:
        if not arg.startswith("--sim-state-dir="):
            return 2, "", USAGE_ERROR
    try:
        profile = load_profile(None)
    except BenchbotError as exc:
        return 2, "", f"{exc}\n"
    n = profile.count
    names = [f"GPU{i}" for i in range(n)]
    lines = ["\t" + "\t".join(names) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for i in range(n):
        cells = []
        for j in range(n):
            if i == j:
                cells.append(" X ")
            elif profile.nvlink:
                cells.append("NV18")
            else:
                cells.append("NODE" if (i < n // 2) == (j < n // 2) else "SYS")
        numa = 0 if i < n // 2 else 1
        cpus = "0-47,96-143" if numa == 0 else "48-95,144-191"
        lines.append(f"{names[i]}\t" + "\t".join(cells) + f"\t{cpus}\t{numa}\t\tN/A")
    lines += [
        "",
        "Legend:",
        "",
        "  X    = Self",
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
        "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
        "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
        "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
        "  PIX  = Connection traversing at most a single PCIe bridge",
        "  NV#  = Connection traversing a bonded set of # NVLinks",
    ]
    return 0, "\n".join(lines) + "\n", ""
