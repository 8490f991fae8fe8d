"""The bench job's side of telemetry: a sampler for the host and the host's fingerprint.

Kept out of ``workers/jobs/bench_run.py``; everything here is best effort (telemetry that fails is reported
missing, the bench goes on). The levels' summaries and the run's figures are :mod:`workers.telemetry.summary`'s
(``attach``, ``run_extra``): the level dicts go there once, not through here.
"""

from __future__ import annotations

from workers.config import HostConfig
from workers.engines import registry
from workers.host import simulated
from workers.telemetry import fingerprint
from workers.telemetry.sampler import NO_GPUS, RunTelemetry, _Runner
from workers.telemetry.server_latency import LatencyNames, LevelScrapes

__all__ = ["RunTelemetry", "for_host", "host_extra"]


def for_host(host: HostConfig, transport: _Runner) -> RunTelemetry:
    """A sampler for ``host``'s GPUs (its configured nvidia-smi) and its engine's ``/metrics`` (none for an engine
    that serves no load gauges: the run says why)."""
    names = registry.engine(host.engine.kind).metrics
    url = None if names.no_gauges else host.base_url.rstrip("/") + "/metrics"
    latency = LatencyNames.of(names)
    return RunTelemetry(
        transport,
        tuple(simulated.nvidia_smi_argv(host)),
        url,
        api_key=host.engine.api_key(),
        gpu_missing=NO_GPUS if host.gpus == 0 else None,  # a CPU host: no GPU to sample, none to miss
        metrics_off_hint=names.off_hint,
        metrics_none=names.no_gauges,
        latency=LevelScrapes(url, latency, host.engine.api_key()) if url and latency.any() else None,
    )


async def host_extra(
    host: HostConfig, transport: _Runner, engine_version: str | None
) -> dict[str, fingerprint.StoredFingerprint]:
    """``{"host_fingerprint": ...}`` for the stored run (:mod:`workers.telemetry.fingerprint`); never raises."""
    try:
        fp = await fingerprint.collect(
            transport, simulated.nvidia_smi_argv(host), host.engine.command, engine_version, gpus=host.gpus > 0
        )
    except Exception as exc:  # a fingerprint that fails is reported missing, the bench goes on
        fp = fingerprint.HostFingerprint(engine_version=engine_version, missing=(f"fingerprint: {type(exc).__name__}",))
    return {fingerprint.EXTRA_KEY: fp.to_dict()}
