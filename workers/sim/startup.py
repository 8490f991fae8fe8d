"""The loading phase of a simulated launch: SGLang's log lines in order, and where it dies if it dies.

``plan_startup`` is pure: given the resolved args, the GPU profile, the model and the memory other
live servers hold, it returns the timed steps (fraction of the loading time, log lines, per-GPU memory
held now, fatal text). The server replays them *before* it opens its HTTP port, as the real one does
(``launch_server`` runs uvicorn only after the schedulers report ready). Failure modes are checked in
the order SGLang hits them: ServerArgs validation (before any log is configured), distributed init,
weight loading, KV pool allocation, CUDA graph capture (the first real FP4 GEMM and MoE kernels run
there). Texts come from the imitated version's recorded contract (``texts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workers.sim import texts
from workers.sim.args import Resolved, is_new_layout
from workers.sim.flashinfer_arch import trtllm_moe_majors
from workers.sim.perf import AllReduce, MemoryPlan
from workers.sim.profile import GpuProfile, ModelSpec

PKG = "/usr/local/lib/python3.12/dist-packages/sglang"
HIDDEN_IN_REPR = {"watermark_key", "watermark_key_b", "watermark_config"}


@dataclass
class Step:
    """Something that happens ``frac`` of the way through loading.

    ``lines``: ``"@..."`` raw stdout, ``"#..."`` raw stderr, ``"!..."`` a scheduler (TP0) line, else a
    stamped main-process line. ``fatal`` ends the launch: ``kind`` ``args`` (a traceback on stderr, exit 1)
    or ``scheduler`` (the scheduler's exception line, the parent's sigquit line, then the parent kills
    its own process tree as SGLang does).
    """

    frac: float
    lines: list[str] = field(default_factory=list)
    mem_gb: float | None = None
    fatal: str | None = None
    kind: str = ""


def rank_tag(res: Resolved) -> str | None:
    """SGLang's scheduler log prefix: ``TP0`` (plus ``EP0``...) when that size is above 1, else none."""
    a = res.args
    parts = []
    if a.pp_size > 1:
        parts.append("PP0")
    if a.tp_size > 1:
        parts.append("TP0")
    if a.ep_size > 1:
        parts.append("EP0")
    return " ".join(parts) or None


def server_args_line(res: Resolved) -> str:
    """``server_args=ServerArgs(...)``: the f"{server_args=}" line of _launch_subprocesses."""
    inner = ", ".join(f"{k}={v!r}" for k, v in res.server_args.items() if k not in HIDDEN_IN_REPR)
    return f"server_args=ServerArgs({inner})"


def early_lines(res: Resolved) -> list[str]:
    """Warnings ServerArgs logs while it is built: logging is not configured yet, so 0.5.9 prints them bare
    on stderr (Python's last-resort handler); 0.5.15+ configures a stamped stderr format first."""
    if is_new_layout(res.version):
        return [f"={w}" for w in res.early]
    return [f"#{w}" for w in res.early]


def args_traceback(res: Resolved) -> str:
    """The uncaught exception of ``prepare_server_args`` (the launcher's traceback on stderr)."""
    err = res.error
    assert err is not None
    if is_new_layout(res.version):
        frames = (
            f'  File "{PKG}/launch_server.py", line 98, in <module>\n'
            "    server_args = prepare_server_args(sys.argv[1:])\n"
            f'  File "{PKG}/srt/server_args.py", line 714, in prepare_server_args\n'
            "    server_args = ServerArgs.from_cli_args(raw_args)\n"
            f'  File "{PKG}/srt/arg_groups/pipeline.py", line 212, in run_resolution\n'
            f"    {err.func}(server_args)\n"
        )
    else:
        frames = (
            f'  File "{PKG}/launch_server.py", line 32, in <module>\n'
            "    server_args = prepare_server_args(sys.argv[1:])\n"
            f'  File "{PKG}/srt/server_args.py", line 5592, in prepare_server_args\n'
            "    return ServerArgs.from_cli_args(raw_args)\n"
            f'  File "{PKG}/srt/server_args.py", line 5078, in from_cli_args\n'
            "    return cls(**{attr: getattr(args, attr) for attr in attrs})\n"
            '  File "<string>", line 330, in __init__\n'
            f'  File "{PKG}/srt/server_args.py", line 767, in __post_init__\n'
            f"    self.{err.func}()\n"
        )
    return (
        "Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "<frozen runpy>", line 88, in _run_code\n'
        f"{frames}{err.line}\n"
    )


def _scheduler_failure(res: Resolved, frames: list[tuple[str, int, str, str]], exc: str) -> str:
    """``Scheduler hit an exception: <traceback>`` as run_scheduler_process logs it."""
    body = "".join(f'  File "{PKG}/{path}", line {ln}, in {fn}\n    {code}\n' for path, ln, fn, code in frames)
    tb = (
        "Traceback (most recent call last):\n"
        f'  File "{PKG}/srt/managers/scheduler.py", line 3130, in run_scheduler_process\n'
        "    scheduler = Scheduler(\n"
        f'  File "{PKG}/srt/managers/tp_worker.py", line 247, in __init__\n'
        "    self._init_model_runner()\n"
        f"{body}{exc}"
    )
    return texts.say(res.contract, "scheduler_exception", traceback=tb)


def torch_oom(alloc_gb: float, total: float, free: float, held: float) -> str:
    """torch's CUDA OOM message (torch's words, not SGLang's)."""
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {alloc_gb:.2f} GiB. GPU 0 has a total "
        f"capacity of {total:.2f} GiB of which {max(0.0, free):.2f} GiB is free. Including non-PyTorch memory, "
        f"this process has {held:.2f} GiB memory in use. Of the allocated memory {held * 0.97:.2f} GiB is "
        f"allocated by PyTorch, and {held * 0.02:.2f} GiB is reserved by PyTorch but unallocated. If reserved "
        "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def capture_failed(res: Resolved, error: str) -> str:
    """CudaGraphRunner wraps a RuntimeError during capture: ``Capture cuda graph failed: {e}\\n{hint}``."""
    hint = texts.say(res.contract, "cuda_graph_capture_hint")
    return "Exception: " + texts.say(
        res.contract, "cuda_graph_capture_failed", e=error, CUDA_GRAPH_CAPTURE_FAILED_MSG=hint
    ).rstrip("\n")


def plan_startup(
    res: Resolved,
    profile: GpuProfile,
    model: ModelSpec,
    mem: MemoryPlan,
    ar: AllReduce,
    others_gb: float,
) -> list[Step]:
    """The ordered loading steps for this launch (the last one is fatal if the launch fails)."""
    a = res.args
    contract = res.contract
    first = Step(0.0, early_lines(res))
    if res.error is not None:
        first.fatal, first.kind = args_traceback(res), "args"
        return [first]
    first.lines += [server_args_line(res), *res.notes, *res.warnings]
    if ar.warning:
        first.lines.append(ar.warning)
    steps = [first]
    spec = res.spec_on
    sm = profile.sm

    # --- distributed init ----------------------------------------------------------------------------
    steps.append(Step(0.04, ["!Init torch distributed begin."], mem_gb=0.4))
    if a.tp_size * a.pp_size > profile.count * max(1, getattr(a, "nnodes", 1)):  # a gang's ranks split them
        fatal = _scheduler_failure(
            res,
            [
                (
                    "srt/model_executor/model_runner.py",
                    612,
                    "init_torch_distributed",
                    "torch.get_device_module(self.device).set_device(self.gpu_id)",
                )
            ],
            "torch.AcceleratorError: CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously "
            "reported at some other API call, so the stacktrace below might be incorrect.",
        )
        return [*steps, Step(0.06, fatal=fatal, kind="scheduler")]
    avail0 = mem.total_gb - others_gb - 0.6
    steps.append(
        Step(
            0.08,
            [
                "!Init torch distributed ends. mem usage=0.38 GB",
                f"!Load weight begin. avail mem={avail0:.2f} GB",
            ],
            mem_gb=0.6,
        )
    )

    # --- weight loading -------------------------------------------------------------------------------
    if a.quantization == "modelopt_fp4" and sm < 100:
        fatal = _scheduler_failure(
            res,
            [("srt/layers/quantization/modelopt_quant.py", 1334, "__init__", "raise ValueError(")],
            "ValueError: " + texts.say(contract, "nvfp4_unsupported_platform"),
        )
        return [*steps, Step(0.12, fatal=fatal, kind="scheduler")]
    shards = 94
    for i, frac in enumerate((0.15, 0.25, 0.35, 0.45)):
        done = shards * (i + 1) // 4
        if mem.weights_gb > avail0 and frac >= 0.35:
            fatal = _scheduler_failure(
                res,
                [
                    ("srt/model_executor/model_runner.py", 1043, "load_model", "self.model = get_model("),
                    ("srt/model_loader/loader.py", 571, "load_model", "model = _initialize_model("),
                ],
                torch_oom(1.5, mem.total_gb, avail0 - mem.weights_gb * frac, mem.weights_gb * frac),
            )
            return [*steps, Step(frac, fatal=fatal, kind="scheduler")]
        steps.append(
            Step(
                frac,
                [
                    f"@Loading safetensors checkpoint shards: {100 * done // shards:3d}% Completed | {done}/{shards} "
                    f"[00:{int(30 * (i + 1) / 4):02d}<00:{int(30 - 30 * (i + 1) / 4):02d},  3.10it/s]"
                ],
                mem_gb=0.6 + mem.weights_gb * (i + 1) / 4,
            )
        )
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
    if spec:
        draft_gb = model.weight_gb / model.layers / max(1, a.tp_size) * 1.5
        steps.append(
            Step(
                0.52,
                [
                    f"!Load weight begin. avail mem={after_w:.2f} GB",
                    f"!Load weight end. type={model.arch.replace('ForConditionalGeneration', 'ForCausalLMMTP')}, "
                    f"dtype=torch.bfloat16, avail mem={after_w - draft_gb:.2f} GB, mem usage={draft_gb:.2f} GB.",
                ],
            )
        )

    # --- KV cache pool ---------------------------------------------------------------------------------
    held_static = mem.static_gb
    if mem.kv_pool_gb <= 0 or mem.max_total_num_tokens <= 0:
        # 0.5.9 formats the value into the message; 0.5.10+ appends it as a second literal.
        text = texts.say(contract, "kv_pool_too_small", mem_fraction_static=a.mem_fraction_static)
        if texts.has(contract, "kv_pool_current_value"):
            text += texts.say(contract, "kv_pool_current_value", mem_fraction_static=a.mem_fraction_static)
        fatal = _scheduler_failure(
            res,
            [
                ("srt/model_executor/model_runner.py", 431, "initialize", "self.init_memory_pool("),
                ("srt/model_executor/model_runner_kv_cache_mixin.py", 417, "init_memory_pool", "raise RuntimeError("),
            ],
            "RuntimeError: " + text,
        )
        return [*steps, Step(0.6, fatal=fatal, kind="scheduler")]
    if others_gb > 0 and held_static + 0.6 > mem.total_gb - others_gb:
        free = mem.total_gb - others_gb - 0.6 - mem.weights_gb
        fatal = _scheduler_failure(
            res,
            [
                ("srt/model_executor/model_runner.py", 431, "initialize", "self.init_memory_pool("),
                ("srt/mem_cache/memory_pool.py", 612, "_create_buffers", "torch.zeros("),
            ],
            torch_oom(mem.kv_pool_gb / model.full_attn_layers, mem.total_gb, free, 0.6 + mem.weights_gb),
        )
        return [*steps, Step(0.6, fatal=fatal, kind="scheduler")]
    kv_gb = mem.kv_pool_gb * (a.mamba_full_memory_ratio if model.hybrid else 1.0) / 2
    after_kv = mem.total_gb - others_gb - 0.6 - held_static
    steps.append(
        Step(
            0.6,
            [
                f"!KV Cache is allocated. #tokens: {mem.max_total_num_tokens}, "
                f"K size: {kv_gb:.2f} GB, V size: {kv_gb:.2f} GB",
                f"!Memory pool end. avail mem={after_kv:.2f} GB",
                f"!Capture cuda graph begin. This can take up to several minutes. avail mem={after_kv:.2f} GB",
            ],
            mem_gb=0.6 + held_static,
        )
    )

    # --- CUDA graph capture: the first forward passes run the FP4 GEMM and MoE kernels --------------
    capture = [
        (
            "srt/model_executor/model_runner.py",
            2105,
            "init_device_graphs",
            "self.graph_runner = graph_runners[self.device](self)",
        ),
        (
            "srt/model_executor/cuda_graph_runner.py",
            373,
            "__init__",
            'f"Capture cuda graph failed: {e}\\n{CUDA_GRAPH_CAPTURE_FAILED_MSG}"',
        ),
    ]
    if a.fp4_gemm_runner_backend == "flashinfer_trtllm" and a.quantization == "modelopt_fp4" and sm != 100:
        # BackendSupportedError is not a RuntimeError: the capture does not wrap it.
        fatal = _scheduler_failure(
            res,
            [*capture[:1], ("srt/layers/quantization/fp4_utils.py", 118, "fp4_gemm", "return mm_fp4(")],
            "flashinfer.utils.BackendSupportedError: "
            + texts.say(
                contract,
                "flashinfer_backend_unsupported",
                backend="trtllm",
                extra=f" with capability {sm}",
                **{"func.__name__": "mm_fp4"},
            ),
        )
        return [*steps, Step(0.7, fatal=fatal, kind="scheduler")]
    majors = trtllm_moe_majors(contract)
    if a.moe_runner_backend == "flashinfer_trtllm" and model.experts and sm // 10 not in majors:
        # The pinned FlashInfer builds trtllm-gen MoE kernels for these SM majors only (flashinfer_arch.py).
        fatal = _scheduler_failure(
            res,
            capture,
            capture_failed(res, texts.say(contract, "flashinfer_no_arch", supported_major_versions=list(majors))),
        )
        return [*steps, Step(0.7, fatal=fatal, kind="scheduler")]
    if mem.oom:
        need = mem.runtime_need_gb
        free = mem.total_gb * (1 - mem.static_fraction) - 1.0
        oom = torch_oom(need - free + 0.5, mem.total_gb, free - 1.2, mem.used_gb)
        fatal = _scheduler_failure(res, capture, capture_failed(res, oom.split(": ", 1)[1]))
        return [*steps, Step(0.75, fatal=fatal, kind="scheduler")]
    steps.append(
        Step(
            0.85,
            [
                f"!Capture cuda graph end. Time elapsed: 21.37 s. mem usage={mem.graph_gb:.2f} GB. "
                f"avail mem={mem.available_after_gb - others_gb:.2f} GB.",
                f"!max_total_num_tokens={mem.max_total_num_tokens}, chunked_prefill_size={a.chunked_prefill_size}, "
                f"max_prefill_tokens={a.max_prefill_tokens}, max_running_requests={res.max_running}, "
                f"context_len={a.context_length}, available_gpu_mem={mem.available_after_gb - others_gb:.2f} GB",
            ],
            mem_gb=mem.used_gb,
        )
    )
    return steps


def uvicorn_lines(res: Resolved, pid: int, bound: bool) -> list[str]:
    """What uvicorn prints when launch_server finally runs it (after loading): started, or the bind error."""
    a = res.args
    head = [
        f"@INFO:     Started server process [{pid}]",
        "@INFO:     Waiting for application startup.",
        "@INFO:     Application startup complete.",
    ]
    if bound:
        return [*head, f"@INFO:     Uvicorn running on http://{a.host}:{a.port} (Press CTRL+C to quit)"]
    return [
        *head,
        "@ERROR:    " + texts.say(res.contract, "http_port_in_use", pyaddr=(a.host, a.port)),
        "@INFO:     Waiting for application shutdown.",
        "@INFO:     Application shutdown complete.",
    ]
