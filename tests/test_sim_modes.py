"""The sim's launch flags, the seed's failure modes, speculative decoding and the performance model."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.util import free_port
from workers.sim import args as sim_args
from workers.sim.launcher import spawn_sim, start_sim
from workers.sim.perf import PerfModel, memory_plan
from workers.sim.profile import load_profile, model_spec_for

ROOT = Path(__file__).resolve().parents[1]
MODEL = "nvidia/Qwen3.5-397B-A17B-NVFP4"
BASE = ["--model-path", MODEL, "--tp", "8", "--quantization", "modelopt_fp4",
        "--moe-runner-backend", "flashinfer_cutlass", "--fp4-gemm-backend", "flashinfer_cudnn"]
NEXTN = ["--speculative-algorithm", "NEXTN", "--mamba-scheduler-strategy", "extra_buffer"]


def _perf(argv: list[str], env: dict[str, str] | None = None) -> PerfModel:
    env = env or {}
    ns = sim_args.parse(argv, env)
    profile, model = load_profile("rtx-pro-6000-x8"), model_spec_for(ns.model_path)
    sim_args.resolve(ns, profile, model, env)
    return PerfModel(ns, profile, model)


def test_parser_speaks_sglang_flags() -> None:
    ns = sim_args.parse(["--model", MODEL, "--tp", "8", "--fp4-gemm-backend", "flashinfer_cudnn",
                         "--mem-fraction-static", "0.8"], {})
    assert ns.model_path == MODEL and ns.tp_size == 8 and ns.fp4_gemm_runner_backend == "flashinfer_cudnn"
    assert sim_args.parse(["--model-path", "m", "--tensor-parallel-size", "4"], {}).tp_size == 4
    assert sim_args.parse(["--model-path", "m"], {"BENCHBOT_SIM_STARTUP_S": "0.25"}).sim_startup_s == 0.25


def test_unknown_flag_exits_2_like_sglang() -> None:
    out = subprocess.run([sys.executable, "-m", "workers.sim.sglang", "--model-path", "m", "--bogus-flag", "1"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    assert "usage:" in out.stderr and "error: unrecognized arguments: --bogus-flag 1" in out.stderr


def test_calibration_and_shape_of_the_model() -> None:
    base = _perf([*BASE, "--disable-custom-all-reduce"])
    assert base.single_stream_tok_s() == pytest.approx(72, rel=0.03)
    agg = [base.aggregate_tok_s(b) for b in (1, 8, 32, 128)]
    assert agg == sorted(agg) and agg[3] < 128 * agg[0] * 0.6  # grows, sub-linearly
    spec = _perf(BASE + NEXTN, {"SGLANG_ENABLE_SPEC_V2": "1"})
    assert 2.5 <= spec.mean_accept_len <= 3.0
    assert 1.8 <= spec.single_stream_tok_s() / base.single_stream_tok_s() <= 2.2
    assert _perf([*BASE, "--enable-mscclpp"]).single_stream_tok_s() > base.single_stream_tok_s()
    assert _perf(BASE + NEXTN).single_stream_tok_s() < spec.single_stream_tok_s()  # spec v1: no overlap


def test_memory_fraction_threshold() -> None:
    def oom(fraction: str) -> bool:
        ns = sim_args.parse([*BASE, "--mem-fraction-static", fraction], {})
        profile, model = load_profile(None), model_spec_for(MODEL)
        sim_args.resolve(ns, profile, model, {})
        return memory_plan(ns, profile, model).oom

    assert not oom("0.88") and not oom("0.92") and oom("0.93")


FAILURES = [
    ("moe_trtllm", ["--moe-runner-backend", "flashinfer_trtllm"], {},
     "RuntimeError: No supported CUDA architectures found for major versions [10]."),
    ("fp4_trtllm", ["--fp4-gemm-backend", "flashinfer_trtllm"], {},
     "BackendSupportedError: mm_fp4 does not support backend 'trtllm' with capability 120"),
    ("mamba", ["--speculative-algorithm", "NEXTN"], {"SGLANG_ENABLE_SPEC_V2": "1"},
     "is not compatible with radix cache when using --mamba-scheduler-strategy no_buffer"),
    ("topk", [*NEXTN, "--speculative-eagle-topk", "4", "--speculative-num-steps", "3",
              "--speculative-num-draft-tokens", "8"], {"SGLANG_ENABLE_SPEC_V2": "1"},
     "ValueError: Spec v2 currently only supports topk = 1 for speculative decoding."),
    ("oom", ["--mem-fraction-static", "0.95"], {}, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"),
]


@pytest.mark.parametrize(("extra", "env", "needle"), [f[1:] for f in FAILURES], ids=[f[0] for f in FAILURES])
def test_failure_modes_exit_nonzero_with_sglang_text(tmp_path: Path, extra: list[str], env: dict, needle: str) -> None:
    log = tmp_path / "log.txt"
    # later flags win in argparse, so the failing option simply overrides the baseline one
    proc = spawn_sim(free_port(), *BASE, *extra, env={**env, "BENCHBOT_SIM_STATE_DIR": str(tmp_path)},
                     log_path=log)
    try:
        code = proc.wait_exit(timeout=30)
    finally:
        proc.stop()
    text = log.read_text()
    assert code != 0 and needle in text
    assert "The server is fired up" not in text and "server_args=ServerArgs(" in text
    assert not list(tmp_path.glob("*.json"))  # nothing left registered


def test_port_in_use_dies_with_bind_error(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = spawn_sim(port, *BASE, env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path)}, log_path=tmp_path / "l.txt")
        code = proc.wait_exit(timeout=30)
    text = (tmp_path / "l.txt").read_text()
    assert code == 1 and "[Errno 98]" in text and "address already in use" in text
    assert text.index("Load weight end") < text.index("[Errno 98]")


def test_cutedsl_starts_but_answers_bangs(tmp_path: Path) -> None:
    with start_sim(free_port(), *BASE, "--moe-runner-backend", "flashinfer_cutedsl", "--skip-server-warmup",
                   env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path)}) as proc:
        out = httpx.post(proc.base_url + "/generate", json={"text": "The capital of France is",
                                                            "sampling_params": {"max_new_tokens": 8}}, timeout=30)
        assert out.json()["text"] == "!" * 8 and out.json()["output_ids"] == [0] * 8


def test_nextn_server_streams_multi_token_chunks(tmp_path: Path) -> None:
    env = {"SGLANG_ENABLE_SPEC_V2": "1", "BENCHBOT_SIM_STATE_DIR": str(tmp_path)}
    with start_sim(free_port(), *BASE, *NEXTN, env=env, log_path=tmp_path / "l.txt") as proc:
        info = httpx.get(proc.base_url + "/server_info").json()
        assert info["speculative_algorithm"] == "EAGLE" and info["max_running_requests"] == 48
        assert (info["speculative_num_steps"], info["speculative_eagle_topk"],
                info["speculative_num_draft_tokens"]) == (3, 1, 4)
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
