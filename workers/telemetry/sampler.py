"""Samples the host's GPUs and the engine's ``/metrics`` while one bench level runs.

Each tick runs two bounded one-shot commands through the host transport, ``nvidia-smi --query-gpu=...``
and ``nvidia-smi dmon -s pucvmt -c 1`` (PCIe rx/tx exists only in dmon), and scrapes ``/metrics`` (not of an
engine whose folder says it serves no load gauges: ``metrics_url`` is None, ``metrics_none`` says why). One-shot
rather than a streaming ``-lms N``: the transport runs commands to completion under a timeout, so a
sampler can never leave a looping nvidia-smi behind on a shared host when a worker dies mid-level; the
cost is one exec per tick (the bench/telemetry_cost.py figure). Reading is not a side effect, so no
fence check is needed; nothing here writes to the host.

A scrape never disturbs the load it measures (issue 39 round 4, item 4): the load generator may run on this
very event loop, so the ``/metrics`` body is parsed in a thread (bounded: :mod:`workers.telemetry.server_metrics`),
its CPU time is kept with the sample, and the next scrape waits until the sampler's CPU stays under
:data:`MAX_SHARE` of the time (a large body is scraped less often, not every tick). A level whose sampler
still took noticeable CPU in the client's process says so (``telemetry.sampler`` of its summary).

Telemetry is best effort: a failed command or scrape is a missing sample, a host without nvidia-smi is
noted once per run (``RunTelemetry.gpu_missing``) and never asked again, and nothing here raises into
the bench.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from workers.capped_http import capped_client
from workers.json_value import JsonObject
from workers.telemetry.gpu_parse import QUERY_FIELDS, GpuReading, PcieReading, parse_dmon, parse_query
from workers.telemetry.server_latency import LevelScrapes
from workers.telemetry.server_metrics import ServerReading, parse_server_metrics

DEFAULT_INTERVAL_S = 0.5
#: ``RunTelemetry.gpu_missing`` of a host without GPUs (``gpus = 0``, vLLM's CPU build): nvidia-smi is never
#: asked and nothing GPU-side is missing; the level says ``no_gpus`` and its server-side samples stay.
NO_GPUS = "the host has no GPUs"
COMMAND_TIMEOUT_S = 5.0
QUERY_ARGS = (f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits")
DMON_ARGS = ("dmon", "-s", "pucvmt", "-c", "1")
#: The most of the wall time the ``/metrics`` parse may take in CPU: the next scrape waits until it is so.
MAX_SHARE = 0.05


def parse_timed(body: bytes) -> tuple[ServerReading, float]:
    """(the reading, the CPU seconds its parse took in this thread): run off the event loop."""
    start = time.thread_time()
    reading = parse_server_metrics(body.decode("utf-8", "replace"))
    return reading, time.thread_time() - start


class _Runner(Protocol):
    """What the sampler needs of a transport: ``run(argv, timeout=...)``."""

    async def run(self, argv: Sequence[str], *, timeout: float) -> object: ...


@dataclass(frozen=True)
class Sample:
    """One tick: seconds since the level started and whatever answered."""

    t_s: float
    gpus: tuple[GpuReading, ...]
    pcie: tuple[PcieReading, ...]
    server: ServerReading | None
    #: Why ``/metrics`` gave no reading this tick (``HTTP 404: ...``, ``ConnectError``), None when it did.
    server_error: str | None = None
    #: CPU seconds the scrape's parse took in this process (the client's, when it runs here), and the body's size.
    scrape_cpu_s: float = 0.0
    scrape_bytes: int = 0


@dataclass
class RunTelemetry:
    """State shared by a run's levels: whether the host has nvidia-smi (asked once) and what went missing."""

    transport: _Runner
    nvidia_smi: tuple[str, ...]
    metrics_url: str | None
    api_key: str | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    #: The engine's word on turning its ``/metrics`` on, said when the server answers 404 (its ``MetricNames``).
    metrics_off_hint: str = ""
    #: Why there is no ``metrics_url`` (its engine serves no load gauges), said for each tick instead of a reading.
    metrics_none: str = ""
    gpu_missing: str | None = None
    levels: list[list[Sample]] = field(default_factory=list)
    #: The server's latency histograms at each level's edges (its server view), None when it has none.
    latency: LevelScrapes | None = None
    #: ``time.monotonic()`` before which no scrape is sent (the last parse's CPU, paced to :data:`MAX_SHARE`).
    _scrape_after: float = 0.0

    async def _command(self, extra: Sequence[str]) -> str | None:
        if self.gpu_missing is not None:
            return None
        if not self.nvidia_smi:
            self.gpu_missing = "the host config names no nvidia-smi"
            return None
        try:
            result = await self.transport.run([*self.nvidia_smi, *extra], timeout=COMMAND_TIMEOUT_S)
        except Exception as exc:  # best effort: a transport failure is a missing sample
            text = str(exc)
            if "No such file" in text or "not found" in text:
                self.gpu_missing = f"no nvidia-smi on the host ({self.nvidia_smi[0]})"
            return None
        code = getattr(result, "returncode", 1)
        if code == 127:
            self.gpu_missing = f"no nvidia-smi on the host ({self.nvidia_smi[0]})"
            return None
        return str(getattr(result, "stdout", "")) if code == 0 else None

    async def _scrape(self, client: httpx.AsyncClient) -> tuple[ServerReading | None, str | None]:
        """(the reading, None), or (None, why there is none): a failed scrape is a missing sample, said why."""
        reading, why, _, _ = await self._scrape_timed(client)
        return reading, why

    async def _scrape_timed(self, client: httpx.AsyncClient) -> tuple[ServerReading | None, str | None, float, int]:
        """:meth:`_scrape` with the parse's CPU seconds and the body's size; paced (see :data:`MAX_SHARE`)."""
        if self.metrics_url is None:
            return None, self.metrics_none or "no /metrics URL", 0.0, 0
        if time.monotonic() < self._scrape_after:
            return None, "paced: the last /metrics parse was costly", 0.0, 0
        try:
            resp = await client.get(self.metrics_url)
        except Exception as exc:
            return None, type(exc).__name__, 0.0, 0
        if resp.status_code != 200:
            hint = f": {self.metrics_off_hint}" if resp.status_code == 404 and self.metrics_off_hint else ""
            return None, f"HTTP {resp.status_code}{hint}", 0.0, 0
        body = resp.content
        try:
            reading, cpu_s = await asyncio.to_thread(parse_timed, body)  # never on the load generator's loop
        except Exception as exc:
            return None, f"unreadable ({type(exc).__name__})", 0.0, len(body)
        self._scrape_after = time.monotonic() + cpu_s / MAX_SHARE
        return reading, None, cpu_s, len(body)

    async def _tick(self, client: httpx.AsyncClient, t0: float) -> Sample:
        t = time.monotonic() - t0
        query, dmon, (server, why, cpu_s, size) = await asyncio.gather(
            self._command(QUERY_ARGS), self._command(DMON_ARGS), self._scrape_timed(client)
        )
        gpus = tuple(parse_query(query)) if query else ()
        pcie = tuple(parse_dmon(dmon)) if dmon else ()
        return Sample(t, gpus, pcie, server, why, cpu_s, size)

    @contextlib.asynccontextmanager
    async def level(self, position: int = 0, load: float = 0.0) -> AsyncIterator[list[Sample]]:
        """Sample from entering until leaving (the level's run); the samples land in ``levels``."""
        samples: list[Sample] = []
        self.levels.append(samples)
        if self.latency is not None:
            self.latency.level_begins()
        stop = asyncio.Event()

        async def loop() -> None:
            t0 = time.monotonic()
            async with capped_client(
                headers={"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}, timeout=COMMAND_TIMEOUT_S
            ) as client:
                while not stop.is_set():
                    samples.append(await self._tick(client, t0))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), self.interval_s)

        task = asyncio.create_task(loop())
        try:
            yield samples
        finally:
            stop.set()
            try:
                await asyncio.wait_for(task, COMMAND_TIMEOUT_S + 1)
            except Exception:  # telemetry never fails the bench
                task.cancel()
            if self.latency is not None:
                await self.latency.level_end()

    def combine_level(self, index: int, summary: JsonObject, level: Mapping[str, object]) -> JsonObject:
        """What level ``index`` stores, from this host's ``summary`` of it: a sampler of several hosts (a gang's,
        :mod:`workers.gang.telemetry`) adds its other hosts' figures here; one host's is its summary."""
        return summary

    async def measured_start(self, position: int = 0) -> None:
        """The level's measured phase begins (its warmup is over): the server view's first scrape."""
        if self.latency is not None:
            await self.latency.measured_start()
