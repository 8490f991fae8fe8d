"""The sim's launch flags, the seed's failure modes, speculative decoding and the performance model."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.util import free_port
from workers.engines.contract import load_contract
from workers.sim import args as sim_args
from workers.sim.launcher import spawn_sim, start_sim
from workers.sim.perf import PerfModel, memory_plan
from workers.sim.profile import load_profile, model_spec_for

ROOT = Path(__file__).resolve().parents[1]
MODEL = "nvidia/Qwen3.5-397B-A17B-NVFP4"
BASE = [
    "--model-path",
    MODEL,
    "--tp",
    "8",
    "--quantization",
    "modelopt_fp4",
    "--moe-runner-backend",
    "flashinfer_cutlass",
    "--fp4-gemm-backend",
    "flashinfer_cudnn",
]
NEXTN = ["--speculative-algorithm", "NEXTN", "--mamba-scheduler-strategy", "extra_buffer"]


def _perf(argv: list[str], env: dict[str, str] | None = None) -> PerfModel:
    env = env or {}
    ns = sim_args.parse(argv, env)
    profile, model = load_profile("rtx-pro-6000-x8"), model_spec_for(ns.model_path)
    sim_args.resolve(ns, profile, model, env)
    return PerfModel(ns, profile, model)


def test_parser_speaks_sglang_flags() -> None:
    ns = sim_args.parse(
        ["--model", MODEL, "--tp", "8", "--fp4-gemm-backend", "flashinfer_cudnn", "--mem-fraction-static", "0.8"], {}
    )
    assert ns.model_path == MODEL and ns.tp_size == 8 and ns.fp4_gemm_runner_backend == "flashinfer_cudnn"
    assert sim_args.parse(["--model-path", "m", "--tensor-parallel-size", "4"], {}).tp_size == 4
    assert sim_args.parse(["--model-path", "m"], {"BENCHBOT_SIM_STARTUP_S": "0.25"}).sim_startup_s == 0.25


def test_unknown_flag_exits_2_like_sglang() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "workers.sim.sglang", "--model-path", "m", "--bogus-flag", "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2
    assert "usage:" in out.stderr and "error: unrecognized arguments: --bogus-flag 1" in out.stderr


def test_calibration_and_shape_of_the_model() -> None:
    base = _perf([*BASE, "--disable-custom-all-reduce"])
    assert base.single_stream_tok_s() == pytest.approx(72.0, abs=0.01)
    agg = [base.aggregate_tok_s(b) for b in (1, 8, 32, 128)]
    assert agg == sorted(agg) and agg[3] < 128 * agg[0] * 0.6  # grows, sub-linearly
    spec = _perf(BASE + NEXTN, {"SGLANG_ENABLE_SPEC_V2": "1"})
    assert 2.5 <= spec.mean_accept_len <= 3.0
    assert spec.single_stream_tok_s() / base.single_stream_tok_s() == pytest.approx(2.04, abs=0.005)
    assert _perf([*BASE, "--enable-mscclpp"]).single_stream_tok_s() > base.single_stream_tok_s()
    assert _perf(BASE + NEXTN).single_stream_tok_s() < spec.single_stream_tok_s()  # spec v1: no overlap


def test_memory_fraction_threshold() -> None:
    def oom(fraction: str) -> bool:
        ns = sim_args.parse([*BASE, "--mem-fraction-static", fraction], {})
        profile, model = load_profile(None), model_spec_for(MODEL)
        sim_args.resolve(ns, profile, model, {})
        return memory_plan(ns, profile, model).oom

    assert not oom("0.88") and not oom("0.92") and oom("0.93")


C9 = load_contract("sglang", "0.5.9")
#: (id, extra flags, env, text that must be in the log, exit code, whether ServerArgs was built and logged)
FAILURES = [
    # FlashInfer's own words: trtllm-gen MoE is built for SM100 only (the capture wraps the RuntimeError)
    (
        "moe_trtllm",
        ["--moe-runner-backend", "flashinfer_trtllm"],
        {},
        "Capture cuda graph failed: No supported CUDA architectures found for major versions [10].",
        -9,
        True,
    ),
    (
        "fp4_trtllm",
        ["--fp4-gemm-backend", "flashinfer_trtllm"],
        {},
        "flashinfer.utils.BackendSupportedError: mm_fp4 does not support backend 'trtllm' with capability 120",
        -9,
        True,
    ),
    (
        "topk",
        [
            *NEXTN,
            "--speculative-eagle-topk",
            "4",
            "--speculative-num-steps",
            "3",
            "--speculative-num-draft-tokens",
            "8",
        ],
        {"SGLANG_ENABLE_SPEC_V2": "1"},
        "ValueError: " + (C9.text("spec_v2_topk") or "?"),
        1,
        False,
    ),
    (
        "trtllm_mha",
        ["--attention-backend", "trtllm_mha"],
        {},
        "ValueError: " + (C9.text("trtllm_mha_sm100") or "?"),
        1,
        False,
    ),
    (
        "partial_spec",
        ["--speculative-algorithm", "NEXTN", "--speculative-eagle-topk", "1"],
        {},
        "\nAssertionError\n",
        1,
        False,
    ),
    (
        "oom",
        ["--mem-fraction-static", "0.95"],
        {},
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate",
        -9,
        True,
    ),
    (
        "kv_pool",
        ["--mem-fraction-static", "0.25"],
        {},
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
        "self.server_args.mem_fraction_static=0.25",
        -9,
        True,
    ),
]


@pytest.mark.parametrize(
    ("extra", "env", "needle", "exit_code", "logged_args"), [f[1:] for f in FAILURES], ids=[f[0] for f in FAILURES]
)
def test_failure_modes_exit_with_the_recorded_sglang_text(
    tmp_path: Path, extra: list[str], env: dict, needle: str, exit_code: int, logged_args: bool
) -> None:
    log = tmp_path / "log.txt"
    port = free_port()
    # later flags win in argparse, so the failing option simply overrides the baseline one
    proc = spawn_sim(port, *BASE, *extra, env={**env, "BENCHBOT_SIM_STATE_DIR": str(tmp_path)}, log_path=log)
    try:
        code = proc.wait_exit(timeout=30)
    finally:
        proc.stop()
    text = log.read_text()
    assert code == exit_code and needle in text, (code, text[-3000:])
    assert "The server is fired up" not in text and "Uvicorn running" not in text  # never listened
    assert ("server_args=ServerArgs(" in text) is logged_args
    if exit_code == -9:  # a scheduler failure: its exception, then the parent's sigquit line
        assert text.index("Scheduler hit an exception: Traceback") < text.index(C9.text("child_sigquit") or "?")
    assert not list(tmp_path.glob("*.json"))  # nothing left registered


def test_nextn_without_extra_buffer_on_0_5_9_warns_and_runs_without_radix_cache(tmp_path: Path) -> None:
    """0.5.9 disables the radix cache here; the "not compatible with radix cache" error is 0.5.10-0.5.13's."""
    env = {"SGLANG_ENABLE_SPEC_V2": "1", "BENCHBOT_SIM_STATE_DIR": str(tmp_path)}
    with start_sim(
        free_port(),
        *BASE,
        "--speculative-algorithm",
        "NEXTN",
        "--skip-server-warmup",
        env=env,
        log_path=tmp_path / "l.txt",
    ) as proc:
        info = httpx.get(proc.base_url + "/server_info").json()
        assert info["disable_radix_cache"] is True and info["speculative_algorithm"] == "EAGLE"
        log = proc.log_text()
        assert "Disabling radix cache since speculative decoding for Qwen3_5MoeForConditionalGeneration" in log
        assert "not compatible with radix cache" not in log


def test_cutedsl_starts_but_answers_bangs(tmp_path: Path) -> None:
    with start_sim(
        free_port(),
        *BASE,
        "--moe-runner-backend",
        "flashinfer_cutedsl",
        "--skip-server-warmup",
        env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path)},
    ) as proc:
        out = httpx.post(
            proc.base_url + "/generate",
            json={"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8}},
            timeout=30,
        )
        assert out.json()["text"] == "!" * 8 and out.json()["output_ids"] == [0] * 8
        assert (C9.text("nan_in_logits") or "?") not in proc.log_text()  # no detection asked for


def test_nan_detection_warns_with_the_recorded_text_and_keeps_serving_garbage(tmp_path: Path) -> None:
    nan = C9.text("nan_in_logits") or "?"
    with start_sim(
        free_port(),
        *BASE,
        "--moe-runner-backend",
        "flashinfer_cutedsl",
        "--enable-nan-detection",
        env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path)},
        log_path=tmp_path / "l.txt",
    ) as proc:
        for _ in range(2):
            out = httpx.post(
                proc.base_url + "/generate",
                json={"text": "x", "sampling_params": {"max_new_tokens": 45, "ignore_eos": True}},
                timeout=30,
            )
            assert out.status_code == 200 and out.json()["text"] == "!" * 45
        assert proc.health() == 200 and proc.proc.poll() is None  # a warning, not a crash
        lines = [ln for ln in proc.log_text().splitlines() if nan in ln]
        assert len(lines) >= 3 and all(ln.endswith(f"TP0] {nan}") for ln in lines)


def test_nextn_server_streams_multi_token_chunks(tmp_path: Path) -> None:
    env = {"SGLANG_ENABLE_SPEC_V2": "1", "BENCHBOT_SIM_STATE_DIR": str(tmp_path)}
    with start_sim(free_port(), *BASE, *NEXTN, env=env, log_path=tmp_path / "l.txt") as proc:
        info = httpx.get(proc.base_url + "/server_info").json()
        assert info["speculative_algorithm"] == "EAGLE" and info["max_running_requests"] == 48
        assert (
            info["speculative_num_steps"],
            info["speculative_eagle_topk"],
            info["speculative_num_draft_tokens"],
        ) == (3, 1, 4)
        body = {"text": "spec", "sampling_params": {"max_new_tokens": 150, "ignore_eos": True}, "stream": True}
        chunks = []
        with httpx.Client(timeout=30) as client, client.stream("POST", proc.base_url + "/generate", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
        counts = [c["meta_info"]["completion_tokens"] for c in chunks]
        steps = [b - a for a, b in itertools.pairwise(counts)]
        assert counts[-1] == 150 and max(steps) > 1 and len(chunks) < 100
        meta = chunks[-1]["meta_info"]
        assert 2.0 < meta["spec_accept_length"] < 3.5 and meta["spec_verify_ct"] == len(chunks) - 1
        assert {"spec_accept_rate", "spec_accept_histogram", "spec_draft_token_num"} <= set(meta)
        state = httpx.get(proc.base_url + "/server_info").json()["internal_states"][0]
        assert 2.0 < state["avg_spec_accept_length"] < 3.5 and state["last_gen_throughput"] > 0
        log = (tmp_path / "l.txt").read_text()
        assert "Max running requests is reset to 48 for speculative decoding" in log
        assert "accept len: " in log and "gen throughput (token/s): " in log
