"""The host's process table: which engines exist, which port each is bound for, and their process trees.

A real SGLang server binds its HTTP port only once the weights are loaded and CUDA graphs captured,
which takes minutes for a big model. During that time nothing listens on the port, yet the port, the
GPUs and the memory are taken: the seed's second launch on the same GPUs happened exactly so. Looking
at listeners alone says "nothing there"; this module finds the engine from the process table instead
(argv naming an engine entry point, with ``--port N`` or the engine's default port: the registered
engines' recognisers, :mod:`workers.engines.processes`), together with the processes it started
(SGLang's schedulers, one per GPU, rename themselves ``sglang::scheduler_TP0`` and hold the GPU memory),
so the caller can say who started it, since when, and how much GPU memory it holds.

The scan is one small stdlib-only Python script run on the host (locally or over SSH), so one round
trip answers it.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from workers.engines import processes, registry
from workers.host.local import LocalTransport
from workers.json_value import json_object, req_int

# argv[1] = JSON list of needles: substrings that make a command line worth sending back in full (the rest
# only contributes pid/ppid); every registered engine's (registry.process_needles). Prints one JSON object:
# every process's (pid, ppid, pgid, uid, start ticks), the argv of the processes whose command line contains
# a needle, user names, boot time, CLK_TCK.
SCAN_SCRIPT = r"""
import json, os, pwd, sys
needles = [n.encode() for n in json.loads(sys.argv[1])]
procs, argv, users = [], {}, {}
for entry in os.listdir("/proc"):
    if not entry.isdigit():
        continue
    try:
        with open("/proc/%s/stat" % entry, "rb") as f:
            stat = f.read().decode("utf-8", "replace")
        rest = stat[stat.rindex(")") + 1:].split()
        if rest[0] in ("Z", "X", "x"):
            continue
        uid = os.stat("/proc/%s" % entry).st_uid
        with open("/proc/%s/cmdline" % entry, "rb") as f:
            cmd = f.read()
    except (OSError, ValueError, IndexError):
        continue
    pid = int(entry)
    procs.append([pid, int(rest[1]), int(rest[2]), uid, int(rest[19])])
    if cmd and any(n in cmd for n in needles):
        argv[pid] = [p.decode("utf-8", "replace") for p in cmd.rstrip(b"\0").split(b"\0")]
    if uid not in users:
        try:
            users[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            users[uid] = str(uid)
btime = 0
with open("/proc/stat") as f:
    for line in f:
        if line.startswith("btime "):
            btime = int(line.split()[1])
print(json.dumps({"procs": procs, "argv": argv, "users": users, "btime": btime,
                  "clk_tck": os.sysconf("SC_CLK_TCK")}))
"""


@dataclass(frozen=True)
class HostProcess:
    """One process of the host's table (argv only for processes that looked like an engine)."""

    pid: int
    ppid: int
    pgid: int
    user: str
    start_ticks: int
    start_time: float
    argv: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineProcess:
    """An engine's main process, the port it is bound for, and the pids of its process tree."""

    process: HostProcess
    port: int
    kind: str  # a registered engine's kind, or "<kind>-sim" for its simulator
    tree: tuple[int, ...]  # the main pid and every descendant

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass(frozen=True)
class ProcessTable:
    """A snapshot of the host's processes; ``unread`` says why the scan could not read them (None: it did), so
    an empty table from a failed read is never taken for a host with no engine."""

    processes: Mapping[int, HostProcess]
    unread: str | None = None

    def children(self) -> dict[int, list[int]]:
        """ppid -> child pids."""
        out: dict[int, list[int]] = {}
        for proc in self.processes.values():
            out.setdefault(proc.ppid, []).append(proc.pid)
        return out

    def tree(self, pid: int) -> tuple[int, ...]:
        """``pid`` and all its descendants (breadth first)."""
        kids = self.children()
        order, todo, seen = [], [pid], set()
        while todo:
            current = todo.pop(0)
            if current in seen or current not in self.processes:
                continue
            seen.add(current)
            order.append(current)
            todo.extend(sorted(kids.get(current, [])))
        return tuple(order)

    def engines(
        self, extra_commands: Iterable[Sequence[str]] = (), command_kind: str | None = None
    ) -> list[EngineProcess]:
        """Every engine main process (not its children), with the port it is bound for; ``extra_commands``
        (the host's configured engine command) are engines of ``command_kind``."""
        commands = [tuple(c) for c in extra_commands if c]
        found: list[EngineProcess] = []
        for proc in self.processes.values():
            kind = engine_kind(proc.argv, commands, command_kind)
            if kind is None:
                continue
            parent = self.processes.get(proc.ppid)
            if parent is not None and engine_kind(parent.argv, commands, command_kind) is not None:
                continue  # a child of an engine that kept its parent's argv (a fork): not a second engine
            found.append(EngineProcess(proc, engine_port(proc.argv, kind), kind, self.tree(proc.pid)))
        return sorted(found, key=lambda e: e.process.pid)

    def engines_on(
        self, port: int, extra_commands: Iterable[Sequence[str]] = (), command_kind: str | None = None
    ) -> list[EngineProcess]:
        """Engines bound for ``port``, oldest first."""
        return [e for e in self.engines(extra_commands, command_kind) if e.port == port]


def engine_kind(
    argv: Sequence[str], commands: Sequence[Sequence[str]] = (), command_kind: str | None = None
) -> str | None:
    """The kind of engine argv runs (``sglang``, ``vllm-sim``, ...), else None (the registered engines'
    recognisers: :mod:`workers.engines.processes`); a configured engine command, as a prefix, is an engine
    of ``command_kind`` (None: the default engine)."""
    return processes.engine_kind(argv, commands, command_kind)


def engine_port(argv: Sequence[str], kind: str | None = None) -> int:
    """The port an engine's argv binds (``--port N`` or ``--port=N``, the last one wins), else the
    engine's default (its folder's ``DEFAULT_PORT``: SGLang's 30000, vLLM's 8000)."""
    return processes.engine_port(argv, kind)


def parse_scan(text: str) -> ProcessTable:
    """The scan script's JSON -> a :class:`ProcessTable` (bad rows are skipped, never guessed)."""
    data = json_object(json.loads(text))
    btime = req_int(data.get("btime") or 0)
    tck = req_int(data.get("clk_tck") or 100) or 100
    users = {int(k): str(v) for k, v in json_object(data.get("users")).items()}
    argvs = {int(k): tuple(str(p) for p in v) for k, v in json_object(data.get("argv")).items() if isinstance(v, list)}
    processes: dict[int, HostProcess] = {}
    procs = data.get("procs")
    for row in procs if isinstance(procs, list) else []:
        try:
            pid, ppid, pgid, uid, ticks = (int(x) for x in row)
        except (TypeError, ValueError):
            continue
        processes[pid] = HostProcess(
            pid, ppid, pgid, users.get(uid, str(uid)), ticks, btime + ticks / tck, argvs.get(pid, ())
        )
    return ProcessTable(processes)


class _Runner(Protocol):
    async def run(self, argv: Sequence[str], *, timeout: float) -> Any: ...


def python_for(transport: object) -> str:
    """The interpreter that runs host-side scripts: this one locally, the host's ``python3`` over SSH."""
    return sys.executable if isinstance(transport, LocalTransport) else "python3"


async def scan(transport: _Runner, *, needles: Sequence[str] | None = None, timeout_s: float = 10.0) -> ProcessTable:
    """Read the host's process table in one round trip; an empty table saying why (``unread``) when the scan
    cannot run.
    ``needles``: every registered engine's (:func:`workers.engines.registry.process_needles`) by default."""
    chosen = registry.process_needles() if needles is None else needles
    argv = [python_for(transport), "-c", SCAN_SCRIPT, json.dumps(list(chosen))]
    result = await transport.run(argv, timeout=timeout_s)
    if getattr(result, "returncode", 1) != 0:
        return ProcessTable({}, unread=f"the scan exited {getattr(result, 'returncode', None)}")
    try:
        return parse_scan(getattr(result, "stdout", "") or "")
    except (ValueError, TypeError) as exc:
        return ProcessTable({}, unread=f"the scan's answer was unreadable ({type(exc).__name__})")


def parse_compute_apps(text: str) -> dict[int, int]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`` -> {pid: MiB}.

    A pid on several GPUs appears once per GPU; its memory is summed. ``[N/A]`` rows count as 0.
    """
    out: dict[int, int] = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 2 or not fields[0].isdigit():
            continue
        try:
            mib = int(float(fields[1]))
        except ValueError:
            mib = 0
        out[int(fields[0])] = out.get(int(fields[0]), 0) + mib
    return out


def describe_command(argv: Sequence[str], limit: int = 160) -> str:
    """A process's command line for a message, shortened (secret values are hidden by the caller)."""
    text = shlex.join(list(argv))
    return text if len(text) <= limit else text[: limit - 3] + "..."
