"""Benchmark arithmetic: per-request records in, one ``LevelMetrics`` per concurrency level out.

Pure functions on plain data (no I/O, no clocks, no numpy) so every figure a user sees can be checked
by a unit test on hand-made timings, and so records produced in several client processes can simply be
concatenated before they get here. Definitions follow SGLang ``bench_serving`` (see docs/metrics.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, NotRequired, TypedDict

from workers.benchmark.limits import limit_kind
from workers.json_value import JsonObject, RawJson

if TYPE_CHECKING:  # schedule.py builds on this module's records and statistics
    from workers.benchmark.schedule import Arrivals

SCHEMA = 1
STEADY_FRACTION = 0.95
CPU_LIMIT_PCT = 70.0
LAG_LIMIT_MS = 5.0
#: A client that waited for a core this share of the level's wall time was descheduled, not busy.
WAIT_LIMIT_PCT = 1.0
#: Delivery is bursty when the chunks (reads) carry this many tokens each on average, or more.
BURSTY_TOKENS_PER_CHUNK = 1.5
MAX_ERROR_SAMPLES = 5


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What one request did, in ``time.perf_counter_ns`` units (CLOCK_MONOTONIC: shared by processes).

    ``chunk_t_ns[i]`` is when the bytes completing the i-th token-carrying SSE event reached our code
    and ``chunk_tokens[i]`` how many output tokens that event carried (>= 1). ``wall_offset_s`` is
    ``time.time() - time.perf_counter()`` in the process that sent it, so times can be compared with a
    server's wall clock. ``events`` holds the parsed JSON of each token event only when asked for.
    """

    t_send_ns: int
    t_end_ns: int
    chunk_t_ns: tuple[int, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    input_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None
    spec_accept_length: float | None = None
    wall_offset_s: float = 0.0
    events: tuple[RawJson, ...] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class ClientLoad:
    """How hard the load generator itself worked during the measured phase (one entry per process)."""

    wall_s: float
    cpu_s: tuple[float, ...]
    chunks: int
    lag_ms: tuple[float, ...]
    loop: str = "uvloop"
    #: Per process: seconds its event loop's thread waited for a core (``/proc/self/schedstat``), None unknown.
    run_delay_s: tuple[float | None, ...] = ()
    #: Seconds in which some task on the box waited for a core (``/proc/pressure/cpu``), None unknown.
    pressure_s: float | None = None


class ClientHealth(TypedDict):
    """Did the load generator keep up (:func:`client_health`), and if its timing suffered, why?

    ``cause`` names it: ``busy`` (the client's own work: over the CPU limit; the only ``bottleneck``),
    ``descheduled`` (lag with low CPU while it waited for a core: the engine or something else shares its
    cores), ``lag`` (lag with low CPU and no measurable wait), None (nothing to say).
    """

    cpu_pct: float | None
    cpu_pct_total: NotRequired[float]
    cpu_us_per_chunk: float | None
    lag_p99_ms: float | None
    lag_max_ms: NotRequired[float | None]
    run_delay_pct: NotRequired[float | None]
    cpu_pressure_pct: NotRequired[float | None]
    cause: NotRequired[str | None]
    bottleneck: bool
    reason: str | None
    processes: int
    loop: str | None


class Delivery(TypedDict):
    """How the tokens reached the client: per chunk (one read, whatever SSE events it held) and TTFT's share.

    ``bursty``: chunks carry :data:`BURSTY_TOKENS_PER_CHUNK` tokens or more on average, so per-chunk gaps
    are not per-token latencies; ``ttft_share``: mean TTFT / mean E2E, what a per-user decode rate leaves out.
    """

    tokens_per_chunk: dict[str, float | None]
    bursty: bool
    ttft_share: float | None


@dataclass(frozen=True)
class LevelMetrics:
    """Everything reported for one concurrency level; ``to_dict`` is the stored/rendered JSON shape."""

    concurrency: int
    num_requests: int
    completed: int
    errors: int
    error_samples: tuple[str, ...]
    duration_s: float
    input_tokens: int
    output_tokens: int
    output_tok_s: float
    total_tok_s: float
    request_s: float
    per_user_tok_s: float | None
    mean_in_flight: float
    ttft_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    chunk_gap_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    spec_accept_length: float | None
    steady: dict[str, float | None]
    peak_output_tok_s: float
    client: ClientHealth
    delivery: Delivery | None = None
    #: Open loop only: the asked request rate, and the schedule (pattern, seed, span), how late the
    #: sends were against it (``lag``) and latencies measured from the scheduled sends (``from_schedule``).
    rate: float | None = None
    arrivals: Arrivals | None = None
    #: Requests cut off by a response bound, by the option that sets it (``{"max-bytes": 3}``): the level
    #: met a server that streams without end, floods its head, or goes silent (workers.benchmark.limits).
    cut: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> JsonObject:
        out = asdict(self)
        out["error_samples"] = list(self.error_samples)
        out["schema"] = SCHEMA
        return out


# --- statistics -------------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on an already sorted list."""
    if not sorted_values:
        raise ValueError("percentile of an empty sequence")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(values: Iterable[float]) -> dict[str, float | None]:
    """``{mean, p50, p90, p99, max}``; all ``None`` when there is nothing to summarize."""
    xs = sorted(values)
    if not xs:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    return {
        "mean": math.fsum(xs) / len(xs),
        "p50": percentile(xs, 50),
        "p90": percentile(xs, 90),
        "p99": percentile(xs, 99),
        "max": xs[-1],
    }


# --- per request ------------------------------------------------------------------------------------


def ttft_ms(rec: RequestRecord) -> float | None:
    """Send -> first event that carried an output token."""
    if not rec.chunk_t_ns:
        return None
    return (rec.chunk_t_ns[0] - rec.t_send_ns) / 1e6


def e2e_ms(rec: RequestRecord) -> float:
    """Send -> end of the response (the read holding ``[DONE]``)."""
    return (rec.t_end_ns - rec.t_send_ns) / 1e6


def tpot_ms(rec: RequestRecord) -> float | None:
    """(E2E - TTFT) / (output_tokens - 1); undefined for a single output token (as in SGLang)."""
    first = ttft_ms(rec)
    if first is None or rec.output_tokens < 2:
        return None
    return (e2e_ms(rec) - first) / (rec.output_tokens - 1)


def chunks(rec: RequestRecord) -> list[tuple[int, int]]:
    """``(arrival_ns, tokens)`` per chunk: the token events that reached our code in one read, summed.

    Several SSE events in one read share its timestamp; as gaps of 0 they would make every per-chunk or
    per-token figure after them meaningless (ITL p50 0.00 ms), so a chunk is what arrived together.
    """
    out: list[tuple[int, int]] = []
    for t, k in zip(rec.chunk_t_ns, rec.chunk_tokens, strict=False):
        if out and out[-1][0] == t:
            out[-1] = (t, out[-1][1] + max(1, k))
        else:
            out.append((t, max(1, k)))
    return out


def chunk_gaps_ms(rec: RequestRecord) -> list[float]:
    """Gaps between consecutive chunks (reads that carried tokens) of one request: what a streaming user sees."""
    t = [c[0] for c in chunks(rec)]
    return [(t[i] - t[i - 1]) / 1e6 for i in range(1, len(t))]


def itl_ms(rec: RequestRecord) -> list[float]:
    """Per-token ITL: each chunk's gap spread evenly over the tokens it carried (SGLang ``bench_serving``).

    A chunk with k tokens after a gap g contributes k values g/k, so multi-token events (speculative
    decoding, server-side coalescing) and several events in one read do not inflate or zero ITL; tokens of
    the first chunk have no gap.
    """
    out: list[float] = []
    got = chunks(rec)
    for i in range(1, len(got)):
        (t0, _), (t1, n) = got[i - 1], got[i]
        out.extend([(t1 - t0) / 1e6 / n] * n)
    return out


def delivery(ok: Sequence[RequestRecord], ttft_mean: float | None, e2e_mean: float | None) -> Delivery:
    """Tokens per chunk over a level's successful requests, whether that is bursty, and TTFT's share of E2E."""
    sizes = [k for r in ok for _, k in chunks(r)]
    per_chunk = summarize(sizes)
    mean = per_chunk["mean"]
    return {
        "tokens_per_chunk": {k: per_chunk[k] for k in ("mean", "p50", "p99", "max")},
        "bursty": mean is not None and mean >= BURSTY_TOKENS_PER_CHUNK,
        "ttft_share": ttft_mean / e2e_mean if ttft_mean is not None and e2e_mean else None,
    }


# --- level-wide ---------------------------------------------------------------------------------------


def steady_window(
    records: Sequence[RequestRecord], concurrency: int, fraction: float = STEADY_FRACTION
) -> tuple[int, int] | None:
    """(start_ns, end_ns): from the first moment ``fraction`` of the target streams are in flight to the
    last moment the count drops below it. The envelope ignores the microsecond dips of a closed loop
    (one request ends, its worker sends the next) and cuts off ramp-up and drain.
    """
    threshold = max(1, math.ceil(fraction * concurrency))
    edges = sorted([(r.t_send_ns, 1) for r in records] + [(r.t_end_ns, -1) for r in records])
    in_flight, start, end = 0, None, None
    for t, step in edges:
        before = in_flight
        in_flight += step
        if before < threshold <= in_flight and start is None:
            start = t
        elif in_flight < threshold <= before:
            end = t
    if start is None or end is None or end <= start:
        return None
    return start, end


def _token_arrivals(records: Iterable[RequestRecord]) -> Iterable[tuple[int, int]]:
    for r in records:
        yield from zip(r.chunk_t_ns, r.chunk_tokens, strict=False)


def tokens_between(records: Iterable[RequestRecord], start_ns: int, end_ns: int) -> int:
    """Output tokens whose event arrived in [start_ns, end_ns]."""
    return sum(k for t, k in _token_arrivals(records) if start_ns <= t <= end_ns)


def peak_tok_s(records: Sequence[RequestRecord], origin_ns: int, end_ns: int) -> float:
    """Most output tokens that arrived in one full 1-s bucket (tokens, not events, so multi-token events
    count fully). A level shorter than 1 s has no full bucket: its mean rate is returned instead.
    """
    full_buckets = int((end_ns - origin_ns) // 1_000_000_000)
    total = sum(k for _, k in _token_arrivals(records))
    if full_buckets < 1:
        span = (end_ns - origin_ns) / 1e9
        return total / span if span > 0 else 0.0
    buckets = [0] * full_buckets
    for t, k in _token_arrivals(records):
        b = (t - origin_ns) // 1_000_000_000
        if 0 <= b < full_buckets:
            buckets[b] += k
    return float(max(buckets))


def client_health(
    load: Sequence[ClientLoad],
    cpu_limit_pct: float = CPU_LIMIT_PCT,
    lag_limit_ms: float = LAG_LIMIT_MS,
    wait_limit_pct: float = WAIT_LIMIT_PCT,
) -> ClientHealth:
    """Did the load generator keep up, and when its timing suffered, was it busy or kept off its core?

    Throughput alone hides a saturated client (it still reads every byte, late and in clumps). A process
    over ``cpu_limit_pct`` of a core is the client's own bottleneck (``busy``): its latencies measure it.
    Event-loop lag over ``lag_limit_ms`` at a low CPU share is not the client's work: when the kernel kept
    it waiting for a core (run delay over ``wait_limit_pct`` of the wall time) it was ``descheduled`` (the
    engine or something else fills the cores), and its timestamps may be late by up to the lag; ``lag``
    when no wait was measured. Only ``busy`` is a ``bottleneck``.
    """
    if not load:
        return {
            "cpu_pct": None,
            "cpu_us_per_chunk": None,
            "lag_p99_ms": None,
            "cause": None,
            "bottleneck": False,
            "reason": None,
            "processes": 0,
            "loop": None,
        }
    cpu_pcts = [100.0 * c / p.wall_s if p.wall_s > 0 else 0.0 for p in load for c in p.cpu_s]
    cpu_total = math.fsum(c for p in load for c in p.cpu_s)
    chunk_count = sum(p.chunks for p in load)
    lags = sorted(x for p in load for x in p.lag_ms)
    cpu_pct = max(cpu_pcts)
    lag_p99 = percentile(lags, 99) if lags else None
    per_chunk = 1e6 * cpu_total / chunk_count if chunk_count else None
    waits = [100.0 * d / p.wall_s for p in load for d in p.run_delay_s if d is not None and p.wall_s > 0]
    wait_pct = max(waits) if waits else None
    pressures = [100.0 * p.pressure_s / p.wall_s for p in load if p.pressure_s is not None and p.wall_s > 0]
    pressure_pct = max(pressures) if pressures else None
    lagged = lag_p99 is not None and lag_p99 > lag_limit_ms
    cause: str | None = None
    reason: str | None = None
    if cpu_pct > cpu_limit_pct:
        cause = "busy"
        reason = f"client process used {cpu_pct:.0f}% of a CPU core (limit {cpu_limit_pct:.0f}%)"
        if per_chunk is not None:
            reason += f", {per_chunk:.0f} µs of CPU per chunk"
        if lagged:
            reason += f"; event-loop lag p99 {lag_p99:.1f} ms (limit {lag_limit_ms:.0f} ms)"
    elif lagged:
        wait = f"waited for a core {wait_pct:.1f}% of the time" if wait_pct is not None else ""
        if pressure_pct is not None:
            wait += f"{' and ' if wait else ''}the box's CPU pressure was {pressure_pct:.0f}%"
        descheduled = wait_pct is not None and wait_pct >= wait_limit_pct
        cause = "descheduled" if descheduled else "lag"
        reason = f"event-loop lag p99 {lag_p99:.1f} ms with the client at {cpu_pct:.0f}% of a core"
        if descheduled:
            reason += f": it {wait}, so the engine or something else shares its cores"
        else:
            reason += f" ({wait or 'its wait for a core is not known'}): not the client's own work"
    out: ClientHealth = {
        "cpu_pct": cpu_pct,
        "cpu_pct_total": 100.0 * cpu_total / load[0].wall_s if load[0].wall_s > 0 else 0.0,
        "cpu_us_per_chunk": per_chunk,
        "lag_p99_ms": lag_p99,
        "lag_max_ms": lags[-1] if lags else None,
        "run_delay_pct": wait_pct,
        "cpu_pressure_pct": pressure_pct,
        "cause": cause,
        "bottleneck": cause == "busy",
        "reason": reason,
        "processes": sum(len(p.cpu_s) for p in load),
        "loop": load[0].loop,
    }
    return out


def peak_in_flight(records: Sequence[RequestRecord]) -> int:
    """Most requests in flight at once (an open loop's concurrency is an outcome, not a setting)."""
    edges = sorted([(r.t_send_ns, 1) for r in records] + [(r.t_end_ns, -1) for r in records])
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def level_metrics(
    records: Sequence[RequestRecord],
    concurrency: int,
    load: Sequence[ClientLoad] = (),
    *,
    rate: float | None = None,
    arrivals: Arrivals | None = None,
) -> LevelMetrics:
    """Aggregate the measured (non-warmup) records of one level.

    Errored requests count in ``num_requests``/``errors`` and in the in-flight curve, never in latency
    or token statistics (as in SGLang: only successful requests count). An open-loop level passes its
    ``rate``: its ``concurrency`` is then the peak in flight, and its steady window runs from the first
    to the last send (arrivals keep coming for that long; the drain after it is not steady).
    """
    ok = [r for r in records if r.ok]
    bad = [r for r in records if not r.ok]
    samples: list[str] = []
    cut: dict[str, int] = {}
    for r in bad:
        if r.error not in samples and len(samples) < MAX_ERROR_SAMPLES:
            samples.append(str(r.error))
        kind = limit_kind(r.error)
        if kind is not None:
            cut[kind] = cut.get(kind, 0) + 1
    if records:
        origin = min(r.t_send_ns for r in records)
        finish = max(r.t_end_ns for r in records)
    else:
        origin = finish = 0
    duration = (finish - origin) / 1e9
    in_tok = sum(r.input_tokens for r in ok)
    out_tok = sum(r.output_tokens for r in ok)

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    tpots = [x for x in (tpot_ms(r) for r in ok) if x is not None]
    tpot = summarize(tpots)
    ttft = summarize(x for x in (ttft_ms(r) for r in ok) if x is not None)
    e2e = summarize(e2e_ms(r) for r in ok)
    accept = [r.spec_accept_length for r in ok if r.spec_accept_length is not None]
    if rate is not None:
        concurrency = peak_in_flight(records)
        sends = [r.t_send_ns for r in records]
        window = (min(sends), max(sends)) if len(sends) > 1 and max(sends) > min(sends) else None
    else:
        window = steady_window(records, concurrency)
    if window is None:
        steady: dict[str, float | None] = {"start_s": None, "end_s": None, "output_tok_s": None}
    else:
        s, e = window
        steady = {
            "start_s": (s - origin) / 1e9,
            "end_s": (e - origin) / 1e9,
            "output_tok_s": tokens_between(ok, s, e) / ((e - s) / 1e9),
        }
    return LevelMetrics(
        concurrency=concurrency,
        num_requests=len(records),
        completed=len(ok),
        errors=len(bad),
        error_samples=tuple(samples),
        cut=cut,
        duration_s=duration,
        input_tokens=in_tok,
        output_tokens=out_tok,
        output_tok_s=per_s(out_tok),
        total_tok_s=per_s(in_tok + out_tok),
        request_s=per_s(len(ok)),
        per_user_tok_s=1000.0 / tpot["mean"] if tpot["mean"] else None,
        mean_in_flight=per_s(math.fsum(e2e_ms(r) / 1000 for r in records)),
        ttft_ms=ttft,
        itl_ms=summarize(x for r in ok for x in itl_ms(r)),
        chunk_gap_ms=summarize(x for r in ok for x in chunk_gaps_ms(r)),
        tpot_ms=tpot,
        e2e_ms=e2e,
        spec_accept_length=math.fsum(accept) / len(accept) if accept else None,
        steady=steady,
        peak_output_tok_s=peak_tok_s(ok, origin, finish) if ok else 0.0,
        client=client_health(load),
        delivery=delivery(ok, ttft["mean"], e2e["mean"]),
        rate=rate,
        arrivals=arrivals,
    )


# ---- the progress line of a finished level, as the job's thread and ``benchbot bench`` show it ----


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
    if m.delivery is not None and m.delivery["bursty"]:
        line += f", bursty delivery ({m.delivery['tokens_per_chunk']['p50'] or 0:.0f} tokens per chunk p50)"
    if m.client.get("bottleneck"):  # the client's own work; lag from sharing cores is said once per run
        line += f" [client-bound: {m.client['reason']}]"
    return line
