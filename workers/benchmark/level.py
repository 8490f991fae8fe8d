"""One level of a bench: its prompts planned, its arrivals drawn, its shards run, its metrics computed.

What the level sends comes from the spec inside :class:`~workers.benchmark.settings.ClientSettings`, read
where it is used: the lengths, the prefix and the API by the prompt planner, the arrival pattern by the
schedule, the counts by :meth:`~workers.benchmark.spec.BenchSpec.requests_for` / ``warmup_for``, the
response bounds by each shard. Errors are counted, never raised; what the gate raises aborts the level.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from workers.benchmark import schedule as arrivals_schedule
from workers.benchmark.loops import Gate
from workers.benchmark.metrics import LevelMetrics, RequestRecord, level_metrics
from workers.benchmark.prompts import plan_prompts
from workers.benchmark.settings import ClientSettings
from workers.benchmark.sharding import merged_load, plan_shards, run_shards
from workers.benchmark.wire_apis import wire_api
from workers.capped_http import capped_client
from workers.errors import BenchbotError
from workers.json_value import JsonObject


@dataclass(frozen=True)
class LevelResult:
    """The metrics of one level, plus the raw records when they were asked for (not stored by default)."""

    metrics: LevelMetrics
    records: tuple[RequestRecord, ...] = ()

    def to_dict(self) -> JsonObject:
        return self.metrics.to_dict()


async def run_level(
    base_url: str,
    settings: ClientSettings,
    load: float | None = None,
    *,
    seed: int = 0,
    gate: Gate | None = None,
    keep_records: bool = False,
    keep_events: bool = False,
    lag_limit_ms: float = arrivals_schedule.DEFAULT_LAG_LIMIT_MS,
    at_measured: Callable[[], Awaitable[None]] | None = None,
) -> LevelResult:
    """Run the spec at ``load`` (default: its only level): its warmup requests (not measured), then its
    measured ones, with exactly ``load`` in flight (closed loop) or arriving at ``load`` per second on a
    schedule drawn before the run (open loop).

    Runs on the caller's event loop when the level needs one process (use uvloop: ``bench_sync`` or
    ``uvloop.run``), else in spawned processes (``workers.benchmark.sharding``). ``keep_records`` returns
    the per-request records too; ``keep_events`` also keeps each token event's parsed JSON (e.g. a
    simulator's ``sim_t_emit``), which is memory-hungry. ``gate()`` runs before every request (a job's
    lease fence check); in several processes each gets a pickled copy. ``at_measured()`` is awaited once
    every shard has warmed up, just before the measured requests start.
    """
    spec = settings.spec
    if load is None:
        if len(spec.loads()) != 1:
            raise BenchbotError(f"Name the level to run: the spec has {len(spec.loads())} of them.")
        (load,) = spec.loads()
    if not spec.open_loop and (load != int(load) or load < 1):
        raise BenchbotError(f"A concurrency level is a whole number of at least 1, not {load:g}.")
    if wire_api(spec.api).needs_model and not settings.model:
        settings = await with_model(base_url, settings, gate)
    num_requests, warmup = spec.requests_for(load), spec.warmup_for(load)
    # One plan: the measured requests first, then the warmup ones (indices after them, so no prompt is shared).
    planned = plan_prompts(
        num_requests + warmup,
        seed,
        api=spec.api,
        input_len=spec.input_dist(),
        output_len=spec.output_dist(),
        prefix_tokens=spec.prefix_tokens,
        dataset=settings.dataset,
    )
    plan = None
    if spec.open_loop:
        plan = arrivals_schedule.make_schedule(load, pattern=spec.arrivals, num_requests=num_requests, seed=seed)
    shards = plan_shards(
        base_url,
        settings,
        load,
        planned[:num_requests],
        planned[num_requests:],
        plan,
        gate=gate,
        keep_events=keep_events,
    )
    outs = await run_shards(shards, at_measured)
    records = [r for o in outs for r in o.records]
    load_seen = merged_load(outs)
    if plan is None:
        metrics = level_metrics(records, int(load), [load_seen])
    else:
        scheduled = [t for o in outs for t in o.scheduled_ns]
        stopped = next((o.stopped for o in outs if o.stopped), None)
        lag = arrivals_schedule.schedule_lag(
            scheduled,
            [r.t_send_ns for r in records],
            limit_ms=lag_limit_ms,
            requested=len(plan),
            stopped=stopped,
        )
        info: arrivals_schedule.Arrivals = {
            **plan.to_dict(),
            "lag": lag.to_dict(),
            "from_schedule": arrivals_schedule.latencies_from_schedule(records, scheduled),
        }
        metrics = level_metrics(records, 0, [load_seen], rate=load, arrivals=info)
    return LevelResult(metrics, tuple(records) if keep_records or keep_events else ())


async def with_model(base_url: str, settings: ClientSettings, gate: Gate | None = None) -> ClientSettings:
    """``settings`` with the model the server serves: ``/v1/completions`` needs its name (control plane, httpx)."""
    import httpx

    if gate is not None:
        gate()
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    try:
        async with capped_client(timeout=10) as client:
            resp = await client.get(base_url.rstrip("/") + "/v1/models", headers=headers)
            resp.raise_for_status()
            return replace(settings, model=str(resp.json()["data"][0]["id"]))
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise BenchbotError(
            f"Could not read the model name from {base_url}/v1/models ({exc}); pass the model explicitly."
        ) from exc
