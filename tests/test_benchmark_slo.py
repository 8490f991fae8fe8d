"""Where does it break? SLO parsing, goodput, and the knee search on synthetic capacity curves."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from workers.benchmark import slo
from workers.benchmark.metrics import RequestRecord, level_metrics
from workers.benchmark.units import parse_duration_s
from workers.errors import BenchbotError

MS = 1_000_000
LOADS = slo.geometric_loads(1, 512)  # 1 2 3 4 6 8 11 16 23 32 45 64 91 128 181 256 362 512


# --- parsing -----------------------------------------------------------------------------------------------


def test_parse_slo_forms():
    s = slo.parse_slo("ttft=500ms itl=50ms")
    assert s.limits_ms == (("ttft", 500.0), ("itl", 50.0))
    assert s.max_error_pct == 1.0 and s.percentile == "p99"
    assert s.describe() == "p99 TTFT <= 500 ms, p99 ITL <= 50 ms"
    s2 = slo.parse_slo(["TTFT=0.5s", "e2e=2", "tpot=800us", "errors=0.5%"])
    assert s2.limits_ms == (("ttft", 500.0), ("e2e", 2.0), ("tpot", 0.8))
    assert s2.max_error_pct == 0.5
    assert slo.parse_slo("e2e=1.5s").describe() == "p99 E2E <= 1.5 s"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "at least one limit, e.g. ttft=500ms itl=50ms"),
        ("ttft", '"ttft" is not an SLO limit: write it like ttft=500ms'),
        ("ttft=", "is not an SLO limit"),
        ("latency=5ms", 'unknown SLO "latency=": the limits are ttft=, itl=, tpot=, e2e='),
        ("ttft=fast", "ttft=fast is not a duration: write it like ttft=500ms"),
        ("ttft=5furlongs", 'unknown unit "furlongs"'),
        ("ttft=5d", 'unknown unit "d"'),
        ("ttft=0ms", "more than zero"),
        ("ttft=1s ttft=2s", '"ttft=" is given twice'),
        ("errors=1%", "at least one latency limit"),
        ("ttft=1s errors=lots", "errors=lots: write the % of requests allowed to fail"),
        ("ttft=1s errors=120", "from 0 to 100"),
    ],
)
def test_parse_slo_errors_are_friendly(text, needle):
    with pytest.raises(BenchbotError, match=needle):
        slo.parse_slo(text)


def test_durations():
    assert parse_duration_s("500ms", "x=") == pytest.approx(0.5)
    assert parse_duration_s("2m", "duration=") == 120.0
    assert parse_duration_s("90", "duration=") == 90.0
    assert parse_duration_s("250", "ttft=", default_unit="ms") == pytest.approx(0.25)
    assert parse_duration_s(".5s", "x=") == 0.5


def test_geometric_loads():
    assert LOADS[:12] == (1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64) and LOADS[-1] == 512
    assert slo.geometric_loads(1, 10, per_doubling=1) == (1, 2, 4, 8, 10)
    assert slo.geometric_loads(0.5, 4, integer=False) == (0.5, 0.707, 1.0, 1.41, 2.0, 2.83, 4.0)
    with pytest.raises(BenchbotError, match="from a positive low"):
        slo.geometric_loads(0, 10)


# --- goodput ----------------------------------------------------------------------------------------------


def _rec(send_ms: float, ttft: float, itl: float, tokens: int, error: str | None = None) -> RequestRecord:
    t0 = int(send_ms * MS)
    chunks = tuple(t0 + int((ttft + i * itl) * MS) for i in range(tokens))
    return RequestRecord(
        t_send_ns=t0,
        t_end_ns=chunks[-1],
        chunk_t_ns=chunks,
        chunk_tokens=(1,) * tokens,
        input_tokens=10,
        output_tokens=tokens,
        error=error,
    )


def test_goodput_counts_requests_meeting_every_limit():
    s = slo.parse_slo("ttft=200ms itl=20ms")
    records = [
        _rec(0, 100, 10, 11),  # good
        _rec(0, 300, 10, 11),  # TTFT too slow
        _rec(0, 100, 30, 11),  # TPOT 30 ms > 20 ms
        _rec(0, 50, 10, 1),  # one token: no inter-token time, TTFT fine -> good
        _rec(0, 100, 10, 11, error="HTTP 500"),  # failed requests are never good
    ]
    assert slo.good_requests(records, s) == 2
    level = level_metrics(records, 4).to_dict()
    m = slo.measurement_from_level(level, s, records)
    assert m.good_requests == 2 and m.errors == 1 and m.num_requests == 5
    assert m.goodput_rps == pytest.approx(2 / level["duration_s"])
    assert m.p99_ms["ttft"] == pytest.approx(level["ttft_ms"]["p99"])
    meets, reasons = slo.check(m, s)
    assert not meets
    assert any("20.0 % of requests failed (allowed 1 %)" in r for r in reasons)
    assert any(r.startswith("p99 TTFT 29") and r.endswith("> 200 ms") for r in reasons)
    assert slo.measurement_from_level(level, s).goodput_rps is None  # no records: no goodput


# --- the search on synthetic capacity curves ----------------------------------------------------------------


def queue_curve(capacity: float, base_ms: float = 50.0, noise: float = 0.0, seed: int = 0):
    """p99 TTFT of an M/M/1-like server: base / (1 - load / capacity), unbounded past capacity."""
    rng = random.Random(seed)
    calls: list[float] = []

    def measure(load: float) -> slo.Measurement:
        calls.append(load)
        ttft = base_ms / (1 - load / capacity) if load < capacity else 60_000.0
        ttft *= math.exp(rng.gauss(0, noise)) if noise else 1.0
        good = 100 if ttft <= 500 else 0
        return slo.Measurement(
            p99_ms={"ttft": ttft},
            num_requests=100,
            errors=0,
            duration_s=10.0,
            good_requests=good,
            request_s=min(load, capacity),
        )

    return measure, calls


def test_knee_of_a_monotonic_curve_is_found_exactly():
    # 50 / (1 - x/100) <= 500  <=>  x <= 90: the highest allowed load below that is 64, and 91 fails
    measure, calls = queue_curve(capacity=100)
    result = slo.search(measure, LOADS, slo.parse_slo("ttft=500ms"))
    assert result.knee == 64 and result.first_failing == 91
    assert result.complete and result.confirmed and not result.unstable and not result.top_reached
    assert len(calls) <= slo.DEFAULT_BUDGET
    assert calls[:4] == [1, 2, 4, 16]  # galloping: indices 0, 1, 3, 7
    assert calls.count(64) == 2 and all(calls.count(x) == 1 for x in set(calls) - {64})
    assert "knee at concurrency 64, goodput 10.00 req/s (91 fails: p99 TTFT 556 ms > 500 ms)" in result.summary()
    assert result.best_goodput is not None and result.best_goodput.goodput_rps == 10.0
    loads = [p.load for p in result.sorted_points()]
    assert loads == sorted(loads)
    d = result.to_dict()
    assert d["knee"] == 64 and len(d["points"]) == len(calls) and d["slo"]["limits_ms"] == {"ttft": 500.0}


@pytest.mark.parametrize("capacity", [3.5, 12, 37, 150, 300])
def test_knee_is_the_last_allowed_load_under_the_true_limit(capacity):
    measure, _ = queue_curve(capacity=capacity)
    result = slo.search(measure, LOADS, slo.parse_slo("ttft=500ms"), budget=12)
    true_limit = 0.9 * capacity
    expected = max(x for x in LOADS if x <= true_limit)
    assert result.knee == expected
    assert result.first_failing == LOADS[LOADS.index(expected) + 1]


@pytest.mark.parametrize("seed", range(12))
def test_noisy_curve_knee_within_one_level(seed):
    """10 % lognormal noise on the p99: the knee lands within one allowed level of the true one (64)."""
    measure, calls = queue_curve(capacity=100, noise=0.10, seed=seed)
    result = slo.search(measure, LOADS, slo.parse_slo("ttft=500ms"), budget=12)
    assert result.knee in (45, 64, 91)
    assert len(calls) <= 12


def test_a_pass_that_fails_on_the_second_look_moves_the_knee_down():
    seen: dict[float, int] = {}

    def flaky(load: float) -> slo.Measurement:
        seen[load] = seen.get(load, 0) + 1
        passes = load <= 45 or (load == 64 and seen[load] == 1)  # 64 passes once by luck
        return slo.Measurement({"ttft": 100.0 if passes else 900.0}, 100, 0, 10.0)

    result = slo.search(flaky, LOADS, slo.parse_slo("ttft=500ms"), budget=14)
    assert result.knee == 45 and result.first_failing == 64
    assert result.unstable and result.confirmed and result.complete
    assert "noisy" in result.summary()


def test_fails_even_at_the_lowest_load():
    measure, calls = queue_curve(capacity=100, base_ms=600)
    result = slo.search(measure, LOADS, slo.parse_slo("ttft=500ms"))
    assert result.knee is None and result.first_failing == 1 and calls == [1]
    assert result.summary() == "the SLO (p99 TTFT <= 500 ms) fails even at concurrency 1: p99 TTFT 606 ms > 500 ms"


def test_passing_the_top_load_says_capacity_is_above_it():
    measure, calls = queue_curve(capacity=10_000)
    result = slo.search(measure, LOADS, slo.parse_slo("ttft=500ms"))
    assert result.knee == 512 and result.top_reached and result.first_failing is None and result.complete
    assert calls == [1, 2, 4, 16, 256, 512, 512]
    assert "capacity is above it" in result.summary(unit="concurrency")


def test_budget_spent_gives_a_bracket_not_a_knee():
    measure, calls = queue_curve(capacity=100)
    result = slo.search(measure, LOADS, slo.parse_slo("ttft=500ms"), budget=5)
    assert len(calls) == 5 and not result.complete and not result.confirmed
    assert result.knee is not None and result.knee <= 64
    assert result.first_failing is not None and result.first_failing >= 91
    assert "budget spent" in result.summary()


def test_errors_fail_a_level_even_when_latency_is_fine():
    def measure(load: float) -> slo.Measurement:
        return slo.Measurement({"ttft": 10.0}, num_requests=100, errors=0 if load < 20 else 5, duration_s=1.0)

    result = slo.search(measure, LOADS, slo.parse_slo("ttft=500ms"))
    assert result.knee == 16
    failing = next(p for p in result.points if p.load == result.first_failing)
    assert failing.reasons == ("5.0 % of requests failed (allowed 1 %)",)


def test_async_search_drives_the_same_strategy():
    measure, _ = queue_curve(capacity=100)

    async def ameasure(load: float) -> slo.Measurement:
        await asyncio.sleep(0)
        return measure(load)

    result = asyncio.run(slo.search_async(ameasure, [float(x) for x in LOADS], slo.parse_slo("ttft=500ms")))
    assert result.knee == 64


def test_bad_search_arguments():
    s = slo.parse_slo("ttft=1s")
    with pytest.raises(BenchbotError, match="at least one load"):
        slo.KneeSearch([], s)
    with pytest.raises(BenchbotError, match="budget of at least one"):
        slo.KneeSearch([1, 2], s, budget=0)
