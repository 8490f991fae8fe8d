"""Arithmetic of workers.benchmark.metrics on hand-made timings (all times in ns, 1 ms = 1_000_000)."""

from __future__ import annotations

import json
import math
import random

from hypothesis import given
from hypothesis import strategies as st

from workers.benchmark.metrics import (
    ClientLoad,
    RequestRecord,
    chunk_gaps_ms,
    client_health,
    itl_ms,
    level_metrics,
    peak_tok_s,
    percentile,
    steady_window,
    summarize,
    tpot_ms,
    ttft_ms,
)

MS = 1_000_000


def rec(
    send: float,
    chunks: list[tuple[float, int]],
    end: float | None = None,
    *,
    error: str | None = None,
    accept: float | None = None,
    inp: int = 10,
) -> RequestRecord:
    """A record from millisecond timings: chunks are (arrival_ms, tokens)."""
    end = end if end is not None else (chunks[-1][0] if chunks else send)
    return RequestRecord(
        t_send_ns=int(send * MS),
        t_end_ns=int(end * MS),
        chunk_t_ns=tuple(int(t * MS) for t, _ in chunks),
        chunk_tokens=tuple(k for _, k in chunks),
        input_tokens=inp,
        output_tokens=sum(k for _, k in chunks),
        error=error,
        spec_accept_length=accept,
    )


def test_percentiles_interpolate_linearly_like_numpy() -> None:
    xs = [1.0, 2.0, 3.0, 4.0]
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile(xs, 50) == 2.5
    assert math.isclose(percentile(xs, 90), 3.7)
    assert math.isclose(percentile(xs, 99), 3.97)
    assert percentile([7.0], 99) == 7.0
    s = summarize([4, 1, 3, 2])
    assert s == {"mean": 2.5, "p50": 2.5, "p90": percentile(xs, 90), "p99": percentile(xs, 99), "max": 4}
    assert summarize([]) == {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_lies_between_neighbouring_order_statistics(xs: list[float], q: float) -> None:
    xs.sort()
    v = percentile(xs, q)
    assert xs[0] <= v <= xs[-1]
    assert xs[math.floor((len(xs) - 1) * q / 100)] <= v <= xs[math.ceil((len(xs) - 1) * q / 100)]


def test_ttft_tpot_e2e_and_chunk_gaps_of_one_request() -> None:
    r = rec(0, [(50, 1), (60, 1), (80, 1), (90, 1)], end=91)
    assert ttft_ms(r) == 50
    assert tpot_ms(r) == (91 - 50) / 3
    assert chunk_gaps_ms(r) == [10, 20, 10]
    assert itl_ms(r) == [10, 20, 10]


def test_tpot_undefined_for_one_output_token_and_no_chunks() -> None:
    one = rec(0, [(40, 1)], end=41)
    assert ttft_ms(one) == 40 and tpot_ms(one) is None and itl_ms(one) == []
    none = rec(0, [], end=5)
    assert ttft_ms(none) is None and tpot_ms(none) is None


def test_itl_splits_a_multi_token_chunk_evenly() -> None:
    r = rec(0, [(10, 2), (40, 3), (44, 1)])
    assert itl_ms(r) == [10, 10, 10, 4]  # first chunk's 2 tokens have no gap
    assert chunk_gaps_ms(r) == [30, 4]
    assert r.output_tokens == 6 and tpot_ms(r) == (44 - 10) / 5


def test_level_counts_errors_but_keeps_them_out_of_latency_and_tokens() -> None:
    good = [rec(0, [(100, 1), (110, 1)], accept=2.0), rec(0, [(200, 1), (220, 1)], accept=3.0)]
    bad = [
        rec(0, [(5, 1)], end=1000, error="HTTP 500: boom"),
        rec(10, [], end=20, error="HTTP 500: boom"),
        rec(10, [], end=20, error="ClientPayloadError"),
    ]
    m = level_metrics(good + bad, concurrency=5)
    assert (m.num_requests, m.completed, m.errors) == (5, 2, 3)
    assert m.error_samples == ("HTTP 500: boom", "ClientPayloadError")
    assert m.ttft_ms["p50"] == 150 and m.ttft_ms["max"] == 200
    assert m.e2e_ms["max"] == 220  # the 1000 ms errored request is not in E2E
    assert m.output_tokens == 4 and m.input_tokens == 20
    assert m.duration_s == 1.0  # ... but it does stretch the level
    assert m.output_tok_s == 4.0 and m.total_tok_s == 24.0 and m.request_s == 2.0
    assert m.spec_accept_length == 2.5
    assert m.tpot_ms["mean"] == 15 and m.per_user_tok_s == 1000 / 15
    d = m.to_dict()
    json.dumps(d)
    assert d["errors"] == 3 and d["schema"] == 1 and d["ttft_ms"]["p99"] is not None


def test_no_accept_length_and_empty_level() -> None:
    m = level_metrics([rec(0, [(1, 1), (2, 1)])], concurrency=1)
    assert m.spec_accept_length is None
    empty = level_metrics([], concurrency=4)
    assert (empty.num_requests, empty.output_tok_s, empty.per_user_tok_s) == (0, 0, None)
    assert empty.steady["start_s"] is None


def test_steady_window_cuts_ramp_and_drain_and_ignores_closed_loop_dips() -> None:
    # Target 4 streams; they start at 0, 10, 20, 30 ms; each worker immediately sends its next request.
    rs = [
        rec(0, [(50, 1)], end=100),
        rec(10, [(60, 1)], end=110),
        rec(20, [(70, 1)], end=120),
        rec(30, [(80, 1)], end=130),
        rec(100, [(150, 1)], end=200),
        rec(110, [(160, 1)], end=210),
        rec(120, [(170, 1)], end=300),
        rec(130, [(180, 1)], end=310),
    ]
    start, end = steady_window(rs, concurrency=4)  # type: ignore[misc]
    assert (start, end) == (30 * MS, 200 * MS)  # all 4 in flight from 30 ms, first drain at 200 ms
    m = level_metrics(rs, concurrency=4)
    assert m.steady["start_s"] == 0.030 and m.steady["end_s"] == 0.200
    assert m.steady["output_tok_s"] is not None
    assert math.isclose(m.steady["output_tok_s"], 8 / 0.170)  # 8 tokens at 50..180 ms
    assert steady_window(rs[:1], concurrency=4) is None  # never reached 95 % of 4


def test_steady_threshold_is_95_percent_of_target() -> None:
    # 40 streams target, 38 reached (= ceil(0.95 * 40)): that counts as steady.
    rs = [rec(i * 0.1, [(50, 1)], end=100 + i) for i in range(38)]
    assert steady_window(rs, concurrency=40) == (int(3.7 * MS), 100 * MS)
    assert steady_window(rs[:37], concurrency=40) is None


def test_peak_bucket_counts_tokens_not_chunks() -> None:
    # bucket 0: 3 chunks x 1 token; bucket 1: 2 chunks x 4 tokens (multi-token chunks win by tokens)
    rs = [rec(0, [(100, 1), (200, 1), (300, 1), (1100, 4), (1500, 4)], end=2000)]
    assert peak_tok_s(rs, 0, 2000 * MS) == 8
    # the trailing partial bucket (2.0-2.5 s) is not a full second and does not count
    rs2 = [*rs, rec(0, [(2100, 50)], end=2500)]
    assert peak_tok_s(rs2, 0, 2500 * MS) == 8
    # shorter than one second: the mean rate
    assert peak_tok_s([rec(0, [(100, 2), (400, 3)], end=500)], 0, 500 * MS) == 10
    assert level_metrics(rs, concurrency=1).peak_output_tok_s == 8


def test_mean_in_flight_is_sum_of_latencies_over_duration() -> None:
    m = level_metrics([rec(0, [(50, 1)], end=100), rec(0, [(50, 1)], end=200)], concurrency=2)
    assert math.isclose(m.mean_in_flight, 0.3 / 0.2)


def test_client_health_flags_cpu_or_lag_per_process() -> None:
    calm = client_health([ClientLoad(wall_s=10, cpu_s=(2.0,), chunks=100_000, lag_ms=(0.1,) * 99 + (0.5,))])
    assert calm["bottleneck"] is False and calm["reason"] is None
    assert calm["cpu_pct"] == 20 and calm["cpu_us_per_chunk"] == 20
    hot = client_health([ClientLoad(wall_s=10, cpu_s=(8.0, 1.0), chunks=1000, lag_ms=(0.2,))])
    assert hot["bottleneck"] and "80%" in hot["reason"] and hot["processes"] == 2
    assert hot["cpu_pct_total"] == 90
    lags = tuple([1.0] * 90 + [20.0] * 10)
    laggy = client_health([ClientLoad(wall_s=10, cpu_s=(1.0,), chunks=1000, lag_ms=lags)])
    # lag at 10 % CPU is not the client's own work: named, never called the bottleneck (tests/test_level_truths.py)
    assert not laggy["bottleneck"] and laggy["cause"] == "lag" and "lag p99" in str(laggy["reason"])
    assert client_health([])["bottleneck"] is False


def test_level_metrics_do_not_depend_on_record_order() -> None:
    rs = [rec(i * 7, [(i * 7 + 30 + j * 10, 1 + (j % 2)) for j in range(5)]) for i in range(20)]
    a = level_metrics(rs, concurrency=3)
    shuffled = rs[:]
    random.Random(1).shuffle(shuffled)
    assert level_metrics(shuffled, concurrency=3) == a
