"""Port housekeeping: who owns the engine port, and stopping it when it is an engine benchbot can identify.

A process benchbot cannot identify as an engine is never signalled: the refusal names who holds the port.
An engine still loading owns the port too: a launch refuses to start a second one over it, ``/stop`` stops it.

Stopping what benchbot did not start is a decision, not a default (issue 39 round 4, item 2). An
unmanaged process is stopped (by ``/stop`` or a ``/launch`` replacing it) only when it is *shown* to be
that engine: its argv runs one of the engine's entry points, read as CPython reads it, **and** it answers
the engine's own API on the port (the observation's report, or a fenced, size-capped call by the driver of
the engine its argv names); or when an admin said so (``/stop HOST force``, checked again here against the
worker's own access list). Otherwise the refusal names it (pid, user, argv) and nothing is touched.
"""

from __future__ import annotations

import asyncio
import time

import redis

from workers import observer
from workers.config import HostConfig
from workers.engines import processes, registry
from workers.errors import BenchbotError, EngineError
from workers.host import engine_stop
from workers.host.command_text import describe_argv
from workers.host.transport import Transport
from workers.jobs import faults
from workers.jobs.context import JobContext
from workers.jobs.events import ProgressPhase
from workers.jobs.host_job import host_fence
from workers.jobs.outcomes import Stopped
from workers.observation import UNREAD_TABLE, ObservedState, RunningConfig


def owner_words(observed: RunningConfig) -> str:
    """``pid 123 (alice, job 17)`` / ``pid 123 (user bob, not started by benchbot)``: who owns the port."""
    process = observed.process
    who = observed.launched_by
    if observed.managed and who:
        owner = f"started by {who.user} with job {who.job}"
    else:
        owner = f"user {observed.owner_user or '?'}, not started by benchbot"
    since = process.start_time if process is not None else None
    age = f", up {max(0, int(time.time() - since)) // 60} min" if since else ""
    gpu = observed.owner_gpu_mib
    held = f", holding {gpu / 1024:.0f} GiB of GPU memory" if gpu else ""
    return f"pid {process.pid if process is not None else None} ({owner}{age}{held})"


def refuse_foreign_owner(host: HostConfig, observed: RunningConfig) -> None:
    """A process benchbot cannot identify as an engine is never signalled: say who it is, change nothing."""
    argv = " ".join(observed.process.argv if observed.process is not None else ())[:200]
    raise BenchbotError(
        f"port {host.port} on {host.name} is held by {owner_words(observed)}, running `{argv}`, which is not an "
        "engine benchbot can identify, so benchbot will not stop it. Free the port (ask whoever runs it), or "
        "give the host another port in the config."
    )


#: How long the identity call to an unmanaged engine may take (it is a plain read of the engine's own API).
IDENTITY_TIMEOUT_S = 5.0
#: States in which the server answered the host's engine's API as itself.
_ANSWERED = (ObservedState.RUNNING, ObservedState.STARTING)
_NOT_ANSWERED = {
    ObservedState.LOADING: "nothing listens there yet",
    ObservedState.NOT_ENGINE: "what answers there is not it",
    ObservedState.UNRESPONSIVE: "it did not answer",
}


async def answers_as_engine(ctx: JobContext, host: HostConfig, observed: RunningConfig) -> bool:
    """Did the unmanaged engine on the port answer its own engine's API? The observation already asked
    with the host's engine; an engine of another kind (its argv says which) is asked by its own driver,
    fenced and size-capped like every control call."""
    family = processes.engine_family(observed.engine_kind)
    if family is None:
        return False
    if family == host.engine.kind:
        return observed.state in _ANSWERED
    if observed.state in (ObservedState.NONE, ObservedState.LOADING):
        return False
    ctx.check_fence()
    argv = observed.process.argv if observed.process is not None else None
    report = await registry.driver_for(family).report(host.base_url, host.engine.api_key(), IDENTITY_TIMEOUT_S, argv)
    return report.outcome in ("ok", "warming", "starting")


def refuse_unproven_engine(host: HostConfig, observed: RunningConfig) -> None:
    """An unmanaged process whose argv names an engine but which did not answer as one: named, untouched."""
    argv = " ".join(observed.process.argv if observed.process is not None else ())[:200]
    name = registry.display_name(processes.engine_family(observed.engine_kind) or host.engine.kind)
    raise BenchbotError(
        f"port {host.port} on {host.name} is held by {owner_words(observed)}, running `{argv}`: its command "
        f"line names {name}, but it does not answer {name}'s API on port {host.port} "
        f"({_NOT_ANSWERED.get(observed.state, str(observed.state))}), so "
        "benchbot will not stop a process it did not start and cannot show to be an engine. Ask whoever runs "
        f"it, or an admin may stop it with /stop {host.name} force."
    )


async def free_port(
    ctx: JobContext,
    r: redis.Redis,
    host: HostConfig,
    transport: Transport,
    *,
    stop_loading: bool = False,
    force: bool = False,
) -> Stopped | None:
    """Stop the engine that owns the engine port; return what it was (observed) or None when the port was free.

    Only an engine is stopped (benchbot's own, or an unmanaged one shown to be an engine: its argv and its
    own API, :func:`answers_as_engine`; ``force``: an admin's word for an unmanaged one not shown so);
    anything else on the port is a refusal naming the process. An engine still loading (no listener yet)
    owns the port too: a launch refuses to start a second engine over it, ``/stop`` (``stop_loading``)
    stops it (one benchbot did not start only with ``force``).
    """
    ctx.progress(ProgressPhase.OBSERVE, f"looking at what owns port {host.port} on {host.name}")
    before = await observer.observe_host(r, host, transport)
    process = before.process
    unread = before.extra.get(UNREAD_TABLE)
    if process is None and unread is not None:
        # An engine still loading shows only in the process table: an unread one is no proof the port is free.
        raise BenchbotError(
            f"nothing listens on port {host.port} of {host.name}, but its process table could not be read "
            f"({unread}): an engine still loading there would not show, so benchbot cannot tell whether the port "
            "is free and touches nothing. Try again in a moment."
        )
    if process is None:
        return None
    if not before.engine_kind:
        refuse_foreign_owner(host, before)
    if before.state == ObservedState.LOADING and not stop_loading:
        raise BenchbotError(
            f"an engine is loading on {host.name} for port {host.port}: {owner_words(before)}. It owns the port "
            f"and the GPUs, so benchbot will not start a second engine over it. Wait until it is ready (then "
            f"/launch replaces it), or "
            + (
                f"/stop {host.name} to stop it first."
                if before.managed
                else f"ask an admin to /stop {host.name} force."
            )
        )
    if not before.managed and not force and not await answers_as_engine(ctx, host, before):
        refuse_unproven_engine(host, before)
    owner = "benchbot's" if before.managed else "an unmanaged"
    what = "loading engine" if before.state == ObservedState.LOADING else "server"
    ctx.check(faults.BEFORE_SIGNAL)
    ctx.progress(
        ProgressPhase.STOP,
        f"stopping {owner} {what} on port {host.port} (pid {process.pid}): {before.summary or 'unknown config'}",
    )
    pid = process.pid
    # its group only if benchbot created it (our launch record's instance); anyone else's engine: its pid
    how = await engine_stop.stop_engine(
        transport,
        host_fence(ctx, host),
        pid,
        process.start_ticks,
        group=bool(before.managed) and process.pgid == pid,
        before_signal=ctx.check_fence,
    )
    ctx.did(f"the engine was stopped (pid {pid})")  # a cancel from here on cannot bring it back
    await wait_port_free(transport, host.port)
    return Stopped(config=before, how=how)


async def wait_port_free(transport: Transport, port: int, timeout_s: float = 15.0) -> None:
    """Wait until nobody listens on ``port`` (a dying server may hold it a moment longer)."""
    deadline = time.monotonic() + timeout_s
    while await transport.listener_pid(port) is not None:
        if time.monotonic() > deadline:
            raise EngineError(f"port {port} is still taken after stopping its server")
        await asyncio.sleep(0.1)


async def who_else_listens(transport: Transport, port: int, our_pgid: int) -> str | None:
    """None when the process listening on ``port`` is in our spawned process group; else who it is."""
    pid = await transport.listener_pid(port)
    if pid is None:
        return "a process benchbot cannot see (another user's?)"
    info = await transport.process_info(pid)
    if info is not None and info.pgid == our_pgid:
        return None
    argv = describe_argv(info.argv) if info is not None and info.argv else "argv unknown"
    return f"another process (pid {pid}: {argv})"
