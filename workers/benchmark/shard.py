"""One shard of a level: one process, one event loop, its share of the prompts, sent and decoded.

A level runs as one shard on the caller's loop, or as several in spawned processes
(``workers.benchmark.sharding``); either way :func:`run_shard` warms up, waits at the start barrier,
runs the measured loop (closed or open) with the garbage collector off and a lag probe on, and only
then decodes the responses (``workers.benchmark.stream``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import resource
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from workers.benchmark.bodies import request_body
from workers.benchmark.cpu_wait import CpuWaitMark
from workers.benchmark.lag_probe import LagProbe
from workers.benchmark.limits import Budget
from workers.benchmark.loops import Gate, closed_loop, open_loop
from workers.benchmark.metrics import ClientLoad, RequestRecord, chunks
from workers.benchmark.prompts import Prompt
from workers.benchmark.senders import make_sender
from workers.benchmark.settings import ClientSettings
from workers.benchmark.stream import record_from_raw
from workers.benchmark.wire_apis import wire_api


@dataclass(frozen=True)
class ShardSpec:
    """Everything a shard needs, picklable so it can be shipped to a child process.

    ``settings`` is the level's (the spec as asked, the key, the model), without the dataset: the
    prompts are planned already. ``offsets_ns`` makes it an open loop: measured request ``i`` is sent
    ``offsets_ns[i]`` after the shard's start, whatever is in flight; without it the shard keeps
    ``concurrency`` in flight.
    """

    base_url: str
    settings: ClientSettings
    concurrency: int
    warmup: tuple[Prompt, ...]
    measured: tuple[Prompt, ...]
    offsets_ns: tuple[int, ...] | None = None
    gate: Gate | None = None
    keep_events: bool = False

    def budget(self) -> Budget:
        """The bounds for this shard's responses: the spec's limits, sized for its longest asked output."""
        tokens = max((p.output_tokens for p in (*self.warmup, *self.measured)), default=0)
        return self.settings.spec.limits.budget(tokens)


@dataclass(frozen=True)
class ShardOutput:
    records: tuple[RequestRecord, ...]
    load: ClientLoad
    scheduled_ns: tuple[int, ...] = ()  # open loop: each record's due send time (perf_counter_ns)
    stopped: str | None = None  # open loop: why the pacer stopped early, if it did


def _raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


async def run_shard(spec: ShardSpec, barrier: Callable[[], Awaitable[None]] | None = None) -> ShardOutput:
    """Warm up, wait at ``barrier`` (multi-process start), run the measured loop (closed or open), decode."""
    settings = spec.settings
    api = settings.spec.api
    in_flight = spec.concurrency if spec.offsets_ns is None else len(spec.measured)
    _raise_fd_limit(4 * in_flight + 256)
    headers = {"Content-Type": "application/json"}
    if settings.api_key:
        headers["Authorization"] = f"Bearer {settings.api_key}"

    def bodies(prompts: Sequence[Prompt]) -> list[bytes]:
        return [request_body(settings, p) for p in prompts]

    loop_name = "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
    sender = make_sender(spec.base_url, wire_api(api).path, headers, spec.budget(), settings.client)
    scheduled: list[int] = []
    stopped = None
    try:
        if spec.warmup:
            await closed_loop(sender.send, bodies(spec.warmup), spec.concurrency, spec.gate)
        if spec.gate is not None:
            spec.gate()
        await sender.open_connections(min(spec.concurrency, len(spec.measured)))
        measured = bodies(spec.measured)
        if barrier is not None:
            await barrier()
        gc_was_enabled = gc.isenabled()
        gc.collect()
        gc.disable()  # a full collection over many live buffers is a multi-ms pause in the timing path
        probe = LagProbe()
        probe.start()
        cpu0, wall0, wait0 = time.process_time(), time.perf_counter(), CpuWaitMark.take()
        try:
            if spec.offsets_ns is None:
                items = await closed_loop(sender.send, measured, spec.concurrency, spec.gate)
            else:
                items, scheduled, stopped = await open_loop(sender.send, measured, spec.offsets_ns, spec.gate)
        finally:
            cpu1, wall1, wait1 = time.process_time(), time.perf_counter(), CpuWaitMark.take()
            lags = await probe.stop()
            if gc_was_enabled:
                gc.enable()
    finally:
        await sender.close()
    raws = [sender.finish(item) for item in items]
    offset = time.time() - time.perf_counter()
    if spec.offsets_ns is None:
        prompts: Sequence[Prompt] = spec.measured[: len(raws)]
    else:
        prompts = [spec.measured[i] for i in range(len(raws))]
    records = tuple(
        record_from_raw(r, api, p.input_tokens, offset, spec.keep_events, p.exact_input)
        for r, p in zip(raws, prompts, strict=True)
    )
    run_delay, pressure = wait1.since(wait0)
    load = ClientLoad(
        wall_s=wall1 - wall0,
        cpu_s=(cpu1 - cpu0,),
        chunks=sum(len(chunks(r)) for r in records),
        lag_ms=tuple(lags),
        loop=loop_name,
        run_delay_s=(run_delay,),
        pressure_s=pressure,
    )
    return ShardOutput(records, load, tuple(scheduled), stopped)
