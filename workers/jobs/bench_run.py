"""A measured bench: observe, check it is the server meant, run every level, observe again, store the run.

Shared by ``/bench``, ``launch ... then bench`` and each sweep cell. The spec goes to the load generator as
it came in the payload (``workers.benchmark.settings.client_settings`` adds this worker's dataset and key);
a server that changed during the bench, or levels that mostly failed, make the stored run invalid.
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace

import redis

from workers import observer
from workers.benchmark.client import run_bench
from workers.benchmark.settings import client_settings
from workers.benchmark.spec import DEFAULT_API, BenchSpec
from workers.benchmark.stats import combine_repeats
from workers.config import Config, HostConfig
from workers.engines.registry import driver_for
from workers.errors import BenchbotError
from workers.host.transport import Transport
from workers.jobs import faults, profile_capture
from workers.jobs.context import JobContext
from workers.jobs.events import ProgressPhase
from workers.jobs.expectation import check_expectation
from workers.jobs.outcomes import BenchOutcome
from workers.jobs.payloads import Expectation
from workers.jobs.port_owner import owner_words
from workers.jobs.slo_run import search_levels, search_summary
from workers.json_value import JsonObject
from workers.observation import ObservedState
from workers.results import store, tables
from workers.results.labels import bench_label
from workers.results.record import RunRecord, mostly_failed
from workers.telemetry import run as telemetry
from workers.telemetry import summary as telemetry_summary


async def run_bench_measured(
    ctx: JobContext,
    r: redis.Redis,
    host: HostConfig,
    transport: Transport,
    spec: BenchSpec,
    *,
    expect: Expectation | None,
    label: str | None = None,
    kind: str = "bench",
    sweep_id: str | None = None,
    config: Config | None = None,
    sampler: telemetry.RunTelemetry | None = None,
) -> BenchOutcome:
    """Observe, check it's the config meant, bench every level, observe again, store the run.

    ``config`` is the worker's (dataset names resolve there); without it only a spec that names no
    dataset can run. ``sampler`` samples the levels instead of ``host``'s own sampler (a gang's
    bench: every member's GPUs, ``workers.gang.telemetry.for_gang``).
    """
    ctx.progress(ProgressPhase.OBSERVE, "observing the server before the bench")
    before = await observer.observe_host(r, host, transport)
    if before.state == ObservedState.LOADING:
        raise BenchbotError(
            f"the engine on {host.name}:{host.port} is still loading ({owner_words(before)}): "
            "bench it once it is ready (/status shows when)"
        )
    if before.state == ObservedState.STARTING:  # a warming server's numbers would be the warm-up's
        raise BenchbotError(
            f"the server on {host.name}:{host.port} is warming up ({before.detail or 'not ready yet'}): "
            "bench it once it is ready (/status shows when)"
        )
    if before.state != ObservedState.RUNNING:
        raise BenchbotError(
            f"nothing is serving on {host.name}:{host.port} ({before.state}): "
            "/launch first, or /status to see what is there"
        )
    mismatch = check_expectation(expect, before, observer.launched_record(r, host.name))
    if mismatch:
        raise BenchbotError(
            f"refusing to benchmark under a wrong label: {mismatch}. "
            "Run /bench again, or add 'any' to measure whatever runs."
        )
    ctx.check(faults.BEFORE_BENCH)
    spec = engine_bench_spec(host, spec)
    profiler = profile_capture.for_bench(
        driver_for(host.engine.kind),
        host,
        transport,
        spec,
        before.process.argv if before.process else (),
        ctx.job_id,
        functools.partial(ctx.check_fence, faults.BEFORE_BENCH_REQUEST),
    )
    host_facts = await telemetry.host_extra(host, transport, before.engine_version)  # read-only, best effort
    tel = sampler or telemetry.for_host(host, transport)
    if spec.is_search:
        levels, search = await search_levels(ctx, host, spec, config, tel)
    else:
        levels, search = await _bench_levels(ctx, host, spec, config, tel, profiler), None
    ctx.progress(ProgressPhase.OBSERVE, "observing the server after the bench")
    after = await observer.observe_host(r, host, transport)
    valid, reason = True, None
    if after.instance_id != before.instance_id:
        valid = False
        reason = (
            f"the server changed during the bench: instance {before.instance_id} became "
            f"{after.instance_id or 'nothing'}"
        )
    elif after.fingerprint != before.fingerprint:
        valid = False
        reason = "the server's config changed during the bench"
    elif failed := mostly_failed(levels):
        valid, reason = False, failed
    record = RunRecord(
        id=store.new_run_id(r),
        job_id=ctx.job_id,
        user=ctx.user,
        host=host.name,
        created_at=time.time(),
        label=label or bench_label(before, store.baseline_for(r, host.name)),
        tags=(),
        kind=kind,
        sweep_id=sweep_id,
        config=before.to_dict(),  # the stored run is JSON: the observation's edge
        config_after=after.to_dict(),
        valid=valid,
        invalid_reason=reason,
        params=spec.to_dict(),
        levels=levels,
        status="ok",
        diagnosis=None,
        extra={
            **({"slo": search.to_dict(), "slo_summary": search_summary(spec, search)} if search else {}),
            **telemetry_summary.run_extra(levels),
            **({"profile": profiler.result.to_dict()} if profiler and profiler.result else {}),
            **host_facts,
        },
    )
    ctx.check()  # a cancelled (or no longer fenced) bench stores nothing
    run_id = store.save_run(r, record)
    table = tables.format_levels_table(record)
    if search is not None:
        table += "\n" + search_summary(spec, search)
    if profiler and profiler.result:
        table += "\n" + profile_capture.describe(profiler.result, bool(spec.rates))
    return BenchOutcome(run_id=run_id, valid=valid, invalid_reason=reason, table=table)


def engine_bench_spec(host: HostConfig, spec: BenchSpec) -> BenchSpec:
    """``spec`` in an API the host's engine serves: a plain ``/bench`` (api ``generate``, SGLang's native API)
    on vLLM, which has no ``/generate``, uses its OpenAI ``completions``; the stored params say so."""
    driver = driver_for(host.engine.kind)
    if spec.api == DEFAULT_API and driver.default_bench_api != DEFAULT_API:
        return replace(spec, api=driver.default_bench_api)
    return spec


async def _bench_levels(
    ctx: JobContext,
    host: HostConfig,
    spec: BenchSpec,
    config: Config | None,
    tel: telemetry.RunTelemetry | None = None,
    profiler: profile_capture.LevelProfile | None = None,
) -> tuple[JsonObject, ...]:
    """Every level of ``spec``, ``repeat`` times over (each sweep with fresh prompts): one dict per level.

    An engine that counts speculative decoding server-side (vLLM's ``vllm:spec_decode_*``) is benched one
    level at a time, its counters read around each, so each level reports its own acceptance length
    (warmup requests included); SGLang reports it per request and runs all levels in one go.
    """
    settings = client_settings(spec, config, api_key=host.engine.api_key())
    driver = driver_for(host.engine.kind)
    key = host.engine.api_key()

    on_progress = functools.partial(ctx.progress, ProgressPhase.BENCH)

    async def one_sweep() -> list[JsonObject]:
        around = profile_capture.combine(tel.level if tel is not None else None, profiler.level if profiler else None)
        first = len(tel.levels) if tel is not None else 0
        measured = tel.measured_start if tel is not None else None
        bench = functools.partial(
            run_bench, host.base_url, on_progress=on_progress, around_level=around, at_measured=measured
        )
        if await driver.spec_decode(host.base_url, key) is None:
            done = await ctx.guard(bench(settings, gate=ctx.request_gate()))
            return telemetry_summary.attach(tel, first, [level.metrics.to_dict() for level in done])
        out = []
        for load in spec.loads():
            one = replace(settings, spec=spec.at_load(load))
            before = await driver.spec_decode(host.base_url, key)
            (level,) = await ctx.guard(bench(one, gate=ctx.request_gate()))
            after = await driver.spec_decode(host.base_url, key)
            data = level.metrics.to_dict()
            if data.get("spec_accept_length") is None and after is not None:
                data["spec_accept_length"] = after.accept_length_since(before)
            out.append(data)
        return telemetry_summary.attach(tel, first, out)

    if spec.repeat == 1:
        return tuple(await one_sweep())  # one run per level: nothing to combine
    sweeps = []
    for number in range(1, spec.repeat + 1):
        ctx.progress(ProgressPhase.BENCH, f"repeat {number} of {spec.repeat}")
        sweeps.append(await one_sweep())
    return combine_repeats(sweeps)
