"""A level's telemetry samples -> the summary stored with the level (:func:`attach` puts it there), and the run's
derived figures (:func:`run_extra`).

Per level: mean / p95 / max of each GPU field per GPU and of the GPUs' sum (power and PCIe add up
across GPUs; utilisation and temperature are read per GPU), the server's peak KV usage and mean queue
depth, whether the level was queue-bound or cache-bound, and a short timeline for the plot. Energy is
mean summed power x the level's measured duration, so J/token and PCIe bytes/token are per *output*
token, the unit a user pays in. Missing telemetry is said (``missing``), never zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workers.json_value import JsonObject, opt_float
from workers.telemetry.sampler import NO_GPUS, RunTelemetry, Sample

QUEUE_BOUND_MEAN = 1.0  # requests waiting inside the server on average
CACHE_BOUND_PEAK = 0.9  # KV-cache usage peak (fraction)
TIMELINE_POINTS = 120
GPU_FIELDS = (
    "power_w",
    "util_pct",
    "mem_util_pct",
    "memory_used_mib",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temperature_c",
)


#: ``{"mean", "p95", "max"}`` of one series, as stored with the level.
Stat = dict[str, float]


def stat(values: Sequence[float]) -> Stat | None:
    """mean, p95 (linear between closest ranks) and max; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = 0.95 * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    p95 = ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
    return {"mean": round(sum(ordered) / len(ordered), 3), "p95": round(p95, 3), "max": round(ordered[-1], 3)}


def summarize_level(samples: Sequence[Sample], level: Mapping[str, object], gpu_missing: str | None) -> JsonObject:
    """The ``telemetry`` dict of one level (JSON: it is stored with the level)."""
    gpus, total, missing = gpu_summary(samples, gpu_missing)
    out: JsonObject = {"samples": len(samples), "gpus": gpus, "total": total}
    out.update(_server(samples, missing))
    out["sampler"] = sampler_cost(samples, level)
    out.update(derived(total, level))
    out["timeline"] = _timeline(samples)
    out["missing"] = missing
    if gpu_missing == NO_GPUS:
        out["no_gpus"] = True
    return out


def gpu_summary(
    samples: Sequence[Sample], gpu_missing: str | None
) -> tuple[JsonObject, dict[str, Stat | None], list[str]]:
    """One host's GPU side of a level: (stats per GPU, ``{"power_w", "pcie_mbs"}`` of the GPUs' sum, what was
    missing). A tick counts towards a sum only when every GPU it read answered (never a sum of fewer GPUs)."""
    per_gpu: dict[int, dict[str, list[float]]] = {}
    total_power: list[float] = []
    total_pcie: list[float] = []
    for s in samples:
        for g in s.gpus:
            fields = per_gpu.setdefault(g.index, {})
            for name in GPU_FIELDS:
                value = getattr(g, name)
                if value is not None:
                    fields.setdefault(name, []).append(value)
        for p in s.pcie:
            fields = per_gpu.setdefault(p.index, {})
            if p.rx_mbs is not None and p.tx_mbs is not None:
                fields.setdefault("pcie_mbs", []).append(p.rx_mbs + p.tx_mbs)
        if (power := sample_power(s)) is not None:
            total_power.append(power)
        if (pcie := sample_pcie(s)) is not None:
            total_pcie.append(pcie)
    missing = []
    if gpu_missing == NO_GPUS:  # a CPU host has no GPU to miss
        pass
    elif gpu_missing:
        missing.append(gpu_missing)
    elif not total_power:
        missing.append("no GPU power sample during the level")
    if not gpu_missing and not total_pcie:
        missing.append("no PCIe sample during the level")
    gpus: JsonObject = {str(i): {k: stat(v) for k, v in sorted(f.items())} for i, f in sorted(per_gpu.items())}
    return gpus, {"power_w": stat(total_power), "pcie_mbs": stat(total_pcie)}, missing


def sample_power(s: Sample) -> float | None:
    """The tick's power summed over the host's GPUs; None unless every GPU read said its power."""
    powers = [g.power_w for g in s.gpus if g.power_w is not None]
    return sum(powers) if powers and len(powers) == len(s.gpus) else None


def sample_pcie(s: Sample) -> float | None:
    """The tick's PCIe rx + tx MB/s summed over the host's GPUs; None unless every GPU's row had both."""
    pcie = [p.rx_mbs + p.tx_mbs for p in s.pcie if p.rx_mbs is not None and p.tx_mbs is not None]
    return sum(pcie) if pcie and len(pcie) == len(s.pcie) else None


def _server(samples: Sequence[Sample], missing: list[str]) -> JsonObject:
    kv = [s.server.kv_usage for s in samples if s.server and s.server.kv_usage is not None]
    queued = [s.server.queued for s in samples if s.server and s.server.queued is not None]
    running = [s.server.running for s in samples if s.server and s.server.running is not None]
    if not kv and not queued:
        why = next((s.server_error for s in reversed(samples) if s.server_error), None)
        missing.append("no /metrics sample during the level" + (f" ({why})" if why else ""))
    dropped = sum(s.server.dropped for s in samples if s.server)
    if dropped:
        missing.append(f"{dropped} impossible /metrics value(s) dropped (NaN, infinite, negative or a usage above 1)")
    kv_peak = max(kv) if kv else None
    queue_mean = sum(queued) / len(queued) if queued else None
    bound = []
    if queue_mean is not None and queue_mean >= QUEUE_BOUND_MEAN:
        bound.append("queue")
    if kv_peak is not None and kv_peak >= CACHE_BOUND_PEAK:
        bound.append("cache")
    return {
        "kv_usage_peak": round(kv_peak, 4) if kv_peak is not None else None,
        "queue_mean": round(queue_mean, 3) if queue_mean is not None else None,
        "running_mean": round(sum(running) / len(running), 3) if running else None,
        "bound": bound,
    }


#: A level whose sampler took more CPU than this share of its time, in the client's process, is flagged.
SAMPLER_FLAG_SHARE = 0.01
#: ...or whose single parse took longer than this (one stall the client's timings may carry).
SAMPLER_FLAG_ONE_S = 0.05


def sampler_cost(samples: Sequence[Sample], level: Mapping[str, object]) -> JsonObject:
    """``{cpu_s, share, max_s, bytes_max}`` of the ``/metrics`` parses during the level, and ``disturbed``
    (the words a level's note says) when they may have cost the client time (issue 39 round 4, item 4)."""
    costs = [s.scrape_cpu_s for s in samples]
    cpu = sum(costs)
    duration = opt_float(level.get("duration_s")) or max((s.t_s for s in samples), default=0.0)
    share = cpu / duration if duration > 0 else 0.0
    largest = max((s.scrape_bytes for s in samples), default=0)
    out: JsonObject = {
        "cpu_s": round(cpu, 4),
        "share": round(share, 4),
        "max_s": round(max(costs, default=0.0), 4),
        "bytes_max": largest,
    }
    if share > SAMPLER_FLAG_SHARE or max(costs, default=0.0) > SAMPLER_FLAG_ONE_S:
        out["disturbed"] = (
            f"the /metrics sampler took {cpu * 1000:.0f} ms of CPU in the client's process ({share:.1%} of the "
            f"level; /metrics up to {format_bytes(largest)}): the client's timings may be inflated by that much"
        )
    return out


def derived(total: Mapping[str, Stat | None], level: Mapping[str, object]) -> dict[str, float | None]:
    """Energy, PCIe bytes, J/token, PCIe bytes/token and tok/s per W from the level's summed power and PCIe."""
    duration = opt_float(level.get("duration_s")) or 0.0
    tokens = opt_float(level.get("output_tokens")) or 0.0
    power, pcie = total.get("power_w"), total.get("pcie_mbs")
    energy = power["mean"] * duration if power else None
    pcie_bytes = pcie["mean"] * 1e6 * duration if pcie else None
    tok_s = opt_float(level.get("output_tok_s"))
    return {
        "energy_j": round(energy, 3) if energy is not None else None,
        "pcie_bytes": round(pcie_bytes) if pcie_bytes is not None else None,
        "j_per_tok": round(energy / tokens, 5) if energy is not None and tokens else None,
        "pcie_bytes_per_tok": round(pcie_bytes / tokens, 1) if pcie_bytes is not None and tokens else None,
        "tok_s_per_w": round(tok_s / power["mean"], 5) if power and tok_s and power["mean"] else None,
    }


def _timeline(samples: Sequence[Sample]) -> list[list[float | None]]:
    """``[t_s, power_w, pcie_mbs, kv_usage, queued]`` rows (summed over GPUs), at most TIMELINE_POINTS."""
    step = max(1, len(samples) // TIMELINE_POINTS + (1 if len(samples) % TIMELINE_POINTS else 0))
    rows: list[list[float | None]] = []
    for s in samples[::step]:
        power = sum(g.power_w for g in s.gpus if g.power_w is not None) if s.gpus else None
        pcie = sum((p.rx_mbs or 0) + (p.tx_mbs or 0) for p in s.pcie) if s.pcie else None
        rows.append(
            [
                round(s.t_s, 3),
                power,
                pcie,
                s.server.kv_usage if s.server else None,
                s.server.queued if s.server else None,
            ]
        )
    return rows


def run_figures(levels: Sequence[Mapping[str, object]]) -> dict[str, float | None]:
    """The run's J/token, PCIe bytes/token and tok/s per W over every level that has them."""
    energy = pcie = tokens_e = tokens_p = 0.0
    watts_time = time = out_tokens = 0.0
    for lv in levels:
        tel = lv.get("telemetry")
        tel = tel if isinstance(tel, Mapping) else {}
        tokens = opt_float(lv.get("output_tokens")) or 0.0
        duration = opt_float(lv.get("duration_s")) or 0.0
        energy_j, pcie_bytes = opt_float(tel.get("energy_j")), opt_float(tel.get("pcie_bytes"))
        if energy_j is not None:
            energy += energy_j
            tokens_e += tokens
            watts_time += energy_j
            time += duration
            out_tokens += tokens
        if pcie_bytes is not None:
            pcie += pcie_bytes
            tokens_p += tokens
    return {
        "j_per_tok": round(energy / tokens_e, 5) if tokens_e else None,
        "pcie_bytes_per_tok": round(pcie / tokens_p, 1) if tokens_p else None,
        "tok_s_per_w": round((out_tokens / time) / (watts_time / time), 5) if time and watts_time else None,
    }


def header_words(figures: Mapping[str, float | None]) -> str | None:
    """``0.41 J/tok, 1.9 KB PCIe/tok`` for the Slack header; None when neither is known."""
    parts = []
    if figures.get("j_per_tok") is not None:
        parts.append(f"{figures['j_per_tok']:.2f} J/tok")
    if figures.get("pcie_bytes_per_tok") is not None:
        parts.append(f"{format_bytes(float(figures['pcie_bytes_per_tok'] or 0))} PCIe/tok")
    return ", ".join(parts) or None


def format_bytes(value: float) -> str:
    """``512 B``, ``1.9 KB``, ``3.2 MB`` (decimal units, as nvidia-smi's MB/s)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def attach(tel: RunTelemetry | None, first: int, levels: list[JsonObject]) -> list[JsonObject]:
    """Each level dict with its ``telemetry`` summary (samples ``tel.levels[first:]``, one list per level)."""
    if tel is None:
        return levels
    sampled = tel.levels[first:]
    views = tel.latency.views[first:] if tel.latency is not None else []
    for i, level in enumerate(levels):
        samples = sampled[i] if i < len(sampled) else []
        if i < len(views) and views[i] is not None:
            level["server_view"] = views[i]  # the server's own latency means over the level, beside the client's
        try:
            level["telemetry"] = tel.combine_level(first + i, summarize_level(samples, level, tel.gpu_missing), level)
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
