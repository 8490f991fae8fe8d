"""What every job body stands on: the host claimed for the job, its transport, and what the job started.

:func:`with_transport` opens the host's transport for a job, claims the host for the job's fence (the
host-side actuator then refuses any older job's action) and stops what a dead launch left half-started
before the body runs; :func:`kill_started` stops what this job started when it is cancelled or fails.
:func:`host_fence` is the claim every fenced action on the host carries.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import redis

from workers import observer
from workers.config import Config, HostConfig
from workers.errors import LeaseLostError
from workers.host import engine_stop
from workers.host.connect import open_transport
from workers.host.transport import HostFence, NewerClaimError, Transport
from workers.jobs import events, faults
from workers.jobs.context import JobContext
from workers.jobs.effects import EffectJournal
from workers.jobs.events import ProgressPhase
from workers.jobs.outcomes import ReadyData

T = TypeVar("T")


@dataclass
class JobState:
    """What this job started on the host, so a cancel or failure can clean it up."""

    started_pgid: int | None = None
    started_instance: str | None = None
    started_ticks: int = 0  # with the pid, what the host checks before signalling it
    fence: HostFence | None = None  # the claim it was started under


@dataclass
class HostJob:
    """What a job body works with on its host: the job's context, this worker's config, the host's entry and
    its open transport, and what the body started there (stopped again if the job is cancelled)."""

    ctx: JobContext
    config: Config
    host: HostConfig
    transport: Transport
    started: JobState = field(default_factory=JobState)


def host_fence(ctx: JobContext, host: HostConfig) -> HostFence:
    """This job's claim on the host, as the host-side actuator checks it before every side effect: its
    token, and the lease's proven deadline (the host refuses an action that arrives after it)."""
    if ctx.fence is None or ctx.lease is None:
        raise LeaseLostError("this job holds no lease on the host")
    return HostFence.for_port(host.log_dir, host.port, ctx.fence, deadline=ctx.lease.checker.deadline)


async def claim(ctx: JobContext, host: HostConfig, transport: Transport) -> None:
    """Claim the host for this job's fence; when the host holds a newer token although Redis granted no
    lease after ours, Redis lost its fence counter (an embedded Redis restarted): take a fence above the
    host's and claim again, instead of every job on the host failing as stale until someone removes the
    fence file (issue 25 item 7)."""
    try:
        await transport.claim_host(host_fence(ctx, host))
    except NewerClaimError as exc:
        if not ctx.refence_above(exc.stored):
            raise
        ctx.progress(
            ProgressPhase.CLEANUP,
            f"Redis had lost its fence counter ({host.name}'s fence file holds {exc.stored}): "
            f"this job now holds fence {ctx.fence}",
        )
        await transport.claim_host(host_fence(ctx, host))


async def with_transport(
    host: HostConfig,
    body: Callable[[Transport], Awaitable[T]],
    *,
    ctx: JobContext | None = None,
    config: Config | None = None,
) -> T:
    """Open the host's transport for the job's duration (first clearing what a dead launch left)."""
    transport = open_transport(host)
    journal = EffectJournal(ctx.redis, host.name, ctx.job_id) if ctx is not None else None
    transport.on_effect = journal
    try:
        if ctx is not None and config is not None:
            await claim(ctx, host, transport)  # the host now refuses older jobs' actions
            await stop_half_started(ctx, config, host, transport)
        return await body(transport)
    finally:
        if journal is not None:
            await journal.drain()
        with contextlib.suppress(Exception):
            await transport.close()


def _reached_ready(r: redis.Redis, job_id: str, instance: str | None) -> bool:
    """True if ``job_id`` published ``ready`` for ``instance`` (its smoke test passed)."""
    for e in events.job_events(r, job_id):
        ready = ReadyData.from_dict(e.data) if e.type == events.READY else None
        if ready is not None and ready.config.instance_id == instance:
            return True
    return False


async def stop_half_started(ctx: JobContext, config: Config, host: HostConfig, transport: Transport) -> None:
    """Stop a server whose launching job ended before it was ready (its worker was killed, it timed out).

    Nobody verified such a server, so nobody may measure it; and only the next job on the host, under
    the lease, can safely touch it. Found through the launch record (pid + start tick, so a reused pid
    is never hit), whether or not it listens on the port yet.
    """
    r = ctx.redis
    record = observer.launched_record(r, host.name)
    if record is None or str(record.job) == ctx.job_id:
        return
    job, instance = str(record.job), record.instance_id
    ending = events.terminal_type(r, job)
    if ending in (None, events.SUCCEEDED) or _reached_ready(r, job, instance):
        return
    pid = record.pid
    info = await transport.process_info(pid) if pid and await transport.is_alive(pid) else None  # not a zombie
    if info is None or f"{host.name}:{info.pid}:{info.start_ticks}" != instance:
        return
    ctx.check(faults.BEFORE_SIGNAL)
    ctx.progress(
        ProgressPhase.CLEANUP,
        f"found the server job {job} left half-started (pid {pid}; the job {ending} before "
        "the server was ready): stopping it, nobody verified it",
    )
    await engine_stop.stop_engine(
        transport,
        host_fence(ctx, host),
        pid,
        info.start_ticks,
        group=info.pgid == pid,
        grace_s=5,
        before_signal=ctx.check_fence,
    )
    ctx.fenced_set(observer.LAUNCHED_FIELD, None)


async def kill_started(ctx: JobContext, transport: Transport, state: JobState) -> None:
    """Stop the server this job started (after a failure or a cancel), if the host is still ours.

    Without the lease it sends nothing: the next holder finds the server through the launch record
    (``stop_half_started``) or on the port.
    """
    if state.started_pgid is None or state.fence is None:
        return
    pgid, state.started_pgid = state.started_pgid, None
    try:
        ctx.check_fence(faults.BEFORE_SIGNAL)
    except LeaseLostError:
        return
    with contextlib.suppress(Exception):
        if await transport.is_alive(pgid):
            await engine_stop.stop_engine(
                transport, state.fence, pgid, state.started_ticks, group=True, grace_s=5, before_signal=ctx.check_fence
            )
