"""Load shapes through the real client against the real simulator: open loop, chat, lengths, prefix, data.

The simulator runs with fixed timing (50 ms TTFT, 10 ms per token), so what each shape must change is
known: an open loop sends on its precomputed schedule whatever is in flight, a chat request is counted
by the server's usage, a length range gives varying outputs inside its ends, a shared prefix shows up in
the server's cached tokens, and a dataset's prompts are what the server receives.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import httpx
import pytest

from tests.util import free_port
from workers.benchmark.dataset import load_dataset
from workers.benchmark.level import run_level
from workers.benchmark.metrics import describe
from workers.benchmark.schedule import make_schedule
from workers.benchmark.settings import ClientSettings
from workers.benchmark.spec import BenchSpec
from workers.benchmark.wire_apis import WIRE_APIS
from workers.errors import BenchbotError

SIM_ARGS = ("--sim-timing", "fixed", "--sim-ttft-ms", "50", "--sim-itl-ms", "10")


@pytest.fixture(scope="module")
def sim():
    from workers.sim.launcher import start_sim

    with start_sim(free_port(), *SIM_ARGS, "--enable-cache-report", "--enable-metrics") as server:
        yield server


def _metric(base_url: str, name: str) -> float:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(f"sglang:{name}") and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_open_loop_sends_on_the_precomputed_schedule_and_reports_its_lag(sim) -> None:
    rate, n, seed = 20.0, 24, 7
    result = asyncio.run(
        run_level(
            sim.base_url,
            ClientSettings(
                BenchSpec(rates=(rate,), arrivals="poisson", num_requests=n, input_len=32, output_len=8, warmup=1),
                processes=1,
            ),
            seed=seed,
            keep_records=True,
        )
    )
    m = result.metrics
    assert (m.completed, m.errors, m.rate) == (n, 0, rate)
    plan = make_schedule(rate, pattern="poisson", num_requests=n, seed=seed)
    assert m.arrivals is not None
    assert m.arrivals["seed"] == seed and m.arrivals["requests"] == n
    assert m.arrivals["span_s"] == pytest.approx(plan.span_s)
    # Each send happened at its scheduled offset from the first (the pacer never sends early).
    sends = sorted(r.t_send_ns for r in result.records)
    actual = [(t - sends[0]) / 1e9 for t in sends]
    for want, got in zip(plan.offsets_s, actual, strict=True):
        assert got >= want - 0.002 and got - want < 0.25
    lag = m.arrivals["lag"]
    assert lag["requests"] == n and lag["p99_ms"] is not None and lag["p99_ms"] >= 0
    assert m.arrivals["from_schedule"]["ttft_ms"]["p50"] >= m.ttft_ms["p50"] - 0.5
    # 8 tokens take ~120 ms; at 20/s arrivals overlap a little but never reach the 24 requests sent.
    assert 1 <= m.concurrency < n
    assert "rate=20/s" in describe(m) and "send lag p99" in describe(m)


def test_open_loop_constant_arrivals_in_two_processes_keep_one_schedule(sim) -> None:
    result = asyncio.run(
        run_level(
            sim.base_url,
            ClientSettings(
                BenchSpec(rates=(40.0,), arrivals="constant", num_requests=16, input_len=16, output_len=4, warmup=0),
                processes=2,
            ),
            keep_records=True,
        )
    )
    m = result.metrics
    assert m.completed == 16 and m.client["processes"] == 2
    sends = sorted(r.t_send_ns for r in result.records)
    gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(sends)]
    # One every 25 ms, dealt round robin to two processes that start together.
    assert sum(gaps) / len(gaps) == pytest.approx(25.0, abs=5.0)
    assert m.arrivals is not None and m.arrivals["pattern"] == "constant"


def test_chat_api_counts_tokens_from_the_servers_usage(sim) -> None:
    result = asyncio.run(
        run_level(
            sim.base_url,
            ClientSettings(
                BenchSpec(levels=(2,), num_requests=4, input_len=40, output_len=12, warmup=0, api="chat"), processes=1
            ),
            keep_records=True,
        )
    )
    m = result.metrics
    assert (m.completed, m.errors, m.output_tokens) == (4, 0, 48)
    # Text prompts are an estimate; the server's prompt_tokens (chat template included) replaces it.
    assert all(r.input_tokens > 40 for r in result.records)
    assert m.itl_ms["p50"] is not None and 7 <= m.itl_ms["p50"] <= 13


@pytest.mark.parametrize("api", list(WIRE_APIS))
def test_every_wire_api_round_trips_through_the_simulator(sim, api: str) -> None:
    """Each table entry end to end: its body on its path is served, its reader counts exactly what was asked."""
    wire = WIRE_APIS[api]
    spec = BenchSpec(levels=(2,), num_requests=2, input_len=24, output_len=6, warmup=0, api=api)
    result = asyncio.run(run_level(sim.base_url, ClientSettings(spec, processes=1), keep_events=True))
    m = result.metrics
    assert (m.completed, m.errors, m.output_tokens) == (2, 0, 12)
    for rec in result.records:
        assert sum(rec.chunk_tokens) == 6 and all(k >= 1 for k in rec.chunk_tokens)
        # ids are exact; text (chat) takes the server's own prompt_tokens, template included
        assert (rec.input_tokens == 24) if wire.prompt_shape == "token_ids" else (rec.input_tokens > 24)
        assert rec.events is not None and len(rec.events) == len(rec.chunk_t_ns)
        for event in rec.events:  # what the server sent is this API's shape and no other's
            assert [name for name, other in WIRE_APIS.items() if other.read_event(event, 0)[2]] == [api]


def test_output_length_range_varies_inside_its_ends(sim) -> None:
    result = asyncio.run(
        run_level(
            sim.base_url,
            ClientSettings(BenchSpec(levels=(4,), num_requests=12, input_len=16, output="4-20", warmup=0), processes=1),
            seed=3,
            keep_records=True,
        )
    )
    outs = [r.output_tokens for r in result.records]
    assert all(4 <= x <= 20 for x in outs) and len(set(outs)) > 3


def test_shared_prefix_is_served_from_the_prefix_cache(sim) -> None:
    before = _metric(sim.base_url, "cached_tokens_total")
    asyncio.run(
        run_level(
            sim.base_url,
            ClientSettings(
                BenchSpec(levels=(1,), num_requests=4, input_len=64, output_len=2, warmup=0, prefix_tokens=48),
                processes=1,
            ),
        )
    )
    cached = _metric(sim.base_url, "cached_tokens_total") - before
    # The first request fills the cache; the other three reuse the 48 shared tokens at least.
    assert cached >= 3 * 48


def test_dataset_prompts_are_what_the_server_receives(sim, tmp_path: Path) -> None:
    data = tmp_path / "chats.jsonl"
    lines = [
        {
            "conversations": [
                {"from": "human", "value": f"question {i} " + "word " * (10 + i)},
                {"from": "gpt", "value": "ok"},
            ]
        }
        for i in range(6)
    ]
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    dataset = load_dataset(data)
    result = asyncio.run(
        run_level(
            sim.base_url,
            ClientSettings(
                BenchSpec(levels=(2,), num_requests=6, input="1-10000", output_len=4, warmup=0, api="chat"),
                dataset=dataset,
                processes=1,
            ),
            keep_records=True,
        )
    )
    assert result.metrics.completed == 6 and result.metrics.errors == 0


def test_bench_params_refuse_mixed_or_empty_loads() -> None:
    with pytest.raises(BenchbotError, match="one of the two"):
        ClientSettings(BenchSpec(levels=(1,), rates=(2.0,)))
    with pytest.raises(BenchbotError, match="one of the two"):
        ClientSettings(BenchSpec())
    with pytest.raises(BenchbotError, match="positive"):
        ClientSettings(BenchSpec(rates=(0.0,)))
    with pytest.raises(BenchbotError, match="arrival pattern"):
        ClientSettings(BenchSpec(rates=(1.0,), arrivals="bursty"))
    params = ClientSettings(BenchSpec(rates=(2.0, 4.0), duration_s=10)).spec
    assert params.requests_for(2.0) == 20 and params.requests_for(4.0) == 40
    assert ClientSettings(BenchSpec(rates=(0.1,))).spec.requests_for(0.1) == 8


def test_bench_spec_round_trips_and_old_payloads_still_read() -> None:
    spec = BenchSpec(
        rates=(2.0, 4.0),
        arrivals="constant",
        duration_s=30.0,
        input="512-2048",
        input_len=1280,
        output_len=64,
        prefix_tokens=128,
        api="chat",
        dataset="sharegpt",
    )
    assert BenchSpec.from_dict(spec.to_dict()) == spec
    assert spec.label == (
        "rate=2,4 arrivals=constant in=512-2048 out=64 duration=30s prefix=128 api=chat data=sharegpt"
    )
    old = {"levels": [1, 8], "input_len": 512, "output_len": 128, "num_requests": None, "warmup": None}
    assert BenchSpec.from_dict(old) == BenchSpec(levels=(1, 8), input_len=512, output_len=128)
    assert BenchSpec.from_dict(old).to_dict() == old  # a closed-loop spec writes exactly the old keys
