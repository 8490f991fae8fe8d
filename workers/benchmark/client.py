"""Streaming load generator for SGLang-style and OpenAI-compatible servers: every level of one bench request.

:func:`run_bench` takes the request as the grammar made it (:class:`~workers.benchmark.spec.BenchSpec`,
inside :class:`~workers.benchmark.settings.ClientSettings` with what only the worker knows) and runs its
levels in order; each level is :func:`workers.benchmark.level.run_level`. The client's modules, one job
each:

- ``settings``: the one place a spec and the worker's config become what the client runs;
- ``wire_apis``: the table of request APIs (path, body, stream reader, prompt shape per API);
- ``bodies``: each request's JSON; ``prompts``: what each request says (ids, text, a prefix, a dataset);
- ``senders`` (over ``wire``, the plain-http hot path): one streamed request, stamped per read;
- ``loops``: closed loop (exactly C in flight) or open loop (on a ``schedule``); ``lag_probe``: the
  client's own event-loop lag;
- ``shard`` (one process, one loop) and ``sharding`` (a level over several processes);
- ``stream``: SSE parsing and decoding, after the level; ``metrics``: what a level reports, and its
  progress line.

Accuracy first (docs/metrics.md, "Client accuracy" and "Open-loop arrivals", says why): per read the
hot path only stamps ``perf_counter_ns()`` and keeps the bytes; parsing happens after the level; output
tokens come from the server; prompts are generated locally by default (different per request so the
prefix cache cannot help, unless a shared prefix is asked for); the client measures its own CPU and lag
and flags a level it could not keep up with. An optional ``gate()`` runs before every request (a job's
lease fence check: a worker that lost its host stops sending at once). Every response is bounded
(``workers.benchmark.limits``); a request cut by a bound is an error naming the option, and the level
counts them (``LevelMetrics.cut``). Metric definitions: ``workers.benchmark.metrics`` and docs/metrics.md.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Awaitable, Callable

from workers.benchmark.level import LevelResult, run_level, with_model
from workers.benchmark.loops import Gate
from workers.benchmark.metrics import describe
from workers.benchmark.settings import ClientSettings
from workers.benchmark.wire_apis import wire_api


async def run_bench(
    base_url: str,
    settings: ClientSettings,
    *,
    on_progress: Callable[[str], None] | None = None,
    gate: Gate | None = None,
    keep_records: bool = False,
    around_level: Callable[[int, float], contextlib.AbstractAsyncContextManager[object]] | None = None,
    at_measured: Callable[[int], Awaitable[None]] | None = None,
) -> list[LevelResult]:
    """Run every level of the spec in order against one server; progress lines go to ``on_progress``.

    ``around_level(position, load)`` is entered just before a level and left just after it (the
    worker's GPU telemetry sampler: it samples exactly while the level runs); ``at_measured(position)`` is
    awaited inside it once the level's warmup is over, just before its measured requests (the server
    view's first scrape of the engine's latency histograms).

    ``gate()`` runs before every request (so before each level's first); what it raises aborts the bench.
    ``keep_records`` returns each level's per-request records too (an SLO search counts good requests).
    """
    spec = settings.spec
    if wire_api(spec.api).needs_model and not settings.model:
        settings = await with_model(base_url, settings, gate)
    base_seed = settings.seed if settings.seed is not None else random.randrange(2**31)
    results = []
    for position, load in enumerate(spec.loads()):
        name = f"rate={load:g}/s" if spec.open_loop else f"c={int(load)}"
        if on_progress:
            on_progress(
                f"{name}: running {spec.requests_for(load)} requests ({spec.warmup_for(load)} warmup), "
                f"{settings.shape()}"
            )
        scope = around_level(position, load) if around_level else contextlib.nullcontext()
        async with scope:
            result = await run_level(
                base_url,
                settings,
                load,
                seed=base_seed * 1000 + position,
                gate=gate,
                keep_records=keep_records,
                at_measured=functools.partial(at_measured, position) if at_measured else None,
            )
        results.append(result)
        if on_progress:
            on_progress(describe(result.metrics))
    return results


def bench_sync(
    base_url: str, settings: ClientSettings, *, on_progress: Callable[[str], None] | None = None
) -> list[LevelResult]:
    """``run_bench`` on a fresh uvloop, for synchronous callers such as RQ jobs."""
    import uvloop

    return uvloop.run(run_bench(base_url, settings, on_progress=on_progress))
