"""The bench job's side of telemetry: a sampler for the host, summaries onto the levels, the run's figures.

Kept out of ``workers/jobs/bench_run.py`` so the bench only names three calls; everything here is best
effort (telemetry that fails is reported missing, the bench goes on).
"""

from __future__ import annotations

from collections.abc import Mapping

from workers.config import HostConfig
from workers.host import simulated
from workers.json_value import JsonObject
from workers.telemetry import fingerprint
from workers.telemetry.sampler import RunTelemetry, _Runner
from workers.telemetry.summary import run_figures, summarize_level

__all__ = ["RunTelemetry", "attach", "for_host", "host_extra", "run_extra"]


def for_host(host: HostConfig, transport: _Runner) -> RunTelemetry:
    """A sampler for ``host``'s GPUs (its configured nvidia-smi) and its engine's ``/metrics``."""
    return RunTelemetry(
        transport,
        tuple(simulated.nvidia_smi_argv(host)),
        host.base_url.rstrip("/") + "/metrics",
        api_key=host.engine.api_key(),
    )


def attach(tel: RunTelemetry | None, first: int, levels: list[JsonObject]) -> list[JsonObject]:
    """Each level dict with its ``telemetry`` summary (samples ``tel.levels[first:]``, one list per level)."""
    if tel is None:
        return levels
    sampled = tel.levels[first:]
    for i, level in enumerate(levels):
        samples = sampled[i] if i < len(sampled) else []
        try:
            level["telemetry"] = summarize_level(samples, level, tel.gpu_missing)
        except Exception as exc:  # bad telemetry never fails a bench: it is reported missing
            level["telemetry"] = {"missing": [f"telemetry summary failed: {type(exc).__name__}"]}
    return levels


def run_extra(levels: tuple[Mapping[str, object], ...]) -> JsonObject:
    """``{"telemetry": {j_per_tok, pcie_bytes_per_tok, tok_s_per_w, missing}}`` for the stored run."""
    if not any("telemetry" in lv for lv in levels):
        return {}
    missing = sorted({m for lv in levels for m in _missing(lv)})
    return {"telemetry": {**run_figures(levels), "missing": missing}}


def _missing(level: Mapping[str, object]) -> list[str]:
    """What a level's telemetry could not measure (its ``telemetry.missing``)."""
    telemetry = level.get("telemetry")
    missing = telemetry.get("missing") if isinstance(telemetry, Mapping) else None
    return [str(m) for m in missing] if isinstance(missing, list) else []


async def host_extra(
    host: HostConfig, transport: _Runner, engine_version: str | None
) -> dict[str, fingerprint.StoredFingerprint]:
    """``{"host_fingerprint": ...}`` for the stored run (:mod:`workers.telemetry.fingerprint`); never raises."""
    try:
        fp = await fingerprint.collect(transport, simulated.nvidia_smi_argv(host), host.engine.command, engine_version)
    except Exception as exc:  # a fingerprint that fails is reported missing, the bench goes on
        fp = fingerprint.HostFingerprint(engine_version=engine_version, missing=(f"fingerprint: {type(exc).__name__}",))
    return {fingerprint.EXTRA_KEY: fp.to_dict()}
