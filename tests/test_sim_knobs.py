"""The simulator's numeric knobs move TTFT, ITL and memory the way a real engine's do (docs/sim.md, "The tune
landscape"): ``--max-running-requests`` trades queueing for batch size and the KV cache bounds admission,
``--chunked-prefill-size`` prefills a long prompt chunk by chunk (its TTFT grows as the chunk shrinks),
a decode batch above ``--cuda-graph-max-bs`` runs eagerly (slower steps), and a chunk or a vLLM batch
budget too big for the memory ends the launch with the engine's recorded OOM text.

The scheduler runs for real (its own event loop, the model's step times slept for real) over a handful of
streams, so each case takes well under a second.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.util import free_port
from workers.engines.contract import load_contract
from workers.sim import args as sim_args
from workers.sim.engine import BatchScheduler, Sink, Stats, Stream
from workers.sim.launcher import spawn_sim
from workers.sim.perf import PerfModel, memory_plan
from workers.sim.profile import load_profile, model_spec_for

MODEL = "nvidia/Qwen3.5-397B-A17B-NVFP4"
BASE = ["--model-path", MODEL, "--tp", "8", "--quantization", "modelopt_fp4"]
BASE += ["--moe-runner-backend", "flashinfer_cutlass", "--fp4-gemm-backend", "flashinfer_cudnn"]


def _resolved(*extra: str):  # the sim's ServerArgs after 0.5.9's own choices
    ns = sim_args.parse([*BASE, *extra], {})
    profile, model = load_profile("rtx-pro-6000-x8"), model_spec_for(MODEL)
    sim_args.resolve(ns, profile, model, {})
    return ns, profile, model


def _perf(*extra: str) -> PerfModel:
    return PerfModel(*_resolved(*extra))


def _serve(prompts: list[int], *, out: int, max_running: int = 64, chunk: int = 8192, kv: int = 10**6) -> list[Stream]:
    """Every prompt submitted at once to a real batch scheduler; the streams once each has finished."""

    async def run() -> list[Stream]:
        scheduler = BatchScheduler(
            Stats(), False, _perf(), max_running, chunk, kv, 10**6, False, False, lambda idle: None, rank=None
        )
        scheduler.quiet = True
        scheduler.start()
        now = time.time()
        streams = [
            Stream(f"r{i}", 0, p, 0, out, None, random.Random(i), Sink(), now, False) for i, p in enumerate(prompts)
        ]
        scheduler.submit(streams)
        deadline = time.monotonic() + 20
        while not all(s.done for s in streams) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await scheduler.stop()
        assert all(s.done for s in streams), "the scheduler served every stream"
        return streams

    return asyncio.run(run())


def _ttft(s: Stream) -> float:
    return s.t_first - s.t_recv


def test_a_smaller_prefill_chunk_lengthens_a_long_prompts_ttft_chunk_by_chunk() -> None:
    perf = _perf()
    (whole,) = _serve([4096], out=2, chunk=8192)
    (chunked,) = _serve([4096], out=2, chunk=512)
    assert _ttft(whole) == pytest.approx(perf.prefill_s(4096), rel=0.25, abs=0.01)
    assert _ttft(chunked) == pytest.approx(8 * perf.prefill_s(512), rel=0.25, abs=0.02)  # eight forwards
    assert _ttft(chunked) > 1.5 * _ttft(whole)


def test_a_lower_max_running_queues_requests_and_the_kv_cache_bounds_admission() -> None:
    wide = _serve([64] * 8, out=12, max_running=8)
    narrow = _serve([64] * 8, out=12, max_running=2)
    assert max(map(_ttft, narrow)) > 3 * max(map(_ttft, wide)), "behind a cap of 2, six requests wait in line"
    # KV for 300 tokens: three 100-token prompts fit beside each other, the fourth waits until one is done
    kv_bound = _serve([100] * 4, out=6, kv=300)
    assert kv_bound[3].t_first >= min(s.t_done for s in kv_bound[:3])
    assert all(s.t_first < kv_bound[0].t_done for s in kv_bound[1:3])


def test_a_decode_batch_above_the_cuda_graph_limit_runs_eagerly_and_slower() -> None:
    small_graphs, big_graphs = _perf("--cuda-graph-max-bs", "32"), _perf("--cuda-graph-max-bs", "256")
    assert small_graphs.in_graph(32) and not small_graphs.in_graph(33) and big_graphs.in_graph(64)
    assert small_graphs.decode_step_s(32) == pytest.approx(big_graphs.decode_step_s(32))
    assert small_graphs.decode_step_s(64) > 1.1 * big_graphs.decode_step_s(64)  # +4.3 ms a step
    # ... and a bigger graph limit costs memory: the runtime headroom a launch needs grows with it
    graphs = [memory_plan(*_resolved("--cuda-graph-max-bs", bs)).graph_gb for bs in ("32", "256", "1024")]
    assert graphs == sorted(graphs) and graphs[2] > graphs[0] + 4


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        # SGLang's automatic --mem-fraction-static reserves 1.5 x the chunk: a huge chunk leaves no KV pool
        (["--chunked-prefill-size", "65536"], "RuntimeError: Not enough memory. Please try to increase"),
        # with the fraction pinned, the chunk's activations do not fit beside the static pool
        (
            ["--mem-fraction-static", "0.85", "--chunked-prefill-size", "32768"],
            "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate",
        ),
    ],
    ids=["auto_fraction", "pinned_fraction"],
)
def test_a_prefill_chunk_too_big_for_the_memory_ends_the_sglang_launch_with_its_text(
    tmp_path: Path, extra: list[str], needle: str
) -> None:
    auto = memory_plan(*_resolved("--chunked-prefill-size", "32768"))
    assert not auto.oom and 0 < auto.max_total_num_tokens < memory_plan(*_resolved()).max_total_num_tokens
    log = tmp_path / "log.txt"
    env = {"BENCHBOT_SIM_STATE_DIR": str(tmp_path)}
    proc = spawn_sim(free_port(), *BASE, *extra, env=env, log_path=log)
    try:
        code = proc.wait_exit(timeout=30)
    finally:
        proc.stop()
    text = log.read_text()
    assert code == -9 and needle in text, text[-3000:]


def test_a_vllm_batch_budget_too_big_to_profile_leaves_no_kv_cache_and_says_so(tmp_path: Path) -> None:
    contract = load_contract("vllm", "0.34.0")
    argv = ["serve", MODEL, "--port", str(free_port()), "-tp", "8", "--sim-load-s", "0.3"]
    out = subprocess.run(
        [sys.executable, "-m", "workers.sim.vllm", *argv, "--max-num-batched-tokens", "262144"],
        env={**os.environ, "BENCHBOT_SIM_STATE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    hint = contract.text("kv_cache_memory_hint")
    assert out.returncode == 1, out.stdout[-2000:]
    assert "ValueError: " + contract.texts["kv_cache_no_memory"].render({"hint": hint}) in out.stdout + out.stderr
