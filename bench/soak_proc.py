"""The soak's view of this box's processes, from /proc: the live simulated engines per host, a process's descendants.

This is the host's truth the soak compares ``/status`` answers with, and how it finds a worker's horse.
"""

from __future__ import annotations

import os

SIM_MODULES = ("workers.sim.sglang", "workers.sim.vllm")


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def _stat(pid: int) -> tuple[str, int]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
        return rest[0].decode(), int(rest[1])
    except (OSError, IndexError, ValueError):
        return "X", 0


def live_engines(ports: dict[str, int]) -> dict[str, list[int]]:
    """Per host, the pids of live simulated engines on its port (not their children, not zombies)."""
    by_port = {str(p): h for h, p in ports.items()}
    found: dict[int, tuple[str, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        argv = _argv(int(entry))
        if len(argv) < 3 or argv[1] != "-m" or argv[2] not in SIM_MODULES:
            continue
        port = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--port"), None)
        state, ppid = _stat(int(entry))
        if port in by_port and state not in ("Z", "X"):
            found[int(entry)] = (by_port[port], ppid)
    out: dict[str, list[int]] = {h: [] for h in ports}
    for pid, (host, ppid) in found.items():
        if ppid not in found:
            out[host].append(pid)
    return out


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            children.setdefault(_stat(int(entry))[1], []).append(int(entry))
    out, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children.get(child, []))
    return out
