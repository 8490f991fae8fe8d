"""``python -m workers.sim.nvidia_smi``: an ``nvidia-smi`` stand-in for the simulated host.

Answers the queries benchbot's observer uses (``--query-gpu``, ``--query-compute-apps``, ``-L``, the
plain table) with the GPU profile's facts and the memory of the sim servers registered in the state
dir (dead pids are ignored). Output formats follow nvidia-smi's CSV: ``csv`` has a header with units
(``memory.used [MiB]``), ``noheader`` drops it, ``nounits`` drops ``MiB``/``%``/``W`` from values.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from workers.errors import BenchbotError
from workers.sim import nvidia_dmon as dmon
from workers.sim import registry
from workers.sim.gpu_state import IDLE_MIB, power_w, util_by_gpu
from workers.sim.profile import GpuProfile, load_profile

USAGE = """\
nvidia-smi stand-in (benchbot's simulated host): answers what benchbot's observer asks.

  -L, --list-gpus                 one line per GPU
  --query-gpu=FIELDS              GPU fields (index, name, memory.used, ...) with --format=csv[,noheader][,nounits]
  --query-compute-apps=FIELDS     processes on the GPUs (pid, used_memory, ...) with --format=csv[,...]
  -i, --id=INDICES                only these GPUs
  dmon [-s pucvmt] [-c N] [-d S]  device monitoring rows (power, util, clocks, memory, PCIe rx/tx MB/s)
  topo -m                         the GPU interconnect matrix
  --sim-state-dir=DIR             registry of simulated servers to read (default: BENCHBOT_SIM_STATE_DIR)
  (no option)                     the plain nvidia-smi table
"""


def _gpu_fields(profile: GpuProfile, used: dict[int, int], util: dict[int, int]) -> dict[str, tuple[str, Callable]]:
    """field -> (unit, fn(index) -> value)."""
    mem = profile.memory_mib

    def used_of(i: int) -> int:
        return min(mem, IDLE_MIB + used.get(i, 0))

    return {
        "index": ("", lambda i: i),
        "name": ("", lambda i: profile.gpu_name),
        "uuid": ("", lambda i: f"GPU-5a1b0000-0000-4000-8000-{i:012d}"),
        "pci.bus_id": ("", lambda i: f"00000000:{0x18 + 0x10 * i:02X}:00.0"),
        "serial": ("", lambda i: f"17{i:011d}"),
        "driver_version": ("", lambda i: profile.driver_version),
        "count": ("", lambda i: profile.count),
        "compute_cap": ("", lambda i: profile.compute_cap),
        "memory.total": ("MiB", lambda i: mem),
        "memory.used": ("MiB", used_of),
        "memory.free": ("MiB", lambda i: mem - used_of(i)),
        "memory.reserved": ("MiB", lambda i: 0),
        "utilization.gpu": ("%", lambda i: util.get(i, 0)),
        "utilization.memory": ("%", lambda i: util.get(i, 0) // 2),
        "temperature.gpu": ("", lambda i: 34 + util.get(i, 0) // 3),
        "power.draw": ("W", lambda i: f"{power_w(profile, util.get(i, 0)):.2f}"),
        "power.limit": ("W", lambda i: f"{profile.power_limit_w:.2f}"),
        "pstate": ("", lambda i: "P0" if used.get(i) else "P8"),
        "persistence_mode": ("", lambda i: "Enabled"),
        "clocks.sm": ("MHz", lambda i: 2430 if util.get(i) else 180),
        "clocks.mem": ("MHz", lambda i: 12481 if used.get(i) else 405),
    }


APP_FIELDS = (
    "pid",
    "process_name",
    "name",
    "used_memory",
    "used_gpu_memory",
    "gpu_uuid",
    "gpu_bus_id",
    "gpu_name",
    "gpu_serial",
)


def compute_apps(entries: list[dict]) -> list[tuple[int, str, int, int]]:
    """``(pid, process name, gpu index, MiB)`` per GPU context, ordered by GPU then pid like nvidia-smi.

    A server that registered its child processes (``procs``: SGLang's schedulers, one per GPU) shows
    those children, each on its own GPU, under its process title; an entry without children shows its
    own pid on each of its GPUs. Dead children are left out.
    """
    apps = []
    for e in entries:
        procs = e.get("procs") or []
        mib = int(e.get("mem_mib", 0))
        if procs:
            for p in procs:
                if p.get("gpu") is not None and registry.pid_alive(int(p["pid"])):
                    apps.append((int(p["pid"]), str(p.get("name") or "python3"), int(p["gpu"]), mib))
        else:
            apps += [(int(e["pid"]), "python3", int(g), mib) for g in e.get("gpus", [])]
    return sorted(apps, key=lambda a: (a[2], a[0]))


def _csv(rows: list[list[str]], header: list[str] | None) -> str:
    lines = [", ".join(header)] if header is not None else []
    lines += [", ".join(r) for r in rows]
    return "\n".join(lines) + ("\n" if lines else "")


def _value(v: object, unit: str, units: bool) -> str:
    if unit and units and unit != "":
        return f"{v} {unit}"
    return str(v)


def run(argv: list[str]) -> tuple[int, str, str]:
    """The whole tool as a pure function: (exit code, stdout, stderr)."""
    own = [a for a in argv if a.startswith("--sim-state-dir=")]  # the fleet appends it after the subcommand
    rest = [a for a in argv if not a.startswith("--sim-state-dir=")]
    if rest[:1] == ["dmon"]:
        return dmon.run_dmon(rest[1:] + own)
    if rest[:2] == ["topo", "-m"]:
        return dmon.run_topo(rest[2:] + own)
    opts: dict[str, str] = {}
    flags: set[str] = set()
    state: str | None = None
    it = iter(argv)
    for arg in it:
        if arg in ("-h", "--help"):
            return 0, USAGE, ""
        if arg.startswith("--sim-state-dir="):
            state = arg.split("=", 1)[1] or None  # benchbot's own option: this host's registry
        elif arg.startswith("--") and "=" in arg:
            k, v = arg[2:].split("=", 1)
            opts[k] = v
        elif arg in ("-i", "--id", "--format", "--query-gpu", "--query-compute-apps"):
            opts[arg.lstrip("-").replace("i", "id", 1) if arg == "-i" else arg.lstrip("-")] = next(it, "")
        elif arg in ("-L", "--list-gpus", "-q", "--query"):
            flags.add(arg)
        else:
            return 2, "", 'Invalid combination of input arguments. Please run "nvidia-smi -h" for help.\n'
    try:
        profile = load_profile(None)
    except BenchbotError as exc:
        return 2, "", f"{exc}\n"
    entries = registry.live_entries(registry.state_dir(state))
    used = registry.used_mib_by_gpu(entries)
    util = util_by_gpu(entries)
    indices = list(range(profile.count))
    if "id" in opts:
        try:
            wanted = [int(x) for x in opts["id"].split(",")]
        except ValueError:
            return 6, "", f"No devices were found matching {opts['id']!r}\n"
        indices = [i for i in indices if i in wanted]
        if not indices:
            return 6, "", "No devices were found\n"
    fmt = [x.strip() for x in opts.get("format", "").split(",") if x.strip()]
    header = "noheader" not in fmt
    units = "nounits" not in fmt
    if "-L" in flags or "--list-gpus" in flags:
        out = "".join(f"GPU {i}: {profile.gpu_name} (UUID: GPU-5a1b0000-0000-4000-8000-{i:012d})\n" for i in indices)
        return 0, out, ""
    if "query-gpu" in opts:
        if not fmt or fmt[0] != "csv":
            return 2, "", '"--format" is required with --query-gpu. Try "--format=csv".\n'
        fields = _gpu_fields(profile, used, util)
        names = [f.strip() for f in opts["query-gpu"].split(",") if f.strip()]
        for n in names:
            if n not in fields:
                return 2, "", f'Field "{n}" is not a valid field to query.\n\n'
        head = [f"{n} [{fields[n][0]}]" if fields[n][0] else n for n in names] if header else None
        rows = [[_value(fields[n][1](i), fields[n][0], units) for n in names] for i in indices]
        return 0, _csv(rows, head), ""
    if "query-compute-apps" in opts:
        if not fmt or fmt[0] != "csv":
            return 2, "", '"--format" is required with --query-compute-apps. Try "--format=csv".\n'
        names = [f.strip() for f in opts["query-compute-apps"].split(",") if f.strip()]
        for n in names:
            if n not in APP_FIELDS:
                return 2, "", f'Field "{n}" is not a valid field to query.\n\n'
        gpu = _gpu_fields(profile, used, util)
        rows = []
        for pid, name, g, mib in compute_apps(entries):
            if g not in indices:
                continue
            vals = {
                "pid": str(pid),
                "process_name": name,
                "name": name,
                "used_memory": _value(mib, "MiB", units),
                "used_gpu_memory": _value(mib, "MiB", units),
                "gpu_uuid": gpu["uuid"][1](g),
                "gpu_bus_id": gpu["pci.bus_id"][1](g),
                "gpu_name": profile.gpu_name,
                "gpu_serial": gpu["serial"][1](g),
            }
            rows.append([vals[n] for n in names])
        head = [f"{n} [MiB]" if n in ("used_memory", "used_gpu_memory") else n for n in names] if header else None
        return 0, _csv(rows, head), ""
    return 0, _table(profile, indices, used, util, entries), ""


def _table(
    profile: GpuProfile, indices: list[int], used: dict[int, int], util: dict[int, int], entries: list[dict]
) -> str:
    """The plain ``nvidia-smi`` screen, abridged."""
    bar = "+-----------------------------------------------------------------------------------------+"
    lines = [
        time.strftime("%a %b %d %H:%M:%S %Y"),
        bar,
        f"| NVIDIA-SMI {profile.driver_version:<15} Driver Version: {profile.driver_version:<15} "
        f"CUDA Version: {profile.cuda_version:<8}|",
        bar,
    ]
    for i in indices:
        u = min(profile.memory_mib, IDLE_MIB + used.get(i, 0))
        lines.append(
            f"| {i:>3}  {profile.gpu_name[:38]:<38} | {u:>6}MiB / {profile.memory_mib:>6}MiB | {util.get(i, 0):>3}%  |"
        )
    lines += [
        bar,
        "| Processes:" + " " * 78 + "|",
        "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |",
        "|        ID   ID                                                               Usage      |",
    ]
    for pid, name, g, mib in compute_apps(entries):
        if g in indices:
            lines.append(f"|  {g:>3}   N/A  N/A  {pid:>8}      C   {name[:38]:<38}  {mib:>8}MiB |")
    lines.append(bar)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    code, out, err = run(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


if __name__ == "__main__":
    sys.exit(main())
