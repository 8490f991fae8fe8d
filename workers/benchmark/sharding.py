"""Sharding a level: its prompts dealt over shards, the shards run on this loop or in processes, merged.

One event loop handles ~256 streams at 100 tok/s with sub-ms lag (docs/metrics.md, "Processes");
beyond that a level is sharded over spawned processes, each with its own uvloop and its share of the
prompts, started together at a barrier. A closed loop splits its concurrency; an open loop deals its
schedule out round robin, so each process paces every P-th arrival from the same start.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from multiprocessing.connection import Connection

from workers.benchmark.loops import Gate
from workers.benchmark.metrics import ClientLoad
from workers.benchmark.prompts import Prompt
from workers.benchmark.schedule import ArrivalSchedule
from workers.benchmark.settings import ClientSettings
from workers.benchmark.shard import ShardOutput, ShardSpec, run_shard
from workers.errors import BenchbotError, LeaseLostError

STREAMS_PER_PROCESS = 256
#: An open loop's expected time in flight per request, to size its client processes (streams ~ rate x this).
OPEN_LOOP_EXPECTED_S = 4.0
#: What a shard process sends its parent: ("ready" | "done" | "lease_lost" | "failed", its output or message).
Reply = tuple[str, object]


def plan_shards(
    base_url: str,
    settings: ClientSettings,
    load: float,
    measured: Sequence[Prompt],
    warm: Sequence[Prompt],
    arrivals: ArrivalSchedule | None,
    *,
    gate: Gate | None,
    keep_events: bool,
) -> list[ShardSpec]:
    """The level's shards: how many processes, and each one's concurrency, prompts and send offsets.

    ``arrivals`` is the open loop's schedule (``None``: a closed loop at concurrency ``load``).
    """
    n = len(measured)
    if arrivals is not None:
        streams = max(1, min(n, math.ceil(load * OPEN_LOOP_EXPECTED_S)))
        warm_conc = min(max(1, math.ceil(load)), 8)
    else:
        streams = warm_conc = int(load)
    nproc = auto_processes(streams) if settings.processes is None else max(1, settings.processes)
    nproc = min(nproc, streams, n)
    shipped = settings.without_dataset()
    warm_parts = deal(warm, split_count(len(warm), nproc))
    if arrivals is None:
        return [
            ShardSpec(base_url, shipped, c, tuple(w), tuple(m), None, gate, keep_events)
            for c, w, m in zip(
                split_count(streams, nproc), warm_parts, deal(measured, split_count(n, nproc)), strict=True
            )
        ]
    offsets = arrivals.offsets_ns()
    mine = [range(k, n, nproc) for k in range(nproc)]  # round robin: same start, every P-th
    return [
        ShardSpec(
            base_url,
            shipped,
            max(1, warm_conc // nproc),
            tuple(w),
            tuple(measured[i] for i in idx),
            tuple(offsets[i] for i in idx),
            gate,
            keep_events,
        )
        for w, idx in zip(warm_parts, mine, strict=True)
    ]


async def run_shards(
    specs: Sequence[ShardSpec], at_measured: Callable[[], Awaitable[None]] | None = None
) -> list[ShardOutput]:
    """One shard on the caller's loop; several in as many processes. ``at_measured`` runs once all have
    warmed up, before the measured phase (the one shard's barrier; the processes' start signal waits for it)."""
    if len(specs) == 1:
        return [await run_shard(specs[0], at_measured)]
    return await _run_processes(specs, at_measured)


def merged_load(outs: Sequence[ShardOutput]) -> ClientLoad:
    """The client's load over every shard: the longest wall time, each process's CPU and lag."""
    if len(outs) == 1:
        return outs[0].load
    return ClientLoad(
        wall_s=max(o.load.wall_s for o in outs),
        cpu_s=tuple(c for o in outs for c in o.load.cpu_s),
        chunks=sum(o.load.chunks for o in outs),
        lag_ms=tuple(x for o in outs for x in o.load.lag_ms),
        loop=outs[0].load.loop,
        run_delay_s=tuple(d for o in outs for d in o.load.run_delay_s),
        pressure_s=max((o.load.pressure_s for o in outs if o.load.pressure_s is not None), default=None),
    )


def deal(items: Sequence[Prompt], sizes: Sequence[int]) -> list[list[Prompt]]:
    """Consecutive slices of ``items`` of the given sizes."""
    out, at = [], 0
    for size in sizes:
        out.append(list(items[at : at + size]))
        at += size
    return out


def _child_main(conn: Connection, spec: ShardSpec) -> None:
    """Entry point of a shard process: its own uvloop, a start barrier driven by the parent."""
    import uvloop

    async def barrier() -> None:
        conn.send(("ready", None))
        _, start_ns = await asyncio.to_thread(conn.recv)
        delay = (start_ns - time.perf_counter_ns()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)

    try:
        out = uvloop.run(run_shard(spec, barrier))
        conn.send(("done", out))
    except LeaseLostError as exc:  # the parent re-raises it as what it is: the host is not ours
        conn.send(("lease_lost", str(exc)))
    except BaseException as exc:  # report anything to the parent rather than dying silently
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def split_count(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` whole shares, the first ones one larger when it does not divide."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def auto_processes(concurrency: int) -> int:
    """One loop handles ~256 streams at 100 tok/s with sub-ms lag; beyond that use one process per
    256 streams, but at most half the cores (the other half may be serving)."""
    return max(1, min(math.ceil(concurrency / STREAMS_PER_PROCESS), (os.cpu_count() or 1) // 2))


def _raise_lease_lost(replies: Sequence[Reply]) -> None:
    for kind, message in replies:
        if kind == "lease_lost":
            raise LeaseLostError(str(message))


async def _run_processes(
    specs: Sequence[ShardSpec], at_measured: Callable[[], Awaitable[None]] | None = None
) -> list[ShardOutput]:
    """Each shard in a spawned process with its own uvloop, started together after all are ready."""
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    try:
        for spec in specs:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_child_main, args=(child, spec), daemon=True)
            proc.start()
            child.close()
            pipes.append(parent)
            procs.append(proc)

        async def receive(conn: Connection) -> Reply:
            try:
                return await asyncio.to_thread(conn.recv)
            except EOFError:
                return ("failed", "bench process exited without a result")

        ready = await asyncio.gather(*(receive(c) for c in pipes))
        _raise_lease_lost(ready)
        failed = [m for kind, m in ready if kind == "failed"]
        if failed:
            raise BenchbotError(f"A bench client process failed before the run: {failed[0]}")
        if at_measured is not None:
            await at_measured()
        start_ns = time.perf_counter_ns() + 50_000_000
        for conn in pipes:
            conn.send(("go", start_ns))
        done = await asyncio.gather(*(receive(c) for c in pipes))
        _raise_lease_lost(done)
        failed = [m for kind, m in done if kind == "failed"]
        if failed:
            raise BenchbotError(f"A bench client process failed during the run: {failed[0]}")
        return [m for kind, m in done if kind == "done" and isinstance(m, ShardOutput)]
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for conn in pipes:
            conn.close()
