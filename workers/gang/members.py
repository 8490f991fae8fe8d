"""Every member of a gang opened for the job, and the gang's ways of ending: stop every rank, prove each member free.

:func:`open_ranks` does for each member what ``host_job.with_transport`` does for one host: open its
transport (with the effect journal), claim the host for that member's fence and stop what a dead launch
left half-started there, every step under that member's fence check. :func:`stop_ranks` stops what this
job started, each rank by identity (its pid, process group and start tick: ``host_job.kill_started``);
:func:`prove_free` then shows each member's engine port (and the head's rendezvous port) unheld and no
process left on its GPUs, or says what still holds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from workers.config import Config, GroupConfig, HostConfig
from workers.gang.context import GangJobContext
from workers.gang.hosts import rank_host, rank_order
from workers.gang.ranks import Rank
from workers.host import simulated
from workers.host.connect import open_transport
from workers.host.transport import Transport
from workers.jobs.effects import EffectJournal
from workers.jobs.host_job import claim, kill_started, stop_half_started

#: How long a member's GPUs and ports may take to show free after its rank stopped.
FREE_TIMEOUT_S = 15.0
COMPUTE_APPS = ("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")


@contextlib.asynccontextmanager
async def open_ranks(ctx: GangJobContext, config: Config, group: GroupConfig) -> AsyncIterator[list[Rank]]:
    """Each member's transport, claimed for its fence and cleared of a dead launch's leftovers, as ranks."""
    ranks: list[Rank] = []
    journals: list[EffectJournal] = []
    try:
        for i, name in enumerate(rank_order(group)):
            host = rank_host(config, group, name)
            member = ctx.member(name)
            transport = open_transport(host)
            journal = EffectJournal(ctx.redis, name, ctx.job_id)
            transport.on_effect = journal
            ranks.append(Rank(i, host, member, transport))
            journals.append(journal)
            await claim(member, host, transport)  # the host now refuses older jobs' actions
            await stop_half_started(member, config, host, transport)
        yield ranks
    finally:
        await asyncio.gather(*(journal.drain() for journal in journals))
        for rank in ranks:
            with contextlib.suppress(Exception):
                await rank.transport.close()


async def stop_ranks(ranks: list[Rank]) -> None:
    """Stop every rank this job started, by identity, each after its member's fence check (none without it)."""
    await asyncio.gather(*(kill_started(rank.ctx, rank.transport, rank.state) for rank in ranks))


async def gpu_holders(host: HostConfig, transport: Transport) -> list[str] | None:
    """``pid 123 (4096 MiB)`` for each process on the host's GPUs; None when nvidia-smi could not say."""
    if host.gpus <= 0 or not host.nvidia_smi:
        return None
    try:
        result = await transport.run([*simulated.nvidia_smi_argv(host), *COMPUTE_APPS], timeout=10)
    except Exception:
        return None
    if getattr(result, "returncode", 1) != 0:
        return None
    rows = [line.split(",") for line in str(getattr(result, "stdout", "")).splitlines() if line.strip()]
    return [f"pid {row[0].strip()} ({row[1].strip() if len(row) > 1 else '?'} MiB)" for row in rows]


async def prove_free(host: HostConfig, transport: Transport, extra_ports: tuple[int, ...] = ()) -> str:
    """Wait (bounded) until nothing listens on the member's ports and nothing holds its GPUs; say which."""
    deadline = time.monotonic() + FREE_TIMEOUT_S
    while True:
        ports = [p for p in (host.port, *extra_ports) if await transport.listener_pid(p) is not None]
        holders = await gpu_holders(host, transport)
        if (not ports and not holders) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    port_words = ", ".join(str(p) for p in (host.port, *extra_ports))
    plural = "s" if extra_ports else ""
    said = [
        f"port{plural} {port_words}: {', '.join(map(str, ports))} still taken"
        if ports
        else f"port{plural} {port_words} free"
    ]
    if holders is None:
        said.append("GPUs not checked (nvidia-smi did not answer)")
    elif holders:
        said.append(f"GPUs still held by {', '.join(holders)}")
    else:
        said.append("GPUs free")
    return f"{host.name}: {', '.join(said)}"
