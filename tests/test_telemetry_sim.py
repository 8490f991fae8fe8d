"""The sampler against a real simulated SGLang server and the nvidia-smi stand-in, through a real transport."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from argparse import Namespace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.test_sim import BASELINE
from tests.util import async_wait_until, free_port
from workers.benchmark.client import run_bench
from workers.benchmark.settings import ClientSettings
from workers.benchmark.spec import BenchSpec
from workers.config import parse_config
from workers.engines import registry
from workers.host.local import LocalTransport
from workers.sim.gpu_load import pcie_bytes_per_tok
from workers.sim.launcher import start_sim
from workers.sim.perf import PerfModel
from workers.sim.profile import PROFILES, model_spec_for
from workers.sim.trtllm import STATS_QUIET_S
from workers.telemetry import run as telemetry_run
from workers.telemetry.sampler import RunTelemetry
from workers.telemetry.summary import attach, run_extra, summarize_level


def _bench(url: str, tel: RunTelemetry, levels: tuple[int, ...]) -> list[dict]:
    params = ClientSettings(BenchSpec(levels=levels, input_len=64, output_len=48, warmup=0), seed=1)

    async def go() -> list[dict]:
        done = await run_bench(url, params, around_level=tel.level)
        return attach(tel, 0, [lv.metrics.to_dict() for lv in done])

    return asyncio.run(go())


def test_levels_carry_power_pcie_and_kv_that_rise_with_load(tmp_path: Path) -> None:
    port = free_port()
    state = tmp_path / "state"
    env = {"BENCHBOT_SIM_STATE_DIR": str(state)}
    with start_sim(port, *BASELINE, "--enable-metrics", env=env, log_path=tmp_path / "s.log"):
        smi = (sys.executable, "-m", "workers.sim.nvidia_smi", f"--sim-state-dir={state}")
        tel = RunTelemetry(LocalTransport(), smi, f"http://127.0.0.1:{port}/metrics", interval_s=0.2)
        one, eight = _bench(f"http://127.0.0.1:{port}", tel, (1, 8))
    for level in (one, eight):
        t = level["telemetry"]
        assert t["samples"] >= 2 and t["missing"] == [], t
        assert t["j_per_tok"] > 0 and t["pcie_bytes_per_tok"] > 0
        assert set(t["gpus"]) == {str(i) for i in range(8)}
    # more streams: more watts in total but fewer joules per token (the GPUs are better used)
    assert eight["telemetry"]["total"]["power_w"]["max"] > one["telemetry"]["total"]["power_w"]["max"]
    assert eight["telemetry"]["j_per_tok"] < one["telemetry"]["j_per_tok"]
    assert eight["telemetry"]["kv_usage_peak"] > 0
    extra = run_extra((one, eight))["telemetry"]
    assert extra["j_per_tok"] > 0 and extra["pcie_bytes_per_tok"] > 0


def _args(**kw: object) -> Namespace:
    base: dict[str, object] = dict(
        tp_size=8,
        enable_mscclpp=False,
        disable_custom_all_reduce=True,
        speculative_algorithm=None,
        speculative_num_draft_tokens=None,
        speculative_num_steps=None,
        speculative_eagle_topk=None,
        disable_overlap_schedule=False,
        moe_runner_backend="auto",
        fp4_gemm_runner_backend="auto",
        attention_backend="triton",
        kv_cache_dtype="auto",
        max_running_requests=64,
    )
    return Namespace(**{**base, **kw})


def test_custom_allreduce_and_mscclpp_move_fewer_pcie_bytes_per_token_than_nccl() -> None:
    model = model_spec_for("nvidia/Qwen3.5-397B-A17B-NVFP4")

    def per_token(profile: str = "rtx-pro-6000-x8", **kw: object) -> float:
        return pcie_bytes_per_tok(PerfModel(_args(**kw), PROFILES[profile], model))[0]

    assert per_token(enable_mscclpp=True) < per_token()
    assert per_token(tp_size=2, disable_custom_all_reduce=False) < per_token(tp_size=2)
    assert per_token("h100-x8") < per_token(tp_size=2, disable_custom_all_reduce=False)  # NVLink carries the AR


def test_a_host_without_nvidia_smi_is_said_once_and_the_level_still_stands() -> None:
    calls: list[tuple[str, ...]] = []

    class Counting(LocalTransport):
        async def run(self, argv, *, timeout, env=None, input=None, check=False):  # type: ignore[no-untyped-def]
            calls.append(tuple(argv))
            return await super().run(argv, timeout=timeout, env=env, input=input, check=check)

    tel = RunTelemetry(Counting(), ("/nonexistent/nvidia-smi",), None, interval_s=0.05)

    async def go() -> None:
        for _ in range(2):
            async with tel.level() as samples:

                async def ticked(samples: list = samples) -> bool:
                    return len(samples) >= 3  # three ticks of the sampler while the "level" runs

                await async_wait_until(ticked, what="three sampler ticks")

    asyncio.run(go())
    assert tel.gpu_missing is not None and "no nvidia-smi" in tel.gpu_missing
    assert len(calls) <= 2  # the query and dmon of the first tick; never asked again
    summary = summarize_level(tel.levels[1], {"duration_s": 1.0, "output_tokens": 5}, tel.gpu_missing)
    assert summary["missing"][0] == tel.gpu_missing and summary["j_per_tok"] is None


def test_a_server_without_metrics_is_said_why_and_how_to_turn_them_on(tmp_path: Path) -> None:
    # SGLang without --enable-metrics answers 404 on /metrics: the level says so, with the engine's own hint
    port = free_port()
    state = tmp_path / "state"
    with start_sim(port, *BASELINE, env={"BENCHBOT_SIM_STATE_DIR": str(state)}, log_path=tmp_path / "s.log"):
        smi = (sys.executable, "-m", "workers.sim.nvidia_smi", f"--sim-state-dir={state}")
        hint = registry.engine("sglang").metrics.off_hint
        tel = RunTelemetry(
            LocalTransport(), smi, f"http://127.0.0.1:{port}/metrics", interval_s=0.2, metrics_off_hint=hint
        )
        (one,) = _bench(f"http://127.0.0.1:{port}", tel, (1,))
    missing = one["telemetry"]["missing"]
    assert missing == [f"no /metrics sample during the level (HTTP 404: {hint})"], missing
    assert "--enable-metrics" in hint
    assert one["telemetry"]["pcie_bytes_per_tok"] > 0  # the GPUs were still sampled


# ---- TensorRT-LLM: no load gauges, and a /metrics that holds its reader ----------------------------------------

MODEL = "nvidia/Qwen3.5-397B-A17B-NVFP4"
TRTLLM_CONFIG = """
default_host = "trt-1"
[hosts.trt-1]
transport = "local"
port = {port}
nvidia_smi = ["{{python}}", "-m", "workers.sim.nvidia_smi", "--sim-state-dir={state}"]
[hosts.trt-1.engine]
kind = "trtllm"
command = ["{{python}}", "-m", "workers.sim.trtllm", "serve"]
"""


class _CountingServer:
    """A real HTTP server on 127.0.0.1 standing where the engine listens: it counts what it is asked."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        seen = self.paths

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.path)
                body = b"[]"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_trtllm_hosts_telemetry_never_asks_its_metrics_and_says_why(tmp_path: Path) -> None:
    # trtllm-serve's /metrics holds each read open while the server is busy and drains what it returns: a
    # scrape per tick would stall the GPU samples and take the stats from whoever else reads them
    engine = _CountingServer()
    try:
        config = parse_config(TRTLLM_CONFIG.format(port=engine.port, state=tmp_path / "state"))
        tel = telemetry_run.for_host(config.hosts["trt-1"], LocalTransport())

        async def go() -> None:
            async with tel.level() as samples:

                async def ticked() -> bool:
                    return len(samples) >= 3

                await async_wait_until(ticked, timeout=30, what="three sampler ticks")

        asyncio.run(go())
    finally:
        engine.close()
    no_gauges = registry.engine("trtllm").metrics.no_gauges
    assert "no load gauges" in no_gauges
    assert engine.paths == []  # nothing asked of the engine
    (samples,) = tel.levels
    assert all(s.server is None and s.server_error == no_gauges for s in samples)
    assert all(len(s.gpus) == 8 for s in samples)  # the GPUs are sampled as on any host
    summary = summarize_level(samples, {"duration_s": 1.0, "output_tokens": 5}, tel.gpu_missing)
    assert summary["missing"] == [f"no /metrics sample during the level ({no_gauges})"], summary["missing"]
    assert summary["j_per_tok"] is not None


def _start_trtllm(port: int, tmp_path: Path, document: dict[str, object]) -> subprocess.Popen[bytes]:
    settings = tmp_path / "llm_api.json"
    settings.write_text(json.dumps(document))
    argv = [sys.executable, "-m", "workers.sim.trtllm", "serve", MODEL]
    argv += ["--port", str(port), "--tp_size", "8", "--config", str(settings)]
    argv += ["--sim-load-s", "0", "--sim-state-dir", str(tmp_path / "state"), "--sim-timing", "fixed"]
    with (tmp_path / "trtllm.log").open("wb") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.parametrize("iter_stats", [True, False], ids=["stats-on", "stats-off"])
def test_the_trtllm_simulators_metrics_is_held_open_and_drained_as_the_real_ones(
    tmp_path: Path, iter_stats: bool
) -> None:
    port = free_port()
    proc = _start_trtllm(port, tmp_path, {"enable_iter_perf_stats": iter_stats})
    base = f"http://127.0.0.1:{port}"

    async def go() -> tuple[list, float, list, float, float, list]:
        async with httpx.AsyncClient(timeout=60) as client:

            async def healthy() -> bool:
                with contextlib.suppress(httpx.HTTPError):
                    return (await client.get(base + "/health")).status_code == 200
                return False

            await async_wait_until(healthy, timeout=60, what="the TensorRT-LLM simulator to serve")
            idle = (await client.get(base + "/metrics")).json()  # nothing submitted yet: [] at once
            loop = asyncio.get_running_loop()
            streaming = asyncio.Event()

            async def complete() -> float:
                body = {"model": MODEL, "prompt": "hi", "max_tokens": 150, "stream": True, "ignore_eos": True}
                async with client.stream("POST", base + "/v1/completions", json=body) as resp:
                    assert resp.status_code == 200
                    async for _ in resp.aiter_bytes():
                        streaming.set()
                return loop.time()

            request = asyncio.create_task(complete())
            await asyncio.wait_for(streaming.wait(), 30)
            asked = loop.time()
            held = (await client.get(base + "/metrics")).json()  # read while the completion streams
            answered = loop.time()
            finished = await request
            drained = (await client.get(base + "/metrics")).json()  # again, nothing submitted since
            return idle, asked, held, answered, finished, drained

    try:
        idle, asked, held, answered, finished, drained = asyncio.run(go())
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert idle == [] and drained == []
    assert answered - asked >= 0.9 * STATS_QUIET_S  # a read after a submission waits for the next stat
    if iter_stats:  # ... and while stats keep coming it ends only once the server has been quiet that long
        assert answered >= finished + 0.9 * STATS_QUIET_S
        assert held and all(stat["numActiveRequests"] >= 1 for stat in held)
        assert {"maxNumBlocks", "usedNumBlocks", "freeNumBlocks"} <= set(held[-1]["kvCacheStats"])
    else:
        assert held == []
