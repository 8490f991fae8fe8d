"""SGLang's launch flags (by their real names) plus the simulator's own ``--sim-*`` flags.

The parser mirrors ``sglang.launch_server`` closely enough that the bot can hand it the exact argv it
would hand the real engine: same option names, same ``dest`` names (``--fp4-gemm-backend`` is stored
as ``fp4_gemm_runner_backend``), same argparse prefix matching (``--tp 8``), same exit code 2 and
``error: unrecognized arguments`` on a typo. ``resolve`` then applies the automatic choices SGLang
makes at start-up (speculative defaults, ``max_running_requests`` reset, ``mem_fraction_static``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from workers.sim.profile import GpuProfile, ModelSpec

MOE_RUNNER_BACKENDS = [
    "auto", "deep_gemm", "triton", "triton_kernel", "flashinfer_trtllm", "flashinfer_cutlass",
    "flashinfer_mxfp4", "flashinfer_cutedsl", "cutlass",
]
FP4_GEMM_BACKENDS = ["auto", "flashinfer_cudnn", "flashinfer_cutlass", "flashinfer_trtllm"]
QUANTIZATIONS = [
    "awq", "fp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt",
    "modelopt_fp8", "modelopt_fp4", "petit_nvfp4", "w8a8_int8", "w8a8_fp8", "moe_wna16", "qoq",
    "w4afp8", "mxfp4", "compressed-tensors",
]
ATTENTION_BACKENDS = [
    "triton", "torch_native", "flex_attention", "nsa", "cutlass_mla", "fa3", "fa4", "flashinfer",
    "flashmla", "trtllm_mla", "trtllm_mha", "dual_chunk_flash_attn", "aiter", "wave", "intel_amx",
    "ascend", "intel_xpu",
]
KV_CACHE_DTYPES = ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]
SPEC_ALGORITHMS = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
MAMBA_STRATEGIES = ["auto", "no_buffer", "extra_buffer"]
LOG_LEVELS = ["debug", "info", "warning", "error", "critical"]


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(env[name])
    except (KeyError, ValueError):
        return default


def build_parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The launch_server parser; sim defaults come from ``BENCHBOT_SIM_*`` in ``env``."""
    env = os.environ if env is None else env
    p = argparse.ArgumentParser(prog="launch_server.py", description="SGLang-compatible simulated server")
    a = p.add_argument
    # model and serving
    a("--model-path", "--model", dest="model_path", type=str, required=True)
    a("--tokenizer-path", type=str, default=None)
    a("--tokenizer-mode", type=str, default="auto")
    a("--served-model-name", type=str, default=None)
    a("--trust-remote-code", action="store_true")
    a("--revision", type=str, default=None)
    a("--dtype", type=str, default="auto")
    a("--load-format", type=str, default="auto")
    a("--download-dir", type=str, default=None)
    a("--context-length", type=int, default=None)
    a("--host", type=str, default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--api-key", type=str, default=None)
    a("--reasoning-parser", type=str, default=None)
    a("--tool-call-parser", type=str, default=None)
    a("--chat-template", type=str, default=None)
    a("--skip-server-warmup", action="store_true")
    a("--enable-metrics", action="store_true")
    a("--enable-cache-report", action="store_true")
    a("--log-level", type=str, default="info", choices=LOG_LEVELS)
    a("--log-requests", action="store_true")
    a("--decode-log-interval", type=int, default=40)
    a("--stream-output", action="store_true")
    a("--stream-interval", type=int, default=1)
    a("--random-seed", type=int, default=None)
    a("--watchdog-timeout", type=float, default=300)
    a("--device", type=str, default=None)
    a("--base-gpu-id", type=int, default=0)
    a("--enable-nan-detection", action="store_true")
    a("--sleep-on-idle", action="store_true")
    # memory and scheduling
    a("--mem-fraction-static", type=float, default=None)
    a("--max-running-requests", type=int, default=None)
    a("--max-total-tokens", type=int, default=None)
    a("--chunked-prefill-size", type=int, default=None)
    a("--max-prefill-tokens", type=int, default=16384)
    a("--schedule-policy", type=str, default="fcfs")
    a("--schedule-conservativeness", type=float, default=1.0)
    a("--page-size", type=int, default=None)
    a("--disable-radix-cache", action="store_true")
    a("--cuda-graph-max-bs", type=int, default=None)
    a("--disable-cuda-graph", action="store_true")
    a("--disable-overlap-schedule", action="store_true")
    a("--enable-mixed-chunk", action="store_true")
    # parallelism and communication
    a("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    a("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    a("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    a("--ep-size", "--expert-parallel-size", dest="ep_size", type=int, default=1)
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    a("--dist-init-addr", type=str, default=None)
    a("--nccl-port", type=int, default=None)
    a("--enable-dp-attention", action="store_true")
    a("--disable-custom-all-reduce", action="store_true")
    a("--enable-mscclpp", action="store_true")
    a("--enable-torch-symm-mem", action="store_true")
    a("--enable-flashinfer-allreduce-fusion", action="store_true")
    # kernels
    a("--quantization", type=str, default=None, choices=QUANTIZATIONS)
    a("--kv-cache-dtype", type=str, default="auto", choices=KV_CACHE_DTYPES)
    a("--attention-backend", type=str, default=None, choices=ATTENTION_BACKENDS)
    a("--moe-runner-backend", type=str, default="auto", choices=MOE_RUNNER_BACKENDS)
    a("--fp4-gemm-backend", dest="fp4_gemm_runner_backend", type=str, default="flashinfer_cutlass",
      choices=FP4_GEMM_BACKENDS)
    # speculative decoding
    a("--speculative-algorithm", type=str, default=None, choices=SPEC_ALGORITHMS)
    a("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path",
      type=str, default=None)
    a("--speculative-num-steps", type=int, default=None)
    a("--speculative-eagle-topk", type=int, default=None)
    a("--speculative-num-draft-tokens", type=int, default=None)
    a("--speculative-accept-threshold-single", type=float, default=1.0)
    a("--mamba-scheduler-strategy", type=str, default="auto", choices=MAMBA_STRATEGIES)
    a("--mamba-full-memory-ratio", type=float, default=0.9)
    a("--mamba-track-interval", type=int, default=256)
    # simulator-only
    g = p.add_argument_group("simulator (benchbot only)")
    g.add_argument("--sim-startup-s", type=float, default=_env_float(env, "BENCHBOT_SIM_STARTUP_S", 3.0),
                   help="simulated start-up time in seconds (env BENCHBOT_SIM_STARTUP_S)")
    g.add_argument("--sim-seed", type=int, default=int(_env_float(env, "BENCHBOT_SIM_SEED", 0)),
                   help="seed for generated text, accept lengths and timing noise (env BENCHBOT_SIM_SEED)")
    g.add_argument("--sim-timing", choices=["model", "fixed"], default=env.get("BENCHBOT_SIM_TIMING", "model"),
                   help="model: batching performance model; fixed: exact ttft/itl ground truth")
    g.add_argument("--sim-ttft-ms", type=float, default=_env_float(env, "BENCHBOT_SIM_TTFT_MS", 50.0))
    g.add_argument("--sim-itl-ms", type=float, default=_env_float(env, "BENCHBOT_SIM_ITL_MS", 10.0))
    g.add_argument("--sim-profile", type=str, default=env.get("BENCHBOT_SIM_PROFILE"),
                   help="GPU profile name, inline JSON or JSON file (env BENCHBOT_SIM_PROFILE)")
    g.add_argument("--sim-timestamps", action="store_true",
                   default=env.get("BENCHBOT_SIM_TIMESTAMPS", "") not in ("", "0", "false"),
                   help="add sim_t_recv/sim_t_sched/sim_t_emit to stream chunks in model timing too")
    g.add_argument("--sim-state-dir", type=str, default=env.get("BENCHBOT_SIM_STATE_DIR"),
                   help="registry of running sim servers read by the nvidia-smi stand-in")
    g.add_argument("--sim-natural-eos", type=int, default=int(_env_float(env, "BENCHBOT_SIM_NATURAL_EOS", 1)),
                   help="1: without ignore_eos a reply ends by itself after a seeded length; 0: never")
    return p


@dataclass
class Resolved:
    """Server args after SGLang's automatic choices, plus what the start-up log should say about them."""

    args: argparse.Namespace
    spec_v2: bool
    notes: list[str] = field(default_factory=list)  # info log lines emitted at start
    warnings: list[str] = field(default_factory=list)

    @property
    def spec_on(self) -> bool:
        return bool(self.args.speculative_algorithm)


def _auto_mem_fraction(args: argparse.Namespace, profile: GpuProfile, spec: bool) -> float:
    """SGLang 0.5.9's automatic mem_fraction_static (reference section 2.1)."""
    gpu_mb = float(profile.memory_mib)
    reserved = 512 + 1.5 * max(args.chunked_prefill_size or 8192, 2048) + 2 * (args.cuda_graph_max_bs or 256)
    reserved += args.tp_size * args.pp_size / 8 * 1024
    if gpu_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if spec:
        reserved += 2 * 1024
    return round((gpu_mb - reserved) / gpu_mb, 3)


def resolve(args: argparse.Namespace, profile: GpuProfile, model: ModelSpec, env: Mapping[str, str]) -> Resolved:
    """Apply the automatic choices of SGLang 0.5.9 that change what the server reports and how it runs."""
    spec_v2 = env.get("SGLANG_ENABLE_SPEC_V2", "").strip().lower() in ("1", "true", "yes", "on")
    out = Resolved(args=args, spec_v2=spec_v2)
    if args.tokenizer_path is None:
        args.tokenizer_path = args.model_path
    if args.served_model_name is None:
        args.served_model_name = args.model_path
    if args.context_length is None:
        args.context_length = model.context_len
    if args.quantization is None and model.quant:
        args.quantization = model.quant
    if args.chunked_prefill_size is None:
        args.chunked_prefill_size = 8192
    if args.cuda_graph_max_bs is None:
        args.cuda_graph_max_bs = 512 if args.tp_size >= 4 else 256
    if args.page_size is None:
        args.page_size = 1
    if args.attention_backend is None:
        args.attention_backend = "flashinfer" if profile.sm not in (90, 100) else "fa3"
    if args.random_seed is None:
        args.random_seed = args.sim_seed
    if args.speculative_algorithm:
        if args.speculative_algorithm == "NEXTN":
            args.speculative_algorithm = "EAGLE"  # SGLang renames NEXTN to EAGLE internally
        trio = (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens)
        if all(v is None for v in trio):
            args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens = 3, 1, 4
        else:
            if args.speculative_num_steps is None:
                args.speculative_num_steps = 3
            if args.speculative_eagle_topk is None:
                args.speculative_eagle_topk = 1
            if args.speculative_num_draft_tokens is None or args.speculative_eagle_topk == 1:
                args.speculative_num_draft_tokens = args.speculative_num_steps + 1
        if args.max_running_requests is None:
            args.max_running_requests = 48
            out.notes.append(
                "Max running requests is reset to 48 for speculative decoding. You can override this by "
                "explicitly setting --max-running-requests."
            )
        if not spec_v2:
            args.disable_overlap_schedule = True
            out.warnings.append(
                "Overlap scheduler is disabled when spec v2 is off or using unsupported speculative algorithm. "
                "You can set env SGLANG_ENABLE_SPEC_V2=True to enable the experimental overlap scheduler."
            )
    if args.mem_fraction_static is None:
        args.mem_fraction_static = _auto_mem_fraction(args, profile, bool(args.speculative_algorithm))
    if args.max_running_requests is None:
        args.max_running_requests = 1024
    return out


SIM_KEYS = (
    "sim_startup_s", "sim_seed", "sim_timing", "sim_ttft_ms", "sim_itl_ms", "sim_profile",
    "sim_timestamps", "sim_state_dir", "sim_natural_eos",
)


def server_args_dict(args: argparse.Namespace) -> dict[str, object]:
    """The flat ServerArgs object SGLang 0.5.9 reports (sim settings left out)."""
    data = {k: v for k, v in vars(args).items() if k not in SIM_KEYS}
    data.setdefault("enable_lora", False)
    data.setdefault("kv_events_config", None)
    return data


def parse(argv: Sequence[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    """Parse like launch_server: unknown flags exit 2 with usage + ``unrecognized arguments``.

    ``--config FILE.yaml`` is merged first, as SGLang's ``prepare_server_args`` does: the file's options
    become flags placed before the command line's, so the command line wins. That is how benchbot hands
    the engine its API key without putting it on argv.
    """
    parser = build_parser(env)
    args = list(argv) if argv is not None else sys.argv[1:]
    if "--config" in args:
        try:
            args = merge_config(parser, args)
        except ValueError as exc:
            parser.error(str(exc))
    return parser.parse_args(args)


def merge_config(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """SGLang's ``ConfigArgumentMerger`` rules, on the JSON subset of YAML (what benchbot writes).

    One ``--config`` at most, a ``.yaml``/``.yml`` file holding a mapping; ``store_true`` options are
    added when true and skipped when false, other booleans become ``--key true|false``, lists
    ``--key a b``, anything else ``--key str(value)``; options with other actions are refused; unknown
    keys become flags the parser then rejects.
    """
    where = [i for i, arg in enumerate(argv) if arg == "--config"]
    if len(where) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    index = where[0]
    if index == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = argv[index + 1]
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {suffix}")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.loads(f.read() or "null")
    except FileNotFoundError:
        raise ValueError(f"Config file not found: {path}") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read config file {path} (the simulator reads YAML's JSON subset): {exc}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    store_true = {a.dest for a in parser._actions if isinstance(a, argparse._StoreTrueAction)}
    unsupported = {a.dest: a for a in parser._actions if a.option_strings and "--help" not in a.option_strings
                   and not isinstance(a, argparse._StoreTrueAction | argparse._StoreAction)}
    merged: list[str] = []
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if dest in unsupported:
            raise ValueError(f"Unsupported config option '{dest}' with action '{type(unsupported[dest]).__name__}'")
        if isinstance(value, bool):
            if dest in store_true:
                merged += [f"--{key}"] if value else []
            else:
                merged += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            merged += [f"--{key}", *(str(v) for v in value)] if value else []
        else:
            merged += [f"--{key}", str(value)]
    return merged + argv[:index] + argv[index + 2:]
