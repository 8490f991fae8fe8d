"""The progress line of a finished level, as the job's thread and ``benchbot bench`` show it."""

from __future__ import annotations

from workers.benchmark.metrics import LevelMetrics


def level_name(m: LevelMetrics) -> str:
    """``c=8`` for a closed-loop level, ``rate=2/s`` for an open-loop one."""
    return f"rate={m.rate:g}/s" if m.rate is not None else f"c={m.concurrency}"


def describe(m: LevelMetrics) -> str:
    """One progress line per finished level."""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    line = (
        f"{level_name(m)}: {m.completed}/{m.num_requests} ok, {m.output_tok_s:.0f} out tok/s, "
        f"TTFT p50 {ms(m.ttft_ms.get('p50'))} ms, ITL p50 {ms(m.itl_ms.get('p50'))} ms"
    )
    if m.arrivals is not None:
        lag = m.arrivals["lag"]
        line += f", peak {m.concurrency} in flight, send lag p99 {ms(lag['p99_ms'])} ms"
        if lag["behind"]:
            line += f" [behind schedule: {lag['reason']}]"
    if m.errors:
        line += f", {m.errors} errors ({m.error_samples[0]})"
    if m.cut:
        line += f" [cut off by response limits: {', '.join(f'{n} by {k}=' for k, n in sorted(m.cut.items()))}]"
    if m.client.get("bottleneck"):
        line += f" [client-bound: {m.client['reason']}]"
    return line
