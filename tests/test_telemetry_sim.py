"""The sampler against a real simulated SGLang server and the nvidia-smi stand-in, through a real transport."""

from __future__ import annotations

import asyncio
import sys
from argparse import Namespace
from pathlib import Path

from tests.test_sim import BASELINE
from tests.util import async_wait_until, free_port
from workers.benchmark.client import run_bench
from workers.benchmark.settings import ClientSettings
from workers.benchmark.spec import BenchSpec
from workers.engines import registry
from workers.host.local import LocalTransport
from workers.sim.gpu_load import pcie_bytes_per_tok
from workers.sim.launcher import start_sim
from workers.sim.perf import PerfModel
from workers.sim.profile import PROFILES, model_spec_for
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
