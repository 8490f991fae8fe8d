"""Stopping an engine on a host, only through fenced, identity-checked signals.

*Which* process: the one observed on the port, named by pid **and** start ticks, so a pid reused in
between is never hit (the host-side actuator checks ``/proc`` before every signal, under the fence).
*Whether* it may be stopped is the caller's rule (``workers/jobs/runner.py``: benchbot's own engine, or one the
process table identifies as an engine; anything else is a refusal naming it).

*How*: the whole process group only for an engine benchbot started, since benchbot created that
group (pid == pgid == sid). Anyone else's engine gets signals to its pid alone: its group may hold
its parent shell or a tmux pane. Its descendants, seen before the first signal (ppid + start
ticks), that outlive it (a TP worker holding GPU memory) are stopped one by one afterwards.

*After*: the settings file benchbot kept for the engine on that port (``HostFence.engine_settings_path``,
:mod:`workers.host.engine_env`) is removed with it, so nothing is left to be read as a later server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from workers.errors import BenchbotError, EngineError
from workers.host.transport import HostFence, Transport

STOP_GRACE_S = 20.0
LEFTOVER_GRACE_S = 5.0


async def stop_engine(
    transport: Transport,
    fence: HostFence,
    pid: int,
    start_ticks: int,
    *,
    group: bool,
    grace_s: float = STOP_GRACE_S,
    before_signal: Callable[[], None] | None = None,
) -> str:
    """Stop one identified engine: TERM, then KILL after ``grace_s``; say how it ended.

    ``group=True`` only for an engine benchbot started. ``before_signal()`` (the job's Redis fence check)
    runs before every signal and may raise to send none; the host checks its own fence as well. Raises
    EngineError when it cannot be signalled or survives SIGKILL, and LeaseLostError (stale fence) when
    another job claimed the host meanwhile.
    """
    check = before_signal or (lambda: None)
    leftovers = [] if group else await transport.process_descendants(pid, start_ticks)
    if await _signal(transport, fence, pid, start_ticks, "TERM", group, check) == "gone":
        how = "it was already gone"
    elif await _wait_gone(transport, pid, grace_s):
        how = "stopped"
    else:
        if await _signal(transport, fence, pid, start_ticks, "KILL", group, check) != "gone" and not await _wait_gone(
            transport, pid, 10.0
        ):
            raise EngineError(f"process {pid} did not die after SIGKILL; the host needs a look")
        how = "killed after the grace period"
    stopped = await _stop_leftovers(transport, fence, leftovers, check) if leftovers else 0
    with contextlib.suppress(BenchbotError):  # no secret in it; a file left over is overwritten by the next launch
        await transport.remove_engine_settings(fence)
    if stopped:
        how += (
            "; 1 child process outlived it and was stopped too"
            if stopped == 1
            else f"; {stopped} child processes outlived it and were stopped too"
        )
    return how


async def _signal(
    transport: Transport, fence: HostFence, pid: int, ticks: int, signal: str, group: bool, check: Callable[[], None]
) -> str:
    """``sent`` or ``gone``; a pid now held by another process counts as gone (ours is), any other refusal raises."""
    check()
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


async def _stop_leftovers(
    transport: Transport, fence: HostFence, leftovers: list[tuple[int, int]], check: Callable[[], None]
) -> int:
    """TERM the descendants still alive (same start ticks), KILL those that outlive the grace; how many."""
    sent = [(p, t) for p, t in leftovers if await _signal(transport, fence, p, t, "TERM", False, check) == "sent"]
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    alive = list(sent)
    while alive and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        alive = [(p, t) for p, t in alive if await transport.is_alive(p)]
    for p, t in alive:
        await _signal(transport, fence, p, t, "KILL", False, check)
    return len(sent)
