"""``/bench slo ...`` on a host: the loads the knee search asks for, measured one level at a time.

The search itself (which load next, where the knee is) is ``workers.benchmark.slo``; this module runs each
load it asks for as a one-level bench and keeps the measurements for the stored run.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from workers.benchmark import slo
from workers.benchmark.client import run_bench
from workers.benchmark.settings import client_settings
from workers.benchmark.spec import BenchSpec
from workers.config import Config, HostConfig
from workers.jobs.context import JobContext
from workers.jobs.events import ProgressPhase
from workers.json_value import JsonObject
from workers.telemetry import summary as telemetry_summary
from workers.telemetry.sampler import RunTelemetry


async def search_levels(
    ctx: JobContext, host: HostConfig, spec: BenchSpec, config: Config | None, tel: RunTelemetry | None = None
) -> tuple[tuple[JsonObject, ...], slo.SloResult]:
    """``/bench slo ...``: measure the loads the knee search asks for, one level at a time.

    Each load is one bench level (its own prompts); a load measured twice (the knee's confirmation)
    keeps its last measurement in the stored levels, and both in the search's points. ``tel`` samples the
    GPUs and ``/metrics`` around each level as a plain bench does, so a knee (every ``/tune`` trial) has its
    J/token: without it ``objective=tokens_per_joule`` had nothing to rank.
    """
    limits = slo.Slo(spec.slo, spec.slo_errors_pct if spec.slo_errors_pct is not None else slo.DEFAULT_MAX_ERROR_PCT)
    if spec.search_rates is not None:
        loads = slo.geometric_loads(*spec.search_rates, integer=False)
    else:
        loads = slo.geometric_loads(1, spec.search_max or 1)
    measured: dict[float, JsonObject] = {}

    on_progress = functools.partial(ctx.progress, ProgressPhase.BENCH)

    async def measure(load: float) -> slo.Measurement:
        one = replace(spec, slo=(), search_max=None, search_rates=None, repeat=1)
        one = replace(one, rates=(load,)) if spec.search_rates is not None else replace(one, levels=(int(load),))
        settings = client_settings(one, config, api_key=host.engine.api_key())
        unit = "rate" if spec.search_rates else "concurrency"
        ctx.progress(ProgressPhase.SLO, f"trying {unit} {load:g} ({limits.describe()})")
        first = len(tel.levels) if tel is not None else 0
        (level,) = await ctx.guard(
            run_bench(
                host.base_url,
                settings,
                on_progress=on_progress,
                gate=ctx.request_gate(),
                keep_records=True,
                around_level=tel.level if tel is not None else None,
                at_measured=tel.measured_start if tel is not None else None,
            )
        )
        (data,) = telemetry_summary.attach(tel, first, [level.metrics.to_dict()])
        measured[load] = data
        return slo.measurement_from_level(data, limits, level.records)

    result = await slo.search_async(measure, loads, limits)
    return tuple(measured[load] for load in sorted(measured)), result


def search_summary(spec: BenchSpec, result: slo.SloResult) -> str:
    return "SLO: " + result.summary("rate" if spec.search_rates else "concurrency")
