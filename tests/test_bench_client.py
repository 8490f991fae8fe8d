"""The load generator against real HTTP servers on 127.0.0.1: SSE parsing, end-to-end timings, errors.

The fixture server below speaks SGLang's streaming ``/generate`` (cumulative ``text``, ``meta_info``)
and OpenAI ``/v1/completions`` with known, scheduled timings, so the client must recover them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from tests.util import free_port
from workers.benchmark import client as bench
from workers.benchmark.bodies import prompt_ids
from workers.benchmark.level import LevelResult, run_level
from workers.benchmark.limits import ResponseLimits
from workers.benchmark.settings import ClientSettings
from workers.benchmark.spec import BenchSpec
from workers.benchmark.stream import RawResponse, record_from_raw, split_sse
from workers.errors import BenchbotError, LeaseLostError

# --- fixture server -------------------------------------------------------------------------------------


@dataclass
class ServerConfig:
    ttft_ms: float = 100.0
    itl_ms: float = 20.0
    tokens_per_chunk: int = 1
    mode: str = "ok"  # ok | http500 | drop | error_event
    spec_accept_length: float | None = None


@dataclass
class FixtureServer:
    """aiohttp.web on its own thread and loop; records every request body it receives."""

    config: ServerConfig = field(default_factory=ServerConfig)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _chunks(self, total: int) -> Iterator[int]:
        n = 0
        while n < total:
            n = min(total, n + self.config.tokens_per_chunk)
            yield n

    async def _stream(self, request: web.Request, total: int, make_event: Any) -> web.StreamResponse:
        cfg = self.config
        if cfg.mode == "http500":
            return web.Response(status=500, text="internal boom")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        start = time.perf_counter()
        for i, n in enumerate(self._chunks(total)):
            due = start + (cfg.ttft_ms + i * cfg.itl_ms) / 1000
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            if cfg.mode == "drop" and i == 2:
                assert request.transport is not None
                request.transport.close()
                return resp
            if cfg.mode == "error_event" and i == 2:
                await resp.write(b'data: {"error": {"message": "CUDA out of memory"}}\n\n')
                break
            for event in make_event(n, n == total):
                await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        total = body["sampling_params"]["max_new_tokens"]

        def event(n: int, last: bool) -> list[dict[str, Any]]:
            meta: dict[str, Any] = {
                "id": "r",
                "prompt_tokens": len(body["input_ids"]),
                "completion_tokens": n,
                "finish_reason": {"type": "length", "length": n} if last else None,
            }
            if last and self.config.spec_accept_length is not None:
                meta["spec_accept_length"] = self.config.spec_accept_length
            return [{"text": "tok " * n, "output_ids": list(range(n)), "meta_info": meta}]

        return await self._stream(request, total, event)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        total = body["max_tokens"]
        sent = [0]

        def event(n: int, last: bool) -> list[dict[str, Any]]:
            k, sent[0] = n - sent[0], n
            out = [
                {
                    "id": "c",
                    "object": "text_completion",
                    "model": body["model"],
                    "choices": [
                        {"index": 0, "text": "tok " * k, "logprobs": None, "finish_reason": "length" if last else None}
                    ],
                    "usage": None,
                }
            ]
            if last and body.get("stream_options", {}).get("include_usage"):
                out.append(
                    {
                        "id": "c",
                        "object": "text_completion",
                        "choices": [],
                        "usage": {
                            "prompt_tokens": len(body["prompt"]),
                            "completion_tokens": n,
                            "total_tokens": n + len(body["prompt"]),
                        },
                    }
                )
            return out

        return await self._stream(request, total, event)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fixture-model", "object": "model"}]})


@contextlib.contextmanager
def serve(config: ServerConfig | None = None) -> Iterator[FixtureServer]:
    server = FixtureServer(config or ServerConfig(), port=free_port())
    app = web.Application()
    app.router.add_post("/generate", server.generate)
    app.router.add_post("/v1/completions", server.completions)
    app.router.add_get("/v1/models", server.models)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.2)
    started, stop = threading.Event(), asyncio.Event()

    async def main() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", server.port).start()
        started.set()
        await stop.wait()
        await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10), "fixture server did not start"
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def run_one(
    server: FixtureServer,
    *,
    concurrency: int = 2,
    processes: int = 1,
    timeout_s: float | None = None,
    keep_records: bool = False,
    gate: Any = None,
    **spec: Any,
) -> LevelResult:
    fields: dict[str, Any] = {"num_requests": 4, "input_len": 16, "output_len": 6, "warmup": 0, **spec}
    if timeout_s is not None:
        fields["limits"] = ResponseLimits(timeout_s=timeout_s)
    settings = ClientSettings(BenchSpec(levels=(concurrency,), **fields), processes=processes)
    return asyncio.run(run_level(server.url, settings, keep_records=keep_records, gate=gate))


# --- SSE parsing ----------------------------------------------------------------------------------------


def test_split_sse_event_split_across_reads_is_timed_by_the_read_that_completes_it() -> None:
    reads = [(1, b'data: {"a"'), (2, b": 1}\n"), (3, b"\ndata: x\n\n")]
    assert split_sse(reads) == [(3, b'{"a": 1}'), (3, b"x")]


def test_split_sse_several_events_in_one_read_comments_crlf_and_done() -> None:
    reads = [(5, b": keepalive\n\ndata: 1\n\ndata:2\r\n\r\nevent: x\ndata: a\ndata: b\n\n"), (6, b"data: [DONE]\n\n")]
    assert split_sse(reads) == [(5, b"1"), (5, b"2"), (5, b"a\nb"), (6, b"[DONE]")]


def test_split_sse_keeps_an_unterminated_final_event() -> None:
    assert split_sse([(1, b"data: 1\n\n"), (9, b"data: 2")]) == [(1, b"1"), (9, b"2")]


DONE = b"data: [DONE]\n\n"


def _gen_event(n: int, **meta: Any) -> bytes:
    obj = {"text": "x" * n, "meta_info": {"completion_tokens": n, **meta}}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_record_counts_tokens_from_completion_tokens_deltas() -> None:
    reads = (
        (110, _gen_event(1)),
        (120, _gen_event(1) + _gen_event(3)),
        (140, _gen_event(4, spec_accept_length=2.5, finish_reason={"type": "length"}) + DONE),
    )
    rec = record_from_raw(RawResponse(100, 999, reads), "generate", 16)
    assert rec.error is None
    assert rec.chunk_t_ns == (110, 120, 140)  # the repeated count 1 is no token
    assert rec.chunk_tokens == (1, 2, 1)
    assert (rec.output_tokens, rec.input_tokens, rec.spec_accept_length) == (4, 16, 2.5)
    assert rec.t_end_ns == 140


def test_record_error_event_abort_and_missing_done_are_errors() -> None:
    oom = b'data: {"error": {"message": "oom"}}\n\n'
    err = record_from_raw(RawResponse(0, 9, ((1, _gen_event(1) + oom),)), "generate", 4)
    assert err.error == "server error: oom"
    abort = record_from_raw(
        RawResponse(0, 9, ((1, _gen_event(1, finish_reason={"type": "abort", "message": "client gone"})),)),
        "generate",
        4,
    )
    assert abort.error is not None and "client gone" in abort.error
    cut = record_from_raw(RawResponse(0, 9, ((1, _gen_event(1)),)), "generate", 4)
    assert cut.error == "stream ended before [DONE]"
    bad = record_from_raw(RawResponse(0, 9, ((1, b"data: {not json\n\n"),)), "generate", 4)
    assert bad.error is not None and bad.error.startswith("unparseable")


def _cmpl(text: str, usage: dict[str, int] | None = None, choices: bool = True) -> bytes:
    obj = {"choices": [{"index": 0, "text": text}] if choices else [], "usage": usage}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_completions_tokens_without_per_chunk_usage_are_split_evenly_from_final_usage() -> None:
    reads = (
        (1, _cmpl("a")),
        (2, _cmpl("")),
        (3, _cmpl("b")),
        (4, _cmpl("c")),
        (5, _cmpl("", {"completion_tokens": 7, "prompt_tokens": 3}, choices=False) + DONE),
    )
    rec = record_from_raw(RawResponse(0, 9, reads), "completions", 3)
    assert rec.chunk_t_ns == (1, 3, 4)
    assert rec.chunk_tokens == (3, 2, 2)
    assert rec.output_tokens == 7


def test_completions_with_per_chunk_usage_use_exact_deltas() -> None:
    reads = (
        (1, _cmpl("a", {"completion_tokens": 1})),
        (2, _cmpl("bcd", {"completion_tokens": 4})),
        (3, b"data: [DONE]\n\n"),
    )
    rec = record_from_raw(RawResponse(0, 9, reads), "completions", 3)
    assert (rec.chunk_tokens, rec.output_tokens) == ((1, 3), 4)


def test_prompts_are_exact_length_distinct_and_deterministic() -> None:
    a, b = prompt_ids(0, 0, 64), prompt_ids(0, 1, 64)
    assert len(a) == 64 and len(set(a)) > 1 and a[:4] != b[:4]
    assert prompt_ids(0, 0, 64) == a


def test_bad_parameters_raise_friendly_errors() -> None:
    with pytest.raises(BenchbotError):
        ClientSettings(BenchSpec(levels=()))
    with pytest.raises(BenchbotError):
        ClientSettings(BenchSpec(levels=(1, 0)))
    with pytest.raises(BenchbotError):
        ClientSettings(BenchSpec(levels=(1,), api="chat-ish"))
    p = ClientSettings(BenchSpec(levels=(1, 64))).spec
    assert (p.requests_for(1), p.requests_for(64), p.warmup_for(1), p.warmup_for(64)) == (8, 256, 1, 8)


# --- end to end ---------------------------------------------------------------------------------------


def test_run_bench_recovers_known_server_timings_and_sends_exact_payloads() -> None:
    with serve(ServerConfig(ttft_ms=100, itl_ms=20)) as server:
        lines: list[str] = []
        params = ClientSettings(
            BenchSpec(levels=(1, 3), input_len=32, output_len=6, num_requests=4, warmup=1), processes=1
        )
        results = asyncio.run(bench.run_bench(server.url, params, on_progress=lines.append))
    assert [r.metrics.concurrency for r in results] == [1, 3]
    for r in results:
        m = r.metrics
        assert (m.completed, m.errors, m.output_tokens, m.input_tokens) == (4, 0, 24, 128)
        assert m.ttft_ms["p50"] is not None and 70 <= m.ttft_ms["p50"] <= 130
        assert m.itl_ms["p50"] is not None and 10 <= m.itl_ms["p50"] <= 35
        assert m.tpot_ms["mean"] is not None and 10 <= m.tpot_ms["mean"] <= 35
        assert m.per_user_tok_s is not None and 25 < m.per_user_tok_s < 100
        assert m.client["processes"] == 1 and m.client["cpu_pct"] is not None
        assert r.records == ()  # raw records are not kept by default
    assert len(server.bodies) == 2 * 4 + 2  # measured + warmup requests
    ids = [tuple(b["input_ids"]) for b in server.bodies]
    assert len(set(ids)) == len(ids) and all(len(i) == 32 for i in ids)
    sp = server.bodies[0]["sampling_params"]
    assert sp == {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True} and server.bodies[0]["stream"]
    assert any(line.startswith("c=3:") and "ok" in line for line in lines)


def test_multi_token_chunks_split_itl_per_token_and_report_accept_length() -> None:
    with serve(ServerConfig(ttft_ms=50, itl_ms=30, tokens_per_chunk=3, spec_accept_length=2.75)) as server:
        r = run_one(server, output_len=9, keep_records=True)
    m = r.metrics
    assert m.output_tokens == 4 * 9 and m.completed == 4
    assert all(rec.chunk_tokens == (3, 3, 3) for rec in r.records)
    assert m.chunk_gap_ms["p50"] is not None and 20 <= m.chunk_gap_ms["p50"] <= 45
    assert m.itl_ms["p50"] is not None and 6 <= m.itl_ms["p50"] <= 15
    assert m.spec_accept_length == 2.75


def test_completions_api_end_to_end_reads_the_model_and_usage() -> None:
    with serve(ServerConfig(ttft_ms=60, itl_ms=10, tokens_per_chunk=2)) as server:
        r = run_one(server, api="completions", output_len=8, keep_records=True)
    body = server.bodies[0]
    assert body["model"] == "fixture-model" and len(body["prompt"]) == 16
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["ignore_eos"] is True
    assert body["max_tokens"] == 8 and body["temperature"] == 0
    assert r.metrics.output_tokens == 32 and r.metrics.errors == 0
    assert all(sum(rec.chunk_tokens) == 8 and len(rec.chunk_t_ns) == 4 for rec in r.records)


@pytest.mark.parametrize(
    "mode,expect",
    [("http500", "HTTP 500: internal boom"), ("drop", ""), ("error_event", "server error: CUDA out of memory")],
)
def test_failing_server_counts_errors_instead_of_crashing(mode: str, expect: str) -> None:
    with serve(ServerConfig(ttft_ms=5, itl_ms=5, mode=mode)) as server:
        r = run_one(server, warmup=1)
    m = r.metrics
    assert (m.num_requests, m.completed, m.errors) == (4, 0, 4)
    assert m.error_samples and expect in m.error_samples[0]
    assert m.ttft_ms["p50"] is None and m.output_tokens == 0
    assert m.to_dict()["errors"] == 4


def test_a_request_past_its_deadline_is_an_error() -> None:
    with serve(ServerConfig(ttft_ms=3000, itl_ms=5)) as server:
        r = run_one(server, concurrency=2, num_requests=2, timeout_s=0.3)
    assert r.metrics.errors == 2 and r.metrics.error_samples == ("timed out after 0.3 s (timeout=0.3s)",)
    assert r.metrics.e2e_ms["max"] is None and 0.25 < r.metrics.duration_s < 2


def test_connection_refused_is_an_error_not_a_crash() -> None:
    r = asyncio.run(
        run_level(
            f"http://127.0.0.1:{free_port()}",
            ClientSettings(BenchSpec(levels=(2,), num_requests=3, input_len=4, output_len=2, warmup=0), processes=1),
        )
    )
    assert r.metrics.errors == 3 and "Connect" in r.metrics.error_samples[0]


def test_sharded_over_two_processes_merges_records() -> None:
    with serve(ServerConfig(ttft_ms=50, itl_ms=10)) as server:
        r = run_one(server, concurrency=4, num_requests=8, processes=2, warmup=2, keep_records=True)
    m = r.metrics
    assert (m.completed, m.output_tokens, m.client["processes"]) == (8, 48, 2)
    assert m.client["loop"] == "uvloop"
    assert m.ttft_ms["p50"] is not None and 30 <= m.ttft_ms["p50"] <= 90
    assert len(server.bodies) == 10
    assert len({rec.wall_offset_s for rec in r.records}) >= 1


# --- against the real simulator -------------------------------------------------------------------------


def _sim_args() -> tuple[str, ...]:
    return ("--sim-timing", "fixed", "--sim-ttft-ms", "50", "--sim-itl-ms", "10")


def test_real_simulator_fixed_timing_is_recovered_on_both_apis() -> None:
    from workers.sim.launcher import start_sim

    with start_sim(free_port(), *_sim_args()) as sim:
        gen = asyncio.run(
            run_level(
                sim.base_url,
                ClientSettings(
                    BenchSpec(levels=(4,), num_requests=8, input_len=64, output_len=16, warmup=2), processes=1
                ),
                keep_events=True,
            )
        )
        cmpl = asyncio.run(
            run_level(
                sim.base_url,
                ClientSettings(
                    BenchSpec(levels=(2,), num_requests=4, input_len=8, output_len=12, warmup=0, api="completions"),
                    processes=1,
                ),
            )
        )
    m = gen.metrics
    assert (m.completed, m.errors, m.output_tokens, m.input_tokens) == (8, 0, 128, 512)
    assert m.ttft_ms["p50"] is not None and 45 <= m.ttft_ms["p50"] <= 80
    assert m.itl_ms["p50"] is not None and 7 <= m.itl_ms["p50"] <= 13
    assert m.tpot_ms["mean"] is not None and 8 <= m.tpot_ms["mean"] <= 13
    first = gen.records[0]
    assert first.events is not None and len(first.events) == len(first.chunk_t_ns)
    assert all("sim_t_emit" in e for e in first.events)
    assert (cmpl.metrics.completed, cmpl.metrics.output_tokens) == (4, 48)


@pytest.mark.slow
def test_client_accuracy_quick_prints_json_per_level() -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "bench/client_accuracy.py", "--quick"], cwd=root, capture_output=True, timeout=120, check=True
    )
    report = json.loads(out.stdout)
    assert [row["concurrency"] for row in report["levels"]] == [1, 32]
    for row in report["levels"]:
        assert row["errors"] == 0 and row["records_without_server_stamps"] == 0
        assert row["ttft_err_ms"]["abs_p99"] is not None and row["itl_abs_err_ms"]["p99"] is not None
        assert 0.5 < row["achieved_vs_ideal"] <= 1.05
        assert row["client"]["processes"] == 1


def test_bench_sync_runs_the_sweep_on_uvloop() -> None:
    with serve(ServerConfig(ttft_ms=20, itl_ms=5)) as server:
        (result,) = bench.bench_sync(
            server.url,
            ClientSettings(BenchSpec(levels=(2,), input_len=8, output_len=3, num_requests=2, warmup=0), seed=7),
        )
    assert result.metrics.completed == 2 and result.metrics.client["loop"] == "uvloop"
    assert result.to_dict()["output_tokens"] == 6


# --- the request gate (a job's lease fence check) -------------------------------------------------------


class CountingGate:
    """Lets ``allow`` requests through, then raises what a job's fence check raises when the host is gone."""

    def __init__(self, allow: int) -> None:
        self.allow = allow
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls > self.allow:
            raise LeaseLostError("lost the lease on h1: job 2 (bob) holds it now; stopped touching the host")


def test_the_gate_runs_before_every_request_and_its_refusal_aborts_the_bench_cleanly() -> None:
    with serve(ServerConfig(ttft_ms=20, itl_ms=5)) as server:
        gate = CountingGate(allow=10**6)
        asyncio.run(
            run_level(
                server.url,
                ClientSettings(
                    BenchSpec(levels=(2,), num_requests=4, input_len=8, output_len=4, warmup=1), processes=1
                ),
                gate=gate,
            )
        )
        assert len(server.bodies) == 5 and gate.calls == 5 + 1  # each request + opening the connections

        # Refused at the 6th call (opening connections, the first wave of 3, one follow-up, then the next):
        # the bench stops at once with LeaseLostError, the stream still in flight is cancelled rather than
        # waited for, and nothing is sent after the refusal.
        server.bodies.clear()
        gate = CountingGate(allow=5)
        # long streams (~0.77 s each) so "cancelled, not waited for" has a wide margin on a loaded CI box
        params = ClientSettings(
            BenchSpec(levels=(3, 3), input_len=8, output_len=150, num_requests=12, warmup=0), processes=1
        )

        async def run() -> tuple[float, list[asyncio.Task[Any]]]:
            t0 = time.monotonic()
            with pytest.raises(LeaseLostError, match="bob"):
                await bench.run_bench(server.url, params, gate=gate)
            return time.monotonic() - t0, [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

        elapsed, leftover = asyncio.run(run())
        assert leftover == [] and gate.calls >= 6  # streams finishing together may each meet the refusal
        one_request_s = 0.020 + 150 * 0.005
        assert elapsed < 2 * one_request_s  # one wave plus the refusal, not a second full request
        # A request the gate let through just before the refusal may still be on its way to the server; none
        # after it: at most the 4 requests the gate allowed (its 5 passes less the connection opening) arrive.
        time.sleep(0.5)  # would be long enough for another request to arrive: none does
        assert 3 <= len(server.bodies) <= gate.allow - 1


def test_a_refusing_gate_in_a_shard_process_is_raised_as_lease_lost() -> None:
    with serve(ServerConfig(ttft_ms=10, itl_ms=5)) as server, pytest.raises(LeaseLostError, match="bob"):
        run_one(server, concurrency=4, num_requests=8, processes=2, gate=CountingGate(allow=0))
    assert server.bodies == []
