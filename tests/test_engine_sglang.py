"""workers.engines.sglang: flags, diffs, server_info, diagnosis rules, garbage, readiness, smoke test.

HTTP behaviour is tested against a real aiohttp server on 127.0.0.1 (:class:`FakeSglang`) that answers
like SGLang does; the log excerpts are shaped like real SGLang logs (timestamps, TP ranks, tracebacks).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from tests.util import free_port
from workers.engines.args import parse_argv
from workers.engines.contract import all_contracts
from workers.engines.diagnosis import CATEGORIES, Diagnosis
from workers.engines.readiness import ReadyResult, is_garbage
from workers.engines.sglang.diagnosis import RULES, diagnose, match_rule, smoke_diagnosis
from workers.engines.sglang.flags import compare_requested, flag_to_arg, redact_argv, requested_args
from workers.engines.sglang.readiness import smoke_test, wait_ready
from workers.engines.sglang.server_info import parse_server_info
from workers.secrets import REDACTED, redact_text

# ---------------------------------------------------------------------------------------------------------
# A small SGLang-shaped HTTP server (real socket on 127.0.0.1)
# ---------------------------------------------------------------------------------------------------------

SERVER_INFO_059: dict[str, Any] = {
    "model_path": "/models/Qwen3.5-397B-A17B-NVFP4",
    "tokenizer_path": "/models/Qwen3.5-397B-A17B-NVFP4",
    "served_model_name": "qwen35",
    "host": "127.0.0.1",
    "port": 30000,
    "api_key": "sk-very-secret",
    "tp_size": 8,
    "dp_size": 1,
    "ep_size": 1,
    "mem_fraction_static": 0.84,
    "random_seed": 123456789,
    "nccl_port": 31337,
    "quantization": "modelopt_fp4",
    "kv_cache_dtype": "fp8_e4m3",
    "moe_runner_backend": "flashinfer_cutlass",
    "fp4_gemm_runner_backend": "flashinfer_cudnn",
    "attention_backend": "triton",
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "disable_overlap_schedule": False,
    "disable_custom_all_reduce": True,
    "enable_mscclpp": False,
    "mamba_scheduler_strategy": "extra_buffer",
    "max_running_requests": 48,
    "cuda_graph_max_bs": 512,
    "log_level": "info",
    "status": "ready",
    "max_total_num_tokens": 1234567,
    "max_req_input_len": 262136,
    "internal_states": [
        {
            "tp_size": 8,
            "moe_runner_backend": "flashinfer_cutlass",
            "last_gen_throughput": 131.5,
            "memory_usage": {"weight": 30.1, "kvcache": 40.2, "graph": 1.5, "token_capacity": 1234567},
            "effective_max_running_requests_per_dp": 48,
            "avg_spec_accept_length": 2.71,
        }
    ],
    "version": "0.5.9",
}

SERVER_INFO_0523: dict[str, Any] = {
    "model_path": "/models/Qwen3.5-397B-A17B-NVFP4",
    "served_model_name": "qwen35",
    "api_key": "sk-other-secret",
    "admin_api_key": None,
    "tp_size": 4,
    "moe_runner_backend": "flashinfer_cutlass",
    "fp4_gemm_runner_backend": "flashinfer_cutlass",
    "speculative_algorithm": None,
    "mamba_radix_cache_strategy": "extra_buffer",
    "cuda_graph_max_bs_decode": 256,
    "launch_command": "python -m sglang.launch_server --model-path /m --tp 4 --api-key sk-other-secret",
    "kv_events": None,
    "startup_time": 1767225600.5,
    "internal_states": [
        {"last_gen_throughput": 350.0, "world_size": 4, "memory_usage": {"weight": 50, "kvcache": 30}},
    ],
    "version": "0.5.23",
    "frontend": "python",
}


class FakeSglang:
    """Answers /health, /server_info and /generate from attributes a test can change at any time."""

    def __init__(self) -> None:
        self.health_codes: list[int] = [200]  # consumed one per request; the last one repeats
        self.health_calls = 0
        self.server_info: dict[str, Any] | None = SERVER_INFO_059
        self.server_info_status = 200
        self.server_info_paths = ("/server_info", "/get_server_info")
        self.generate_status = 200
        self.generate_body: Any = {
            "text": " Paris. It is the largest city in France!",
            "output_ids": list(range(16)),
            "meta_info": {"id": "x", "prompt_tokens": 6, "completion_tokens": 16, "finish_reason": None},
        }
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _health(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, dict(request.headers), None))
        code = self.health_codes[min(self.health_calls, len(self.health_codes) - 1)]
        self.health_calls += 1
        return web.Response(status=code, text="")

    async def _server_info(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, dict(request.headers), None))
        if request.path not in self.server_info_paths:
            return web.json_response({"detail": "Not Found"}, status=404)
        if self.server_info_status != 200:
            return web.Response(status=self.server_info_status, text="starting")
        return web.json_response(self.server_info)

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append((request.path, dict(request.headers), body))
        if self.generate_status != 200:
            return web.Response(status=self.generate_status, text="Internal Server Error: boom")
        return web.json_response(self.generate_body)

    async def start(self) -> FakeSglang:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/get_server_info", self._server_info)
        app.router.add_post("/generate", self._generate)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self.runner:
            await self.runner.cleanup()


def with_server(body: Callable[[FakeSglang], Awaitable[Any]]) -> Any:
    """Run ``body(server)`` on a fresh event loop with a started FakeSglang, always stopping it."""

    async def main() -> Any:
        server = await FakeSglang().start()
        try:
            return await body(server)
        finally:
            await server.stop()

    return asyncio.run(main())


# ---------------------------------------------------------------------------------------------------------
# Flags and requested args
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "arg"),
    [
        ("--tp", "tp_size"),
        ("--tp-size", "tp_size"),
        ("--tensor-parallel-size", "tp_size"),
        ("--dp", "dp_size"),
        ("--fp4-gemm-backend", "fp4_gemm_runner_backend"),
        ("--model", "model_path"),
        ("--model-path", "model_path"),
        ("--speculative-draft-model", "speculative_draft_model_path"),
        ("--moe-runner-backend", "moe_runner_backend"),
        ("--disable-custom-all-reduce", "disable_custom_all_reduce"),
        ("--mem-fraction-static=0.8", "mem_fraction_static"),
        ("moe_runner_backend", "moe_runner_backend"),
    ],
)
def test_flag_to_arg(flag: str, arg: str) -> None:
    assert flag_to_arg(flag) == arg


def test_requested_args_coerces_like_argparse() -> None:
    got = requested_args(
        {
            "--tp": "8",
            "--mem-fraction-static": "0.85",
            "--disable-custom-all-reduce": True,
            "--enable-mscclpp": False,
            "--speculative-algorithm": "NEXTN",
            "--model-path": "/models/q",
            "--cuda-graph-bs": ["1", "2", "4"],
            "--chunked-prefill-size": "-1",
        }
    )
    assert got == {
        "tp_size": 8,
        "mem_fraction_static": 0.85,
        "disable_custom_all_reduce": True,
        "enable_mscclpp": False,
        "speculative_algorithm": "NEXTN",
        "model_path": "/models/q",
        # the newest recorded release that accepts --cuda-graph-bs (0.5.19) stores it as the decode list;
        # 0.5.9-0.5.13 as cuda_graph_bs (below), 0.5.20+ refuse it as ambiguous
        "cuda_graph_bs_decode": [1, 2, 4],
        "chunked_prefill_size": -1,
    }
    assert isinstance(got["tp_size"], int) and isinstance(got["mem_fraction_static"], float)
    old = next(c for c in all_contracts("sglang") if c.version == "0.5.10")
    assert requested_args({"--cuda-graph-bs": ["1", "2"]}, old) == {"cuda_graph_bs": [1, 2]}


def test_parse_argv_reads_a_launch_command() -> None:
    argv = [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/m",
        "--tp",
        "8",
        "--disable-custom-all-reduce",
        "--cuda-graph-bs",
        "1",
        "2",
        "--api-key=k",
        "--port",
        "30000",
    ]
    assert parse_argv(argv) == {
        "--model-path": "/m",
        "--tp": "8",
        "--disable-custom-all-reduce": True,
        "--cuda-graph-bs": ["1", "2"],
        "--api-key": "k",
        "--port": "30000",
    }


def test_compare_treats_nextn_as_eagle_and_says_so() -> None:
    requested = requested_args({"--speculative-algorithm": "NEXTN", "--tp": "8"})
    result = compare_requested(requested, SERVER_INFO_059)
    assert result.diffs == []
    assert len(result.notes) == 1
    assert "NEXTN" in result.notes[0] and "EAGLE" in result.notes[0] and "equal" in result.notes[0]


def test_compare_reports_real_differences_only_over_requested_keys() -> None:
    requested = requested_args(
        {
            "--moe-runner-backend": "flashinfer_trtllm",  # differs
            "--tp": "8.0",  # equal after coercion
            "--mem-fraction-static": "0.84",  # equal
            "--disable-custom-all-reduce": True,  # equal
            "--enable-mscclpp": True,  # differs (server: False)
            "--disable-overlap-schedule": False,  # equal
            "--enable-pcie-oneshot-allreduce": True,  # not reported -> a diff, never assumed fine
            "--api-key": "whatever",  # never compared
        }
    )
    diffs = {d.arg: d for d in compare_requested(requested, SERVER_INFO_059).diffs}
    assert set(diffs) == {"moe_runner_backend", "enable_mscclpp", "enable_pcie_oneshot_allreduce"}
    assert diffs["moe_runner_backend"].observed == "flashinfer_cutlass"
    assert diffs["enable_pcie_oneshot_allreduce"].observed is None
    assert "not reported" in diffs["enable_pcie_oneshot_allreduce"].note


def test_compare_baseline_request_against_nextn_server_is_caught() -> None:
    """The seed: "baseline" (no speculative decoding) must not match a NEXTN server."""
    observed = dict(SERVER_INFO_059)
    requested = {"speculative_algorithm": None}
    diffs = compare_requested(requested, observed).diffs
    assert [(d.arg, d.observed) for d in diffs] == [("speculative_algorithm", "EAGLE")]


def test_compare_auto_and_renamed_args() -> None:
    requested = requested_args(
        {
            "--moe-runner-backend": "auto",
            "--mamba-scheduler-strategy": "extra_buffer",
            "--cuda-graph-max-bs": "256",
        }
    )
    result = compare_requested(requested, SERVER_INFO_0523)
    assert result.diffs == []
    assert any("auto" in n and "flashinfer_cutlass" in n for n in result.notes)
    wrong = compare_requested(requested_args({"--mamba-scheduler-strategy": "no_buffer"}), SERVER_INFO_0523)
    # Unversioned, the flag maps as the newest release that accepts it stores it: 0.5.14-0.5.19 keep
    # --mamba-scheduler-strategy as an alias of mamba_radix_cache_strategy, the arg 0.5.23 reports.
    assert [(d.arg, d.observed) for d in wrong.diffs] == [("mamba_radix_cache_strategy", "extra_buffer")]


# ---------------------------------------------------------------------------------------------------------
# server_info and redaction
# ---------------------------------------------------------------------------------------------------------


def test_parse_server_info_059_flat_shape() -> None:
    info = parse_server_info(SERVER_INFO_059)
    assert info.version == "0.5.9"
    assert info.args["tp_size"] == 8
    assert info.args["api_key"] == REDACTED
    assert "internal_states" not in info.args and "max_total_num_tokens" not in info.args
    assert info.internal["max_total_num_tokens"] == 1234567
    assert info.internal["avg_spec_accept_length"] == 2.71
    assert info.internal["last_gen_throughput"] == 131.5
    assert "tp_size" not in info.internal  # the args the internal state repeats are not duplicated
    assert "sk-very-secret" not in repr(info)


def test_parse_server_info_0523_shape() -> None:
    info = parse_server_info(SERVER_INFO_0523)
    assert info.version == "0.5.23"
    assert info.args["api_key"] == REDACTED
    assert info.args["admin_api_key"] is None  # unset stays visible as unset
    assert "launch_command" not in info.args and "frontend" not in info.args
    assert info.internal["world_size"] == 4 and info.internal["startup_time"] == 1767225600.5
    assert info.launch_command is not None and "sk-other-secret" not in info.launch_command
    assert "--api-key REDACTED" in info.launch_command
    assert "sk-other-secret" not in repr(info)


def test_parse_server_info_nested_args_and_bad_input() -> None:
    nested = {"server_args": {"tp_size": 2, "model_path": "/m", "hf_token": "hf_abc"}, "version": "0.6.0"}
    info = parse_server_info(nested)
    assert info.args == {"tp_size": 2, "model_path": "/m", "hf_token": REDACTED}
    with pytest.raises(ValueError):
        parse_server_info(["not", "an", "object"])  # type: ignore[arg-type]


def test_redact_text_and_argv() -> None:
    line = (
        "server_args=ServerArgs(model_path='/m', api_key='sk-123', admin_api_key=None, "
        "max_total_num_tokens=99, hf_token='hf_x') --api-key sk-456 Authorization: Bearer tok.en-1"
    )
    out = redact_text(line)
    for secret in ("sk-123", "sk-456", "hf_x", "tok.en-1"):
        assert secret not in out
    assert "admin_api_key=None" in out and "max_total_num_tokens=99" in out
    assert redact_argv(["x", "--api-key", "k1", "--tp", "8", "--api-key=k2"]) == [
        "x",
        "--api-key",
        REDACTED,
        "--tp",
        "8",
        f"--api-key={REDACTED}",
    ]


# ---------------------------------------------------------------------------------------------------------
# Diagnosis rules on realistic log excerpts
# ---------------------------------------------------------------------------------------------------------

PREFIX = "[2026-03-01 10:00:00 TP0] "
LOAD = (
    "[2026-03-01 09:59:00] server_args=ServerArgs(model_path='/models/Qwen3.5-397B-A17B-NVFP4', "
    "tp_size=8, api_key='sk-secret-in-log', moe_runner_backend='flashinfer_cutlass')\n"
    "[2026-03-01 09:59:10 TP0] Load weight begin. avail mem=94.20 GB\n"
    "[2026-03-01 09:59:50 TP0] Load weight end. type=Qwen3_5MoeForCausalLM, dtype=torch.bfloat16, "
    "avail mem=45.10 GB, mem usage=49.10 GB.\n"
)


def traceback(*frames: str, last: str) -> str:
    site = "/usr/lib/python3.12/site-packages/sglang/srt"
    body = "".join(f'  File "{site}/{f}", line 42, in run\n' for f in frames)
    return f"{PREFIX}Scheduler hit an exception: Traceback (most recent call last):\n{body}{last}\n"


#: (log excerpt, expected category, text the evidence line must contain)
CASES: list[tuple[str, str, str]] = [
    (
        LOAD
        + traceback(
            "model_executor/model_runner.py",
            "layers/quantization/fp4_utils.py",
            last="flashinfer.utils.BackendSupportedError: mm_fp4 does not support backend 'trtllm' with capability 120",
        ),
        "unsupported_gpu",
        "with capability 120",
    ),
    (  # FlashInfer's real wording (flashinfer/utils.py backend_requirement)
        LOAD
        + traceback(
            "model_executor/model_runner.py",
            "layers/quantization/fp4_utils.py",
            last="flashinfer.utils.BackendSupportedError: mm_fp4 does not support backend 'trtllm' with capability 120",
        ),
        "unsupported_gpu",
        "with capability 120",
    ),
    (  # trtllm-gen MoE JIT on SM120, wrapped by the CUDA graph capture (before the OOM rule matches it)
        LOAD
        + traceback(
            "model_executor/cuda_graph_runner.py",
            last="Exception: Capture cuda graph failed: No supported CUDA architectures found for "
            "major versions [10].\nPossible solutions:\n1. set --mem-fraction-static to a smaller "
            "value (e.g., 0.8 or 0.7)",
        ),
        "unsupported_gpu",
        "major versions [10]",
    ),
    (
        LOAD
        + traceback(
            "layers/moe/fused_moe_triton/layer.py",
            last="RuntimeError: No supported CUDA architectures found for major versions [10].",
        ),
        "unsupported_gpu",
        "major versions [10]",
    ),
    (
        LOAD + 'Traceback (most recent call last):\n  File "launch_server.py", line 11, in <module>\n'
        "ValueError: TRTLLM MHA backend is only supported on Blackwell GPUs (SM100). Please use a different "
        "backend.\n",
        "unsupported_gpu",
        "SM100",
    ),
    (
        LOAD + 'Traceback (most recent call last):\n  File "launch_server.py", line 11, in <module>\n'
        "ValueError: TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x). Please use a "
        "different backend.\n",
        "unsupported_gpu",
        "TRTLLM MLA",
    ),
    (
        LOAD
        + traceback(
            "layers/quantization/modelopt_quant.py",
            last="ValueError: Current platform does not support NVFP4 quantization. Please use Blackwell and above.",
        ),
        "unsupported_gpu",
        "NVFP4",
    ),
    (
        LOAD
        + traceback(
            "layers/activation.py",
            last="RuntimeError: CUDA error: no kernel image is available for execution on the device",
        ),
        "unsupported_gpu",
        "no kernel image",
    ),
    (
        LOAD + PREFIX + "Decode batch, #running-req: 32, #token: 40000, token usage: 0.20, accept len: 2.10, "
        "cuda graph: True, gen throughput (token/s): 900.1, #queue-req: 0\n"
        + traceback(
            "layers/sampler.py",
            last="/pytorch/aten/src/ATen/native/cuda/MultinomialKernel.cu:112: "
            "Assertion `probability tensor contains either `inf`, `nan` or element < 0` failed.",
        ),
        "garbage_output",
        "probability tensor",
    ),
    (
        LOAD + PREFIX + "Detected errors during sampling! NaN in the logits.\n",
        "garbage_output",
        "NaN in the logits",
    ),
    (
        LOAD
        + PREFIX
        + "Detected errors during sampling! NaN in the logits.\n"
        + traceback(
            "speculative/spec_utils.py", last="ValueError: Detected errors during sampling! NaN in the logits."
        ),
        "garbage_output",
        "ValueError: Detected errors",
    ),
    (
        'Traceback (most recent call last):\n  File "sglang/launch_server.py", line 14, in <module>\n'
        '  File "sglang/srt/server_args.py", line 2390, in _handle_speculative_decoding\n'
        "ValueError: Spec v2 currently only supports topk = 1 for speculative decoding.\n",
        "config_error",
        "topk = 1",
    ),
    (
        '  File "sglang/srt/server_args.py", line 2204, in _handle_mamba\n'
        "ValueError: Speculative decoding for Qwen3_5MoeForConditionalGeneration is not compatible with "
        "radix cache when using --mamba-scheduler-strategy no_buffer.To use radix cache with speculative "
        "decoding, please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1.\n",
        "config_error",
        "no_buffer",
    ),
    (
        "ValueError: mamba_track_interval 2 must be greater than or equal to speculative_num_draft_tokens 4\n",
        "config_error",
        "mamba_track_interval 2",
    ),
    (
        "ValueError: mamba_track_interval 100 must be divisible by page_size 64\n",
        "config_error",
        "divisible by page_size",
    ),
    (
        LOAD
        + traceback(
            "layers/moe/fused_moe.py",
            last="AssertionError: apply_router_weight_on_input is not supported for Flashinfer",
        ),
        "assertion",
        "apply_router_weight_on_input",
    ),
    (
        LOAD
        + PREFIX
        + "KV Cache is allocated. #tokens: 0\n"
        + traceback(
            "model_executor/model_runner_kv_cache_mixin.py",
            last="RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
        ),
        "oom",
        "Not enough memory",
    ),
    (
        LOAD
        + traceback(
            "model_executor/cuda_graph_runner.py",
            last="Exception: Capture cuda graph failed: CUDA out of memory. "
            "Possible solutions:\n"
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
            "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)",
        ),
        "oom",
        "Capture cuda graph failed",
    ),
    (
        LOAD
        + traceback(
            "models/qwen3_5.py",
            last="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
            " GPU 3 has a total capacity of 95.59 GiB of which 1.12 GiB is free.",
        ),
        "oom",
        "CUDA out of memory",
    ),
    (
        LOAD + PREFIX + "Decode out of memory. Try to lower your batch size.\n",
        "oom",
        "Decode out of memory",
    ),
    (
        LOAD + "[2026-03-01 10:01:00] ERROR:    [Errno 98] error while attempting to bind on address "
        "('127.0.0.1', 30000): address already in use\n",
        "port_in_use",
        "30000",
    ),
    (
        LOAD + "[2026-03-01 10:00:40] port 30001 is in use. Waiting for 15 seconds for nccl_port to be "
        "available. nccl_port is used by a process already.\n"
        "ValueError: nccl_port at 30001 is not available in 30 seconds. nccl_port is used by a process "
        "already.\n",
        "port_in_use",
        "nccl_port at 30001",
    ),
    (
        "usage: launch_server.py [-h] --model-path MODEL_PATH ...\n"
        "launch_server.py: error: unrecognized arguments: --enable-pcie-oneshot-allreduce --fast\n",
        "config_error",
        "--enable-pcie-oneshot-allreduce",
    ),
    (
        "usage: launch_server.py [-h] --model-path MODEL_PATH ...\n"
        "launch_server.py: error: argument --moe-runner-backend: invalid choice: 'cutlas' "
        "(choose from 'auto', 'triton', 'flashinfer_cutlass')\n",
        "config_error",
        "invalid choice",
    ),
    (
        traceback(
            "model_executor/model_runner.py",
            last="torch.AcceleratorError: CUDA error: invalid device ordinal\nCUDA kernel errors might be "
            "asynchronously reported at some other API call",
        ),
        "config_error",
        "invalid device ordinal",
    ),
    (
        LOAD + traceback("layers/moe/topk.py", last="RuntimeError: CUDA error: device-side assert triggered"),
        "assertion",
        "device-side assert",
    ),
    (
        '  File "sglang/srt/server_args.py", line 5760, in auto_choose_speculative_params\n'
        "    assert self.speculative_num_draft_tokens is not None\nAssertionError\n",
        "assertion",
        "AssertionError",
    ),
    (
        '  File "sglang/srt/server_args.py", line 900, in __post_init__\n'
        "ValueError: --kv-cache-dtype fp4_e2m1 requires --attention-backend trtllm_mla\n",
        "config_error",
        "fp4_e2m1",
    ),
    (
        LOAD + traceback("managers/scheduler.py", last="KeyError: 'layers.0.mlp.experts.w13_weight_scale'"),
        "crashed",
        "Scheduler hit an exception",
    ),
    (
        LOAD + "[2026-03-01 10:00:02] Received sigquit from a child process. It usually means the child failed.\n",
        "crashed",
        "sigquit",
    ),
]


CASE_IDS = [f"{c[1]}-{i}" for i, c in enumerate(CASES)]


@pytest.mark.parametrize(("log", "category", "evidence"), CASES, ids=CASE_IDS)
def test_diagnose_known_failures(log: str, category: str, evidence: str) -> None:
    d = diagnose(log, exited=True, returncode=1, timed_out=False)
    assert d.category == category, d
    assert evidence in d.evidence_line
    assert d.summary.endswith(".") and "\n" not in d.summary and len(d.summary) < 300
    assert "sk-secret-in-log" not in d.log_tail + d.evidence_line + d.summary
    assert d.log_tail.splitlines()[-1] in log  # the tail ends where the log ends


def test_every_rule_has_a_realistic_example() -> None:
    hit = set()
    for log, _, _ in CASES:
        found = match_rule(log)
        assert found is not None
        hit.add(found[0].pattern.pattern)
    missing = [r.pattern.pattern for r in RULES if r.pattern.pattern not in hit]
    assert missing == []
    assert {r.category for r in RULES} | {"timeout"} == set(CATEGORIES)


def test_cause_wins_over_the_scheduler_wrapper() -> None:
    log = traceback("model_executor/model_runner.py", last="torch.OutOfMemoryError: CUDA out of memory.")
    assert diagnose(log, exited=True, returncode=1, timed_out=False).category == "oom"


def test_unknown_crash_shows_the_last_exception_line() -> None:
    log = LOAD + 'Traceback (most recent call last):\n  File "x.py", line 1\n'
    log += "ZeroDivisionError: division by zero\n"
    log += "[2026-03-01 10:00:03] some shutdown chatter\n"
    d = diagnose(log, exited=True, returncode=1, timed_out=False)
    assert d.category == "crashed"
    assert d.evidence_line == "ZeroDivisionError: division by zero"
    assert "code 1" in d.summary
    killed = diagnose(LOAD, exited=True, returncode=-9, timed_out=False)
    assert "SIGKILL" in killed.summary


def test_timeout_and_non_fatal_rules() -> None:
    d = diagnose(LOAD, exited=False, returncode=None, timed_out=True)
    assert d.category == "timeout" and "deadline" in d.summary
    assert "Load weight end" in d.evidence_line
    # A logged-and-survived ValueError does not explain a live process that is merely slow ...
    log = LOAD + "ValueError: could not parse optional field, using default\n"
    assert diagnose(log, exited=False, returncode=None, timed_out=True).category == "timeout"
    # ... but it does explain one that died.
    assert diagnose(log, exited=True, returncode=1, timed_out=False).category == "config_error"


def test_log_tail_is_the_last_40_lines() -> None:
    log = "".join(f"line {i}\n" for i in range(100))
    d = diagnose(log, exited=True, returncode=1, timed_out=False)
    lines = d.log_tail.splitlines()
    assert len(lines) == 40 and lines[0] == "line 60" and lines[-1] == "line 99"


# ---------------------------------------------------------------------------------------------------------
# Garbage detection and the smoke test
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "!!!!!!!!",
        "!!!! !!!!",
        "!",
        "",
        "   \n",
        "Paris \ufffd\ufffd",
        "++++++++++++++++",
        "aaaaaaaaaaaa",
        "ok ########################## x",
        "\x00\x01\x02\x03\x04 ab",
        " the the the the the the the the the the the the the the the the",
    ],
)
def test_is_garbage_rejects(text: str) -> None:
    assert is_garbage(text) is not None


@pytest.mark.parametrize(
    "text",
    [
        " Paris. It is the capital and largest city of France.",
        " Paris!",
        " Paris! Paris is lovely!!",
        " 1. Paris\n2. Lyon\n3. Marseille",
        "Paris — la Ville Lumière.",
        " Paris. Paris. Paris is the capital of France.",
    ],
)
def test_is_garbage_accepts(text: str) -> None:
    assert is_garbage(text) is None


def test_smoke_test_good_output_and_the_request_shape() -> None:
    async def body(server: FakeSglang) -> None:
        result = await smoke_test(server.base_url, api_key="sk-k")
        assert result.ok and result.completion_tokens == 16 and result.text.startswith(" Paris")
        path, headers, sent = server.requests[-1]
        assert path == "/generate" and headers["Authorization"] == "Bearer sk-k"
        want = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
        assert sent == want

    with_server(body)


def test_smoke_test_rejections() -> None:
    async def body(server: FakeSglang) -> None:
        server.generate_body = {"text": "!!!!!!!!!!!!!!!!", "meta_info": {"completion_tokens": 16}}
        r = await smoke_test(server.base_url)
        assert not r.ok and "'!'" in r.reason and r.completion_tokens == 16
        assert smoke_diagnosis(r).category == "garbage_output"
        server.generate_body = {"text": "", "meta_info": {"completion_tokens": 0}}
        r = await smoke_test(server.base_url)
        assert not r.ok and r.completion_tokens == 0
        server.generate_body = [{"text": " Paris", "meta_info": {}}]
        r = await smoke_test(server.base_url)
        assert not r.ok and "completion_tokens" in r.reason
        server.generate_status = 500
        r = await smoke_test(server.base_url)
        assert not r.ok and r.reason.startswith("HTTP 500")

    with_server(body)
    r = asyncio.run(smoke_test(f"http://127.0.0.1:{free_port()}", timeout_s=2))
    assert not r.ok and "ConnectError" in r.reason


# ---------------------------------------------------------------------------------------------------------
# Readiness
# ---------------------------------------------------------------------------------------------------------


class FakeProcess:
    """is_alive / read_new_log callables backed by plain attributes (the real ones come from a Transport)."""

    def __init__(self) -> None:
        self.alive = True
        self.pending = ""

    async def is_alive(self) -> bool:
        return self.alive

    async def read_new_log(self) -> str:
        out, self.pending = self.pending, ""
        return out


def test_wait_ready_503_then_200() -> None:
    async def body(server: FakeSglang) -> ReadyResult | Diagnosis:
        server.health_codes = [503, 503, 200]
        proc = FakeProcess()
        proc.pending = LOAD + "The server is fired up and ready to roll!\n"
        return await wait_ready(
            server.base_url,
            deadline_s=10,
            is_alive=proc.is_alive,
            read_new_log=proc.read_new_log,
            api_key="k",
            poll_s=0.01,
        )

    result = with_server(body)
    assert isinstance(result, ReadyResult)
    assert result.health_polls == 3 and result.saw_ready_line


def test_wait_ready_dead_process_ends_at_once() -> None:
    async def body(server: FakeSglang) -> tuple[ReadyResult | Diagnosis, float]:
        server.health_codes = [503]
        proc = FakeProcess()
        crash = traceback("model_executor/model_runner.py", last="torch.OutOfMemoryError: CUDA out of memory.")

        async def read_new_log() -> str:
            if server.health_calls >= 2 and proc.alive:  # the process dies after a couple of polls
                proc.alive = False
                return crash
            return ""

        start = time.monotonic()
        result = await wait_ready(
            server.base_url, deadline_s=60, is_alive=proc.is_alive, read_new_log=read_new_log, poll_s=0.01
        )
        return result, time.monotonic() - start

    result, elapsed = with_server(body)
    assert isinstance(result, Diagnosis) and result.category == "oom"
    assert elapsed < 10  # far from the 60 s deadline


def test_wait_ready_dead_process_without_log() -> None:
    async def body(server: FakeSglang) -> ReadyResult | Diagnosis:
        server.health_codes = [503]
        proc = FakeProcess()
        proc.alive = False
        return await wait_ready(
            server.base_url, deadline_s=60, is_alive=proc.is_alive, read_new_log=proc.read_new_log, poll_s=0.01
        )

    result = with_server(body)
    assert isinstance(result, Diagnosis) and result.category == "crashed"


def test_wait_ready_fatal_log_line_while_alive() -> None:
    async def body(server: FakeSglang) -> tuple[ReadyResult | Diagnosis, float]:
        server.health_codes = [503]
        proc = FakeProcess()
        proc.pending = LOAD + "ValueError: Spec v2 currently only supports topk = 1 for speculative decoding."
        start = time.monotonic()
        result = await wait_ready(
            server.base_url, deadline_s=60, is_alive=proc.is_alive, read_new_log=proc.read_new_log, poll_s=0.01
        )
        return result, time.monotonic() - start

    result, elapsed = with_server(body)
    assert isinstance(result, Diagnosis) and result.category == "config_error"
    assert "topk" in result.summary and elapsed < 10


def test_wait_ready_deadline_gives_timeout() -> None:
    async def body(server: FakeSglang) -> ReadyResult | Diagnosis:
        server.health_codes = [503]
        proc = FakeProcess()
        proc.pending = LOAD
        return await wait_ready(
            server.base_url, deadline_s=0.5, is_alive=proc.is_alive, read_new_log=proc.read_new_log, poll_s=0.05
        )

    result = with_server(body)
    assert isinstance(result, Diagnosis) and result.category == "timeout"
    assert "sk-secret-in-log" not in result.log_tail


def test_wait_ready_nothing_listening_yet_then_timeout() -> None:
    proc = FakeProcess()
    port = free_port()
    result = asyncio.run(
        wait_ready(
            f"http://127.0.0.1:{port}",
            deadline_s=0.4,
            is_alive=proc.is_alive,
            read_new_log=proc.read_new_log,
            poll_s=0.05,
        )
    )
    assert isinstance(result, Diagnosis) and result.category == "timeout"
