"""Open-loop arrivals: the schedule's statistics, the pacer, and the lag it reports when it falls behind."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
import uvloop

from workers.benchmark import schedule as sc
from workers.benchmark.metrics import RequestRecord
from workers.errors import BenchbotError

MS = 1_000_000


# --- the schedule ------------------------------------------------------------------------------------------


def test_poisson_schedule_has_the_asked_rate_and_exponential_gaps():
    s = sc.make_schedule(50.0, pattern="poisson", num_requests=20_000, seed=7)
    assert len(s) == 20_000 and s.offsets_s[0] == 0.0
    assert all(b >= a for a, b in zip(s.offsets_s, s.offsets_s[1:], strict=False))
    # mean rate: sd of the estimate is rate / sqrt(n) = 0.7 %; allow 3 %
    assert s.mean_rate == pytest.approx(50.0, rel=0.03)
    # exponential gaps: coefficient of variation 1, and P(gap < mean) = 1 - 1/e
    assert s.interarrival_cv() == pytest.approx(1.0, abs=0.05)
    gaps = s.gaps_s()
    mean_gap = sum(gaps) / len(gaps)
    assert sum(g < mean_gap for g in gaps) / len(gaps) == pytest.approx(1 - math.exp(-1), abs=0.02)


def test_constant_schedule_is_evenly_spaced():
    s = sc.make_schedule(8, pattern="constant", num_requests=9)
    assert s.offsets_s == pytest.approx([i / 8 for i in range(9)])
    assert s.span_s == pytest.approx(1.0)
    assert s.mean_rate == pytest.approx(8.0)
    assert s.interarrival_cv() == pytest.approx(0.0, abs=1e-9)


def test_schedule_is_deterministic_by_seed():
    a = sc.make_schedule(10, num_requests=100, seed=3)
    assert a == sc.make_schedule(10, num_requests=100, seed=3)
    assert a.offsets_s != sc.make_schedule(10, num_requests=100, seed=4).offsets_s
    fresh = sc.make_schedule(10, num_requests=100, seed=None)
    assert isinstance(fresh.seed, int)
    assert sc.make_schedule(10, num_requests=100, seed=fresh.seed).offsets_s == fresh.offsets_s


def test_duration_schedule_covers_the_window_only():
    s = sc.make_schedule(20, duration_s=30, seed=1)
    assert all(0 <= t < 30 for t in s.offsets_s)
    assert 600 - 5 * math.sqrt(600) < len(s) < 600 + 5 * math.sqrt(600)  # Poisson(600) within 5 sigma
    c = sc.make_schedule(4, pattern="constant", duration_s=2.5)
    assert c.offsets_s == pytest.approx([0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25])
    assert len(sc.make_schedule(4, pattern="constant", duration_s=2)) == 8


def test_schedule_to_dict_describes_the_draw():
    d = sc.make_schedule(5, num_requests=11, seed=2).to_dict()
    assert d["rate"] == 5.0 and d["pattern"] == "poisson" and d["seed"] == 2 and d["requests"] == 11
    assert d["span_s"] > 0 and d["mean_rate"] == pytest.approx(10 / d["span_s"])


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"rate": 0, "num_requests": 5}, "positive number"),
        ({"rate": -2, "num_requests": 5}, "positive number"),
        ({"rate": float("nan"), "num_requests": 5}, "positive number"),
        ({"rate": 1e9, "num_requests": 5}, "above the most"),
        ({"rate": 5}, "either a number of requests or a duration"),
        ({"rate": 5, "num_requests": 5, "duration_s": 3}, "not both"),
        ({"rate": 5, "num_requests": 0}, "at least 1 request"),
        ({"rate": 5, "duration_s": 0}, "more than zero seconds"),
        ({"rate": 5, "num_requests": 5, "pattern": "bursty"}, "unknown arrival pattern"),
        ({"rate": 50_000, "duration_s": 3600}, "at most"),
    ],
)
def test_bad_schedules_are_refused_with_a_reason(kwargs, needle):
    rate = kwargs.pop("rate")
    with pytest.raises(BenchbotError, match=needle):
        sc.make_schedule(rate, **kwargs)


def test_rate_and_pattern_parsing():
    assert sc.parse_rate("8") == 8.0
    assert sc.parse_rate("0.5") == 0.5
    assert sc.parse_rate("12/s") == 12.0
    assert sc.parse_pattern("Poisson") == "poisson"
    assert sc.parse_pattern("const") == "constant"
    with pytest.raises(BenchbotError, match=r"rate=fast is not a request rate.*rate=8"):
        sc.parse_rate("fast")
    with pytest.raises(BenchbotError, match="more than zero"):
        sc.parse_rate("0")
    with pytest.raises(BenchbotError, match=r'"poisson".*"constant"'):
        sc.parse_pattern("gamma")


# --- lag arithmetic ----------------------------------------------------------------------------------------


def test_schedule_lag_arithmetic_on_known_times():
    scheduled = [0, 10 * MS, 20 * MS, 30 * MS]
    actual = [1 * MS, 12 * MS, 20 * MS, 80 * MS]  # lags 1, 2, 0, 50 ms
    lag = sc.schedule_lag(scheduled, actual, limit_ms=10)
    assert lag.requests == lag.requested == 4
    assert lag.mean_ms == pytest.approx(13.25)
    assert lag.p50_ms == pytest.approx(1.5)
    assert lag.p99_ms == pytest.approx(2 + 0.97 * 48)  # linear interpolation between 2 and 50
    assert lag.max_ms == pytest.approx(50)
    assert lag.over_limit == 1
    assert lag.scheduled_rate == pytest.approx(3 / 0.030)
    assert lag.achieved_rate == pytest.approx(3 / 0.079)
    assert lag.behind and "schedule lag p99 48.6 ms" in lag.reason
    ok = sc.schedule_lag(scheduled, [s + MS for s in scheduled], limit_ms=10)
    assert not ok.behind and ok.reason is None and ok.p99_ms == pytest.approx(1.0)


def test_fewer_sends_than_scheduled_marks_the_level():
    lag = sc.schedule_lag([0, MS], [0, MS], requested=5, stopped="the client fell 3.0 s behind")
    assert lag.behind and lag.reason == "the client fell 3.0 s behind"
    assert sc.schedule_lag([0], [0], requested=3).reason == "only 1 of 3 scheduled requests were sent"


def test_latencies_from_the_scheduled_send_expose_queueing():
    sent_late = RequestRecord(
        t_send_ns=100 * MS, t_end_ns=300 * MS, chunk_t_ns=(150 * MS, 300 * MS), chunk_tokens=(1, 1), output_tokens=2
    )
    on_time = RequestRecord(
        t_send_ns=50 * MS, t_end_ns=150 * MS, chunk_t_ns=(80 * MS,), chunk_tokens=(1,), output_tokens=1
    )
    failed = RequestRecord(t_send_ns=60 * MS, t_end_ns=70 * MS, error="HTTP 500")
    out = sc.latencies_from_schedule([sent_late, on_time, failed], [0, 50 * MS, 60 * MS])
    assert out["ttft_ms"]["max"] == pytest.approx(150.0)  # 50 ms from its send, 150 ms from its schedule
    assert out["ttft_ms"]["mean"] == pytest.approx((150 + 30) / 2)
    assert out["e2e_ms"]["max"] == pytest.approx(300.0)


# --- the pacer ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("runner", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_pacer_fires_in_order_never_early_and_keeps_the_rate(runner):
    """uvloop's timers have whole-ms resolution and can wake early; the pacer must still never send early."""
    schedule = sc.make_schedule(100, pattern="constant", num_requests=20)
    fired: list[tuple[int, int]] = []

    async def run() -> sc.PacedRun:
        return await sc.pace(schedule, lambda i: fired.append((i, time.perf_counter_ns())))

    paced = runner(run())
    assert paced.complete and paced.indices == tuple(range(20))
    assert [i for i, _ in fired] == list(range(20))
    assert all(f >= s for s, f in zip(paced.scheduled_ns, paced.fired_ns, strict=True))  # never early
    lag = sc.schedule_lag(paced.scheduled_ns, paced.fired_ns, limit_ms=50)
    assert lag.achieved_rate == pytest.approx(100, rel=0.3)


def test_a_slow_sender_shows_as_growing_lag_and_marks_the_level():
    """A sender that needs 20 ms per request cannot keep 200 requests/s: the lag must say so."""
    schedule = sc.make_schedule(200, pattern="constant", num_requests=15)  # one every 5 ms
    sent: dict[int, int] = {}

    async def slow_send(i: int) -> None:
        sent[i] = time.perf_counter_ns()
        await asyncio.sleep(0.020)

    async def run() -> sc.PacedRun:
        return await sc.pace(schedule, slow_send)

    paced = asyncio.run(run())
    assert paced.complete
    actual = [sent[i] for i in paced.indices]
    lag = sc.schedule_lag(paced.scheduled_ns, actual)
    lags_ms = [(a - s) / 1e6 for s, a in zip(paced.scheduled_ns, actual, strict=True)]
    # request k goes out at >= k * 20 ms while due at k * 5 ms: lag >= 15 ms per request
    assert lags_ms[-1] >= 14 * 15 * 0.95
    assert lags_ms[-1] > lags_ms[1] + 150
    assert lag.behind and "went out late" in lag.reason
    assert lag.achieved_rate < 0.5 * lag.scheduled_rate


def test_pacer_gives_up_when_too_far_behind():
    schedule = sc.make_schedule(1000, pattern="constant", num_requests=50)  # one per ms

    async def blocked(i: int) -> None:
        await asyncio.sleep(0.010)

    async def run() -> sc.PacedRun:
        return await sc.pace(schedule, blocked, give_up_lag_s=0.03)

    paced = asyncio.run(run())
    assert not paced.complete
    assert 2 <= len(paced.indices) < 50
    assert "behind the schedule" in paced.stopped and "stopped sending" in paced.stopped
    lag = sc.schedule_lag(paced.scheduled_ns, paced.fired_ns, requested=paced.requested, stopped=paced.stopped)
    assert lag.behind and paced.stopped in lag.reason
