"""The start-up script of a simulated launch: SGLang's log lines in order, and where it dies if it dies.

``plan_startup`` is pure: given the resolved args, the GPU profile, the model, the memory other live
servers hold and whether the port is taken, it returns the timed steps (fraction of the start-up
delay, log lines, per-GPU memory now held, fatal traceback). The server replays them. Failure modes
(the seed's, plus a few cheap neighbours) are checked in the order SGLang would hit them: argument
validation first, then distributed init, weight loading, MoE weight processing, KV pool allocation,
CUDA graph capture (FP4 GEMM runs there), and finally the HTTP bind.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from workers.sim.args import Resolved
from workers.sim.perf import AllReduce, MemoryPlan
from workers.sim.profile import GpuProfile, ModelSpec

PKG = "/usr/local/lib/python3.12/dist-packages/sglang"
READY_LINE = "The server is fired up and ready to roll!"


@dataclass
class Step:
    """Something that happens ``frac`` of the way through start-up."""

    frac: float
    lines: list[str] = field(default_factory=list)  # "@..." = unstamped raw line, "!" prefix = TP0 line
    mem_gb: float | None = None
    fatal: str | None = None  # traceback text for stderr; the process then exits 1


def _args_repr(args: argparse.Namespace) -> str:
    from workers.sim.args import server_args_dict

    inner = ", ".join(f"{k}={v!r}" for k, v in server_args_dict(args).items())
    return f"server_args=ServerArgs({inner})"


def _server_args_traceback(func: str, line: int, exc: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "<frozen runpy>", line 88, in _run_code\n'
        f'  File "{PKG}/launch_server.py", line 24, in <module>\n'
        "    server_args = prepare_server_args(sys.argv[1:])\n"
        f'  File "{PKG}/srt/server_args.py", line 4930, in prepare_server_args\n'
        "    return ServerArgs.from_cli_args(raw_args)\n"
        f'  File "{PKG}/srt/server_args.py", line 4461, in from_cli_args\n'
        "    return cls(**{attr: getattr(args, attr) for attr in attrs})\n"
        '  File "<string>", line 330, in __init__\n'
        f'  File "{PKG}/srt/server_args.py", line 640, in __post_init__\n'
        f"    self.{func}()\n"
        f'  File "{PKG}/srt/server_args.py", line {line}, in {func}\n'
        "    raise ValueError(\n"
        f"{exc}\n"
    )


def _scheduler_traceback(frames: list[tuple[str, int, str, str]], exc: str) -> str:
    body = "".join(f'  File "{PKG}/{path}", line {ln}, in {fn}\n    {code}\n' for path, ln, fn, code in frames)
    return (
        "Scheduler hit an exception: Traceback (most recent call last):\n"
        f'  File "{PKG}/srt/managers/scheduler.py", line 2913, in run_scheduler_process\n'
        "    scheduler = Scheduler(\n"
        f'  File "{PKG}/srt/managers/scheduler.py", line 331, in __init__\n'
        "    self.tp_worker = TpModelWorker(\n"
        f'  File "{PKG}/srt/managers/tp_worker.py", line 88, in __init__\n'
        "    self.model_runner = ModelRunner(\n"
        f"{body}{exc}\n"
    )


def _oom(alloc_gb: float, total: float, free: float, held: float) -> str:
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {alloc_gb:.2f} GiB. GPU 0 has a total "
        f"capacity of {total:.2f} GiB of which {max(0.0, free):.2f} GiB is free. Including non-PyTorch memory, "
        f"this process has {held:.2f} GiB memory in use. Of the allocated memory {held * 0.97:.2f} GiB is "
        f"allocated by PyTorch, and {held * 0.02:.2f} GiB is reserved by PyTorch but unallocated. If reserved "
        "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def plan_startup(
    res: Resolved, profile: GpuProfile, model: ModelSpec, mem: MemoryPlan, ar: AllReduce,
    others_gb: float, port_taken: bool, pid: int,
) -> list[Step]:
    """The ordered start-up steps for this launch (the last one is fatal if the launch fails)."""
    a = res.args
    steps: list[Step] = []
    first = Step(0.0, [_args_repr(a), *res.notes, *("WARNING: " + w for w in res.warnings)])
    steps.append(first)
    spec = res.spec_on
    sm = profile.sm

    # --- argument validation (ServerArgs.__post_init__) ---------------------------------------------
    if spec and model.hybrid and a.mamba_scheduler_strategy != "extra_buffer" and not a.disable_radix_cache:
        exc = (
            f"ValueError: Speculative decoding for {model.arch} is not compatible with radix cache when using "
            "--mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, please use "
            "--mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
        )
        return [*steps, Step(0.02, fatal=_server_args_traceback("_handle_mamba_radix_cache", 2204, exc))]
    if spec and res.spec_v2 and (a.speculative_eagle_topk or 1) > 1:
        exc = "ValueError: Spec v2 currently only supports topk = 1 for speculative decoding."
        return [*steps, Step(0.02, fatal=_server_args_traceback("_handle_speculative_decoding", 2374, exc))]
    if a.attention_backend == "trtllm_mha" and sm != 100:
        exc = ("ValueError: TRTLLM MHA backend is only supported on Blackwell GPUs (SM100). "
               "Please use a different backend.")
        tb = _server_args_traceback("_handle_attention_backend_compatibility", 1897, exc)
        return [*steps, Step(0.02, fatal=tb)]
    if ar.warning:
        first.lines.append("WARNING: " + ar.warning)

    # --- distributed init ----------------------------------------------------------------------------
    steps.append(Step(0.04, ["!Init torch distributed begin."], mem_gb=0.4))
    if a.tp_size * a.pp_size > profile.count:
        tb = _scheduler_traceback(
            [("srt/model_executor/model_runner.py", 612, "init_torch_distributed",
              "torch.get_device_module(self.device).set_device(self.gpu_id)")],
            "torch.AcceleratorError: CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously "
            "reported at some other API call, so the stacktrace below might be incorrect.",
        )
        return [*steps, Step(0.06, fatal=tb)]
    avail0 = mem.total_gb - others_gb - 0.6
    steps.append(Step(0.08, [
        "!Init torch distributed ends. mem usage=0.38 GB",
        f"!Load weight begin. avail mem={avail0:.2f} GB",
    ], mem_gb=0.6))

    # --- weight loading -------------------------------------------------------------------------------
    if a.quantization == "modelopt_fp4" and sm < 100:
        tb = _scheduler_traceback(
            [("srt/layers/quantization/modelopt_quant.py", 1334, "__init__", "raise ValueError(")],
            "ValueError: Current platform does not support NVFP4 quantization. Please use Blackwell and above.",
        )
        return [*steps, Step(0.12, fatal=tb)]
    shards = 94
    for i, frac in enumerate((0.15, 0.25, 0.35, 0.45)):
        done = shards * (i + 1) // 4
        if mem.weights_gb > avail0 and frac >= 0.35:
            tb = _scheduler_traceback(
                [("srt/model_executor/model_runner.py", 1043, "load_model", "self.model = get_model("),
                 ("srt/model_loader/loader.py", 571, "load_model", "model = _initialize_model(")],
                _oom(1.5, mem.total_gb, avail0 - mem.weights_gb * frac, mem.weights_gb * frac),
            )
            return [*steps, Step(frac, fatal=tb)]
        steps.append(Step(frac, [
            f"@Loading safetensors checkpoint shards: {100 * done // shards:3d}% Completed | {done}/{shards} "
            f"[00:{int(30 * (i + 1) / 4):02d}<00:{int(30 - 30 * (i + 1) / 4):02d},  3.10it/s]"
        ], mem_gb=0.6 + mem.weights_gb * (i + 1) / 4))
    after_w = avail0 - mem.weights_gb
    load_end = [
        f"!Load weight end. type={model.arch}, dtype=torch.bfloat16, avail mem={after_w:.2f} GB, "
        f"mem usage={mem.weights_gb:.2f} GB."
    ]
    if model.experts and sm == 120:
        load_end.append(
            "!Using default MoE kernel config. Performance might be sub-optimal! Config file not found at "
            f"{PKG}/srt/layers/moe/fused_moe_triton/configs/triton_3_5_0/E={model.experts},N=128,"
            f"device_name={profile.gpu_name.replace(' ', '_')}.json, you can create them with "
            "https://github.com/sgl-project/sglang/tree/main/benchmark/kernels/fused_moe_triton"
        )
    steps.append(Step(0.5, load_end, mem_gb=0.6 + mem.weights_gb))

    # --- MoE weight processing ------------------------------------------------------------------------
    if a.moe_runner_backend == "flashinfer_trtllm" and model.experts and sm != 100:
        tb = _scheduler_traceback(
            [("srt/model_executor/model_runner.py", 1043, "load_model", "self.model = get_model("),
             ("srt/layers/quantization/modelopt_quant.py", 1760, "process_weights_after_loading",
              "self._prepare_trtllm_gen_moe_weights(layer)"),
             ("flashinfer/fused_moe/core.py", 931, "get_trtllm_moe_sm100_module",
              "module = gen_trtllm_gen_fused_moe_sm100_module()"),
             ("flashinfer/compilation_context.py", 63, "get_nvcc_flags_list", "raise RuntimeError(")],
            # FlashInfer 0.6.3's real text (recorded in the 0.5.9 contract as flashinfer_no_arch).
            "RuntimeError: No supported CUDA architectures found for major versions [10].",
        )
        return [*steps, Step(0.55, fatal=tb)]
    if spec:
        draft_gb = model.weight_gb / model.layers / max(1, a.tp_size) * 1.5
        steps.append(Step(0.52, [
            f"!Load weight begin. avail mem={after_w:.2f} GB",
            f"!Load weight end. type={model.arch.replace('ForConditionalGeneration', 'ForCausalLMMTP')}, "
            f"dtype=torch.bfloat16, avail mem={after_w - draft_gb:.2f} GB, mem usage={draft_gb:.2f} GB.",
        ]))

    # --- KV cache pool ---------------------------------------------------------------------------------
    held_static = mem.static_gb
    if mem.kv_pool_gb <= 0 or mem.max_total_num_tokens <= 0:
        tb = _scheduler_traceback(
            [("srt/model_executor/model_runner.py", 431, "initialize", "self.init_memory_pool("),
             ("srt/model_executor/model_runner_kv_cache_mixin.py", 417, "init_memory_pool", "raise RuntimeError(")],
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
        )
        return [*steps, Step(0.6, fatal=tb)]
    if others_gb > 0 and held_static + 0.6 > mem.total_gb - others_gb:
        free = mem.total_gb - others_gb - 0.6 - mem.weights_gb
        tb = _scheduler_traceback(
            [("srt/model_executor/model_runner.py", 431, "initialize", "self.init_memory_pool("),
             ("srt/mem_cache/memory_pool.py", 612, "_create_buffers", "torch.zeros(")],
            _oom(mem.kv_pool_gb / model.full_attn_layers, mem.total_gb, free, 0.6 + mem.weights_gb),
        )
        return [*steps, Step(0.6, fatal=tb)]
    kv_gb = mem.kv_pool_gb * (a.mamba_full_memory_ratio if model.hybrid else 1.0) / 2
    after_kv = mem.total_gb - others_gb - 0.6 - held_static
    steps.append(Step(0.6, [
        f"!KV Cache is allocated. #tokens: {mem.max_total_num_tokens}, K size: {kv_gb:.2f} GB, V size: {kv_gb:.2f} GB",
        f"!Memory pool end. avail mem={after_kv:.2f} GB",
        f"!Capture cuda graph begin. This can take up to several minutes. avail mem={after_kv:.2f} GB",
    ], mem_gb=0.6 + held_static))

    # --- CUDA graph capture (first real FP4 GEMMs run here) ----------------------------------------
    capture = [("srt/model_executor/model_runner.py", 2105, "init_device_graphs",
                "self.graph_runner = graph_runners[self.device](self)"),
               ("srt/model_executor/cuda_graph_runner.py", 373, "__init__", "self.capture()")]
    if a.fp4_gemm_runner_backend == "flashinfer_trtllm" and a.quantization == "modelopt_fp4" and sm != 100:
        tb = _scheduler_traceback(
            [*capture, ("srt/layers/quantization/fp4_utils.py", 118, "fp4_gemm", "return mm_fp4(")],
            f"flashinfer.utils.BackendSupportedError: mm_fp4 does not support backend 'trtllm' with "
            f"capability {sm}",
        )
        return [*steps, Step(0.7, fatal=tb)]
    if mem.oom:
        need = mem.runtime_need_gb
        free = mem.total_gb * (1 - mem.static_fraction) - 1.0
        tb = _scheduler_traceback(
            capture,
            "Capture cuda graph failed: " + _oom(need - free + 0.5, mem.total_gb, free - 1.2, mem.used_gb)
            + "\nPossible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
            "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n3. disable torch compile by not using "
            "--enable-torch-compile\n4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge "
            "performance loss)\nOpen an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n\n"
            + _oom(need - free + 0.5, mem.total_gb, free - 1.2, mem.used_gb),
        )
        return [*steps, Step(0.75, fatal=tb)]
    steps.append(Step(0.85, [
        f"!Capture cuda graph end. Time elapsed: 21.37 s. mem usage={mem.graph_gb:.2f} GB. "
        f"avail mem={mem.available_after_gb - others_gb:.2f} GB.",
        f"!max_total_num_tokens={mem.max_total_num_tokens}, chunked_prefill_size={a.chunked_prefill_size}, "
        f"max_prefill_tokens={a.max_prefill_tokens}, max_running_requests={a.max_running_requests}, "
        f"context_len={a.context_length}, available_gpu_mem={mem.available_after_gb - others_gb:.2f} GB",
    ], mem_gb=mem.used_gb))

    # --- HTTP server -------------------------------------------------------------------------------
    if port_taken:
        return [*steps, Step(0.9, lines=[
            f"@INFO:     Started server process [{pid}]",
            "@INFO:     Waiting for application startup.",
            "@INFO:     Application startup complete.",
            f"@ERROR:    [Errno 98] error while attempting to bind on address ('{a.host}', {a.port}): "
            "address already in use",
            "@INFO:     Waiting for application shutdown.",
            "@INFO:     Application shutdown complete.",
        ], fatal="")]
    steps.append(Step(0.9, [
        f"@INFO:     Started server process [{pid}]",
        "@INFO:     Waiting for application startup.",
        "@INFO:     Application startup complete.",
        f"@INFO:     Uvicorn running on http://{a.host}:{a.port} (Press CTRL+C to quit)",
    ]))
    return steps
