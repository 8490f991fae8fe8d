"""Numbers that explain themselves (issue 36): the client's lag named by its cause and said once, bursty
delivery reported instead of hidden in a median, a per-user rate above the aggregate explained, and the
server's own latency histograms beside the client's, per level (with the simulator as the server)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

from tests.factories import make_level, make_run
from tests.test_sim import BASELINE
from tests.util import free_port
from workers.benchmark.client import run_bench
from workers.benchmark.cpu_wait import CpuWaitMark, pressure_some_us, run_delay_ns
from workers.benchmark.metrics import ClientLoad, RequestRecord, client_health, describe, level_metrics
from workers.benchmark.settings import ClientSettings
from workers.benchmark.spec import BenchSpec
from workers.engines import registry
from workers.host.local import LocalTransport
from workers.results.tables import format_levels_table
from workers.sim.launcher import start_sim
from workers.telemetry import server_latency
from workers.telemetry.sampler import RunTelemetry
from workers.telemetry.summary import attach

MS = 1_000_000


def table_of(levels: list[dict[str, Any]]) -> str:
    run = make_run(levels=tuple(int(lv["concurrency"]) for lv in levels))
    return format_levels_table(dataclasses.replace(run, levels=tuple(levels)))


# ---------------------------------------------------------------- 1. the client's lag, by its cause


def test_lag_at_low_cpu_while_waiting_for_a_core_is_descheduled_not_a_client_bottleneck() -> None:
    lags = tuple([1.0] * 90 + [40.0] * 10)
    shared = client_health([ClientLoad(wall_s=10, cpu_s=(0.3,), chunks=1000, lag_ms=lags, run_delay_s=(0.8,))])
    assert shared["cause"] == "descheduled" and shared["bottleneck"] is False
    assert shared["run_delay_pct"] == 8.0
    assert "shares its cores" in str(shared["reason"]) and "3% of a core" in str(shared["reason"])
    busy = client_health([ClientLoad(wall_s=10, cpu_s=(9.0,), chunks=100_000, lag_ms=lags, run_delay_s=(0.8,))])
    assert busy["cause"] == "busy" and busy["bottleneck"] is True
    assert "90% of a CPU core" in str(busy["reason"]) and "90 µs of CPU per chunk" in str(busy["reason"])
    calm = client_health([ClientLoad(wall_s=10, cpu_s=(0.3,), chunks=1000, lag_ms=(0.2,), run_delay_s=(0.8,))])
    assert calm["cause"] is None and calm["reason"] is None


def test_a_run_whose_client_shares_cores_says_so_once_with_the_timing_error_not_per_level() -> None:
    levels = []
    for c, lag in ((1, 12.0), (4, 300.0), (8, 40.0)):
        lv = make_level(c)
        lv["client"] = client_health(
            [ClientLoad(wall_s=5, cpu_s=(0.1 * c,), chunks=500, lag_ms=(1.0,) * 50 + (lag,) * 5, run_delay_s=(0.5,))]
        )
        levels.append(lv)
    text = table_of(levels)
    assert "CLIENT was the bottleneck" not in text
    notes = [line for line in text.splitlines() if "client timing" in line]
    assert len(notes) == 1, text
    assert "(c=1, c=4, c=8)" in notes[0] and "late by up to 300 ms" in notes[0] and "shares its cores" in notes[0]


def test_the_kernel_says_how_long_this_process_waited_for_a_core() -> None:
    if run_delay_ns() is None:  # a kernel without schedstats: the figure is missing, never 0
        assert CpuWaitMark.take().since(CpuWaitMark.take())[0] is None
        return
    before = CpuWaitMark.take()
    deadline = time.perf_counter() + 0.05
    while time.perf_counter() < deadline:
        pass
    delay, pressure = CpuWaitMark.take().since(before)
    assert delay is not None and 0 <= delay < 1
    assert pressure is None if pressure_some_us() is None else pressure is not None and pressure >= 0


# ---------------------------------------------------------------- 2. bursty delivery


def burst_record(send_ms: float, first_ms: float, reads: int, per_read: int, gap_ms: float) -> RequestRecord:
    """A stream whose server sends ``per_read`` one-token SSE events in each read (same arrival time)."""
    times = [int((first_ms + i * gap_ms) * MS) for i in range(reads) for _ in range(per_read)]
    return RequestRecord(
        t_send_ns=int(send_ms * MS),
        t_end_ns=times[-1],
        chunk_t_ns=tuple(times),
        chunk_tokens=(1,) * len(times),
        output_tokens=len(times),
    )


def test_several_events_in_one_read_spread_their_gap_and_say_delivery_is_bursty() -> None:
    # c=1, 8 reads of 4 tokens 20 ms apart after a 200 ms TTFT: today's ITL p50 would read 0.00 ms
    m = level_metrics([burst_record(i * 400, i * 400 + 200, 8, 4, 20) for i in range(3)], concurrency=1)
    assert m.itl_ms["p50"] == 5.0 and m.chunk_gap_ms["p50"] == 20.0
    assert m.delivery is not None and m.delivery["bursty"]
    assert m.delivery["tokens_per_chunk"]["p50"] == 4 and m.delivery["tokens_per_chunk"]["p99"] == 4
    assert "bursty delivery (4 tokens per chunk p50)" in describe(m)
    steady = level_metrics([burst_record(0, 50, 32, 1, 10)], concurrency=1)
    assert steady.delivery is not None and not steady.delivery["bursty"]


def test_a_per_user_rate_above_the_aggregate_is_marked_and_explained() -> None:
    m = level_metrics([burst_record(i * 400, i * 400 + 300, 8, 4, 2) for i in range(3)], concurrency=1)
    level = m.to_dict()
    assert level["per_user_tok_s"] > level["output_tok_s"]  # TTFT left out of one, not of the other
    text = table_of([level])
    row = next(line for line in text.splitlines() if line.lstrip().startswith("1 "))
    assert f"{level['per_user_tok_s']:,.0f}*" in row, text
    note = next(line for line in text.splitlines() if "rate after its first token" in line)
    assert note == (
        "tok/s/user* is each stream's rate after its first token, so it leaves TTFT out: "
        f"c=1 {level['per_user_tok_s']:,.0f} against {level['output_tok_s']:,.0f} tok/s for the whole server "
        "(TTFT is 96% of each request)"
    )
    assert "delivery is bursty (tokens per chunk p50/p99: c=1 4/4): several tokens arrive at once" in text


# ---------------------------------------------------------------- 3. the server's view beside the client's

VLLM_SCRAPE = """# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {ttft}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {n}
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_sum{{engine="0",model_name="m"}} {itl}
vllm:inter_token_latency_seconds_count{{engine="0",model_name="m"}} {tokens}
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_sum{{engine="0",model_name="m"}} {e2e}
vllm:e2e_request_latency_seconds_count{{engine="0",model_name="m"}} {n}
"""


def test_the_server_view_is_the_delta_of_its_histograms_and_a_late_api_server_is_named() -> None:
    names = server_latency.LatencyNames.of(registry.engine("vllm").metrics)
    start = server_latency.totals(VLLM_SCRAPE.format(ttft=1.0, n=10, itl=3.0, tokens=300, e2e=5.0), names)
    end = server_latency.totals(VLLM_SCRAPE.format(ttft=1.072, n=18, itl=3.496, tokens=548, e2e=6.84), names)
    view = server_latency.level_view(start, end)
    assert view == {
        "ttft_ms": 9.0,
        "ttft_count": 8,
        "itl_ms": 2.0,
        "itl_count": 248,
        "e2e_ms": 230.0,
        "e2e_count": 8,
        "requests": 8,
    }
    level = make_level(1)
    level["ttft_ms"]["mean"], level["e2e_ms"]["mean"], level["itl_ms"]["mean"] = 150.0, 240.0, 2.5
    level["server_view"] = view
    notes = server_latency.gap_notes("c=1", level)
    assert notes == [
        "c=1: first token out of the engine at 9.0 ms, at the client at 150 ms (means): "
        "the API server delivers it late, not the engine"
    ]
    level["client"]["lag_p99_ms"] = 200.0  # a client that lagged this much could be the late one itself
    assert "client's own lag (p99 200 ms) can explain it" in server_latency.gap_notes("c=1", level)[0]
    text = table_of([level])
    assert "TTFT mean client/server" in text and "150ms/9.0ms" in text and "240ms/230ms" in text
    # SGLang's names, from its scrape (the fixture has e2e only): the other keys are absent, not zero
    sglang = server_latency.LatencyNames.of(registry.engine("sglang").metrics)
    fixture = (Path(__file__).parent / "fixtures" / "sglang_metrics.txt").read_text()
    assert server_latency.totals(fixture, sglang) == {"e2e": (2.5, 3.0)}
    assert server_latency.level_view({}, {"e2e": (1.0, 2.0)})["e2e_ms"] is None  # type: ignore[index]


def test_each_level_of_a_sim_bench_carries_the_simulators_own_view_matching_the_clients(tmp_path: Path) -> None:
    """Fixed timing (TTFT 50 ms, ITL 10 ms): the simulator's histograms say what it did, warmup left out."""
    port = free_port()
    fixed = ("--sim-timing", "fixed", "--sim-ttft-ms", "50", "--sim-itl-ms", "10", "--enable-metrics")
    with start_sim(port, *BASELINE, *fixed, log_path=tmp_path / "s.log"):
        url = f"http://127.0.0.1:{port}"
        names = server_latency.LatencyNames.of(registry.engine("sglang").metrics)
        tel = RunTelemetry(
            LocalTransport(), (), url + "/metrics", latency=server_latency.LevelScrapes(url + "/metrics", names)
        )
        spec = BenchSpec(levels=(1, 4), input_len=32, output_len=24, num_requests=8, warmup=2)

        async def go() -> list[dict[str, Any]]:
            done = await run_bench(
                url, ClientSettings(spec, seed=3), around_level=tel.level, at_measured=tel.measured_start
            )
            return attach(tel, 0, [lv.metrics.to_dict() for lv in done])

        levels = asyncio.run(go())
    for level in levels:
        view = level["server_view"]
        assert view["requests"] == level["completed"] == 8, view  # the warmup's 2 requests are not in it
        assert abs(view["ttft_ms"] - 50) < 2 and abs(view["itl_ms"] - 10) < 1
        assert abs(view["e2e_ms"] - (50 + 23 * 10)) < 3
        assert 0 <= level["e2e_ms"]["mean"] - view["e2e_ms"] < 20, (level["e2e_ms"], view)
        assert server_latency.gap_notes("c", level) == []
