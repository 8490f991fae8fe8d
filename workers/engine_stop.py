"""Stopping an engine on a host: only a process benchbot can identify, only through fenced signals.

*Which* process: the one observed on the port, named by pid **and** start ticks, so a pid reused in
between is never hit (the host-side actuator checks ``/proc`` before every signal, under the fence).

*Whether* it may be stopped: benchbot's own engine (the instance in its launch record), or an
unmanaged process it can identify as an engine: its ``/server_info`` answered as SGLang, or its argv
is the configured engine command or SGLang's own launcher. Anything else on the port (a
``python3 -m http.server``, a database) is a refusal that names the process.

*How*: the whole process group only for an engine benchbot started, since benchbot created that
group (pid == pgid == sid). Anyone else's engine gets signals to its pid alone: its group may hold
its parent shell or a tmux pane. Its descendants, seen before the first signal (ppid + start
ticks), that outlive it (a TP worker holding GPU memory) are stopped one by one afterwards.
"""

from __future__ import annotations

import asyncio
import itertools
import posixpath
import time
from collections.abc import Sequence
from typing import Any

from workers.config import Config, HostConfig
from workers.errors import BenchbotError, EngineError
from workers.transport import HostFence, Transport, describe_argv

STOP_GRACE_S = 20.0
LEFTOVER_GRACE_S = 5.0

#: Who owns the engine port: benchbot's engine, another engine, or something that is not an engine.
OURS, ENGINE, OTHER = "ours", "engine", "other"


def looks_like_engine_argv(argv: Sequence[str], command: Sequence[str]) -> bool:
    """True for the configured engine command (any interpreter path) or SGLang's own launchers."""
    argv, command = list(argv), list(command)
    if not argv:
        return False
    if len(command) > 1 and argv[1:len(command)] == command[1:]:
        return True  # `python3 -m sglang.launch_server` run as /venv/bin/python -m sglang.launch_server ...
    if len(command) == 1 and posixpath.basename(command[0]) in {posixpath.basename(a) for a in argv[:2]}:
        return True  # a wrapper script, run directly or by its interpreter
    head = argv[:4]
    if "sglang.launch_server" in head:
        return True
    return any(posixpath.basename(word) == "sglang" and nxt == "serve" for word, nxt in itertools.pairwise(head))


def owner_kind(config: Config, observation: dict[str, Any]) -> str:
    """:data:`OURS`, :data:`ENGINE` or :data:`OTHER` for the process an observation found on the port."""
    if observation.get("managed"):
        return OURS
    if observation.get("state") == "running":  # /server_info answered as SGLang does
        return ENGINE
    argv = (observation.get("process") or {}).get("argv") or ()
    return ENGINE if looks_like_engine_argv(argv, config.engine.command) else OTHER


def refusal(host: HostConfig, observation: dict[str, Any]) -> BenchbotError:
    """The error for a port held by something benchbot cannot identify as an engine."""
    process = observation.get("process") or {}
    what = describe_argv(process.get("argv") or ["?"], limit=100)
    seen = observation.get("state") or "unknown"
    detail = f": {observation['detail']}" if observation.get("detail") else ""
    return BenchbotError(
        f"port {host.port} on {host.name} is held by process {process.get('pid')} (`{what}`), which benchbot "
        f"cannot identify as an engine ({seen}{detail}). benchbot stops only engines: stop that process "
        "yourself, or give the host another port.")


async def stop_engine(transport: Transport, fence: HostFence, pid: int, start_ticks: int, *, group: bool,
                      grace_s: float = STOP_GRACE_S) -> str:
    """Stop one identified engine: TERM, then KILL after ``grace_s``; say how it ended.

    ``group=True`` only for an engine benchbot started. Raises EngineError when it cannot be signalled
    or survives SIGKILL, and LeaseLostError (stale fence) when another job claimed the host meanwhile.
    """
    leftovers = [] if group else await transport.process_descendants(pid, start_ticks)
    if await _signal(transport, fence, pid, start_ticks, "TERM", group) == "gone":
        how = "it was already gone"
    elif await _wait_gone(transport, pid, grace_s):
        how = "stopped"
    else:
        if await _signal(transport, fence, pid, start_ticks, "KILL", group) != "gone" and \
                not await _wait_gone(transport, pid, 10.0):
            raise EngineError(f"process {pid} did not die after SIGKILL; the host needs a look")
        how = "killed after the grace period"
    stopped = await _stop_leftovers(transport, fence, leftovers) if leftovers else 0
    if stopped:
        how += ("; 1 child process outlived it and was stopped too" if stopped == 1 else
                f"; {stopped} child processes outlived it and were stopped too")
    return how


async def _signal(transport: Transport, fence: HostFence, pid: int, ticks: int, signal: str, group: bool) -> str:
    """``sent`` or ``gone``; a pid now held by another process counts as gone (ours is), any other refusal raises."""
    result = await transport.signal_process(pid, ticks, signal, group=group, fence=fence)
    if result.outcome == "refused" and result.reason == "reused":
        return "gone"
    if result.outcome == "refused":
        raise EngineError(f"cannot stop process {pid}: {result.detail}")
    return result.outcome


async def _wait_gone(transport: Transport, pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while await transport.is_alive(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


async def _stop_leftovers(transport: Transport, fence: HostFence, leftovers: list[tuple[int, int]]) -> int:
    """TERM the descendants still alive (same start ticks), KILL those that outlive the grace; how many."""
    sent = [(p, t) for p, t in leftovers if await _signal(transport, fence, p, t, "TERM", False) == "sent"]
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    alive = list(sent)
    while alive and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        alive = [(p, t) for p, t in alive if await transport.is_alive(p)]
    for p, t in alive:
        await _signal(transport, fence, p, t, "KILL", False)
    return len(sent)
