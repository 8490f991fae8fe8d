"""The simulator's launch flags: the real parser of the imitated SGLang version, plus its own ``--sim-*``.

The sim's own options (``--sim-sglang-version``, ``--sim-startup-s``, ...) are taken out of argv first
by a separate parser that never abbreviates, so they cannot change how the real parser resolves
prefixes. What is left goes to the contract's parser (``Contract.build_parser``: the real option
names, dests, choices, defaults, prefix matching, ``prog`` and error texts, exit 2), after SGLang's own
``--config FILE.yaml`` merge (``config_file``). ``resolve`` then makes the automatic choices that
version's ``ServerArgs`` makes (speculative defaults, ``max_running_requests`` reset, the mamba cache
strategy, overlap scheduling, ``mem_fraction_static``), and finds the config errors it raises.

Two views come out of resolution: ``Resolved.args`` is what the simulated engine *runs* (with
version-independent names such as ``tp_size``, ``cuda_graph_max_bs``, ``mamba_scheduler_strategy``),
and ``Resolved.server_args`` is what ``/server_info`` *reports*: exactly the version's ServerArgs
fields with the values SGLang writes into them (``context_length`` stays None when not given, as it
does on a real server).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.engines.contract import Contract, load_contract, parse_version, recorded_versions
from workers.sim import texts
from workers.sim.config_file import merge_config
from workers.sim.profile import GpuProfile, ModelSpec

DEFAULT_SGLANG_VERSION = "0.5.9"
VERSION_ENV = "BENCHBOT_SIM_SGLANG_VERSION"

#: ServerArgs.from_cli_args in 0.5.9 copies these argparse dests onto the fields (0.5.15+ needs none).
CLI_TO_FIELD = {
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "data_parallel_size": "dp_size",
    "expert_parallel_size": "ep_size",
    "attention_context_parallel_size": "attn_cp_size",
    "moe_data_parallel_size": "moe_dp_size",
}
#: The sim's own name for a setting -> the field that carries it in a version that renamed it.
RENAMED = {
    "cuda_graph_max_bs": "cuda_graph_max_bs_decode",
    "mamba_scheduler_strategy": "mamba_radix_cache_strategy",
    "stream_output": "incremental_streaming_output",
}


class SimArgsError(Exception):
    """A config error SGLang raises while building its ServerArgs (printed as its traceback, exit 1)."""

    def __init__(self, kind: str, message: str, func: str) -> None:
        super().__init__(message)
        self.kind = kind  # ValueError | AssertionError | TypeError
        self.message = message
        self.func = func  # the ServerArgs method that raised it

    @property
    def line(self) -> str:
        return f"{self.kind}: {self.message}" if self.message else self.kind


def _env_float(env: Mapping[str, str], name: str, default: float | None) -> float | None:
    try:
        return float(env[name])
    except (KeyError, ValueError):
        return default


def sim_parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The ``--sim-*`` options; defaults from ``BENCHBOT_SIM_*`` in ``env``. Never abbreviates."""
    env = os.environ if env is None else env
    p = argparse.ArgumentParser(prog="benchbot sim sglang", add_help=False, allow_abbrev=False)
    a = p.add_argument
    a(
        "--sim-sglang-version",
        default=env.get(VERSION_ENV) or DEFAULT_SGLANG_VERSION,
        help=f"the SGLang version to imitate, one of the recorded contracts (env {VERSION_ENV})",
    )
    a(
        "--sim-startup-s",
        type=float,
        default=_env_float(env, "BENCHBOT_SIM_STARTUP_S", 3.0),
        help="seconds from launch to the ready line (env BENCHBOT_SIM_STARTUP_S)",
    )
    a(
        "--sim-load-s",
        type=float,
        default=_env_float(env, "BENCHBOT_SIM_LOAD_S", None),
        help="seconds the server loads with no HTTP listener (default 0.9 x --sim-startup-s; env BENCHBOT_SIM_LOAD_S)",
    )
    a(
        "--sim-seed",
        type=int,
        default=int(_env_float(env, "BENCHBOT_SIM_SEED", 0) or 0),
        help="seed for generated text, accept lengths and timing noise (env BENCHBOT_SIM_SEED)",
    )
    a(
        "--sim-timing",
        choices=["model", "fixed"],
        default=env.get("BENCHBOT_SIM_TIMING", "model"),
        help="model: batching performance model; fixed: exact ttft/itl ground truth",
    )
    a("--sim-ttft-ms", type=float, default=_env_float(env, "BENCHBOT_SIM_TTFT_MS", 50.0))
    a("--sim-itl-ms", type=float, default=_env_float(env, "BENCHBOT_SIM_ITL_MS", 10.0))
    a(
        "--sim-profile",
        type=str,
        default=env.get("BENCHBOT_SIM_PROFILE"),
        help="GPU profile name, inline JSON or JSON file (env BENCHBOT_SIM_PROFILE)",
    )
    a(
        "--sim-timestamps",
        action="store_true",
        default=env.get("BENCHBOT_SIM_TIMESTAMPS", "") not in ("", "0", "false"),
        help="add sim_t_recv/sim_t_sched/sim_t_emit to stream chunks in model timing too",
    )
    a(
        "--sim-state-dir",
        type=str,
        default=env.get("BENCHBOT_SIM_STATE_DIR"),
        help="registry of running sim servers read by the nvidia-smi stand-in",
    )
    a(
        "--sim-natural-eos",
        type=int,
        default=int(_env_float(env, "BENCHBOT_SIM_NATURAL_EOS", 1) or 0),
        help="1: without ignore_eos a reply ends by itself after a seeded length; 0: never",
    )
    a(
        "--sim-join-delay-s",
        type=float,
        default=_env_float(env, "BENCHBOT_SIM_JOIN_DELAY_S", 0.0),
        help="a gang's rank waits this long before it joins the head (a rank slow to join; workers/sim/rendezvous.py)",
    )
    a(
        "--sim-join-timeout-s",
        type=float,
        default=_env_float(env, "BENCHBOT_SIM_JOIN_TIMEOUT_S", None),
        help="how long a gang's rank waits for the others (default --dist-timeout, else 60 s)",
    )
    return p


SIM_KEYS = tuple(a.dest for a in sim_parser({})._actions if a.dest.startswith("sim_"))


def split_sim_args(argv: Sequence[str], env: Mapping[str, str]) -> tuple[argparse.Namespace, list[str]]:
    """(the ``--sim-*`` options, the rest of argv in order) ; exits 2 on a bad ``--sim-*`` value."""
    sim, rest = sim_parser(env).parse_known_args(list(argv))
    known = recorded_versions("sglang")
    if sim.sim_sglang_version not in known:
        sim_parser(env).error(
            f"argument --sim-sglang-version: {sim.sim_sglang_version!r} is not a recorded "
            f"SGLang version (recorded: {', '.join(known)})"
        )
    return sim, rest


def contract_for(ns: argparse.Namespace) -> Contract:
    """The recorded contract of the version ``ns`` imitates."""
    return load_contract("sglang", ns.sim_sglang_version)


def parse(argv: Sequence[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    """Parse like the imitated launch_server: unknown or ambiguous flags exit 2 with the real usage text.

    ``--config FILE`` problems raise ``config_file.ConfigFileError`` (SGLang's ValueError).
    """
    sim, rest = split_sim_args(sys.argv[1:] if argv is None else argv, env)
    contract = load_contract("sglang", sim.sim_sglang_version)
    rest = merge_config(contract, rest)
    ns = contract.build_parser().parse_args(rest)
    ns.sim_launch_argv = list(rest)  # 0.5.15+ reports it as server_info's launch_command
    for src, dst in CLI_TO_FIELD.items():
        if hasattr(ns, src) and not hasattr(ns, dst):
            setattr(ns, dst, getattr(ns, src))
    for ours, theirs in RENAMED.items():
        if not hasattr(ns, ours) and hasattr(ns, theirs):
            setattr(ns, ours, getattr(ns, theirs))
    for name, default in (
        ("enable_nan_detection", False),
        ("stream_output", False),
        ("enable_dp_attention", False),
        ("mamba_scheduler_strategy", "auto"),
        ("ep_size", 1),
        ("dp_size", 1),
        ("pp_size", 1),
    ):
        if not hasattr(ns, name):
            setattr(ns, name, default)
    if getattr(ns, "attn_dp_size", 1) and getattr(ns, "attn_dp_size", 1) > 1:
        ns.enable_dp_attention = True
    for key in SIM_KEYS:
        setattr(ns, key, getattr(sim, key))
    if ns.sim_load_s is None:
        ns.sim_load_s = 0.9 * ns.sim_startup_s
    ns.sim_startup_s = max(ns.sim_startup_s, ns.sim_load_s)
    return ns


# --------------------------------------------------------------------------------------------- resolution


@dataclass
class Resolved:
    """Server args after SGLang's automatic choices, plus what the start-up log says about them."""

    args: argparse.Namespace  # what the simulated engine runs (version-independent names)
    contract: Contract
    spec_v2: bool
    reported: argparse.Namespace  # what SGLang writes into its ServerArgs (see server_args)
    max_running: int  # the scheduler's effective max_running_requests
    notes: list[str] = field(default_factory=list)  # logged once logging is configured
    early: list[str] = field(default_factory=list)  # warnings logged while ServerArgs is built
    warnings: list[str] = field(default_factory=list)  # warnings logged with the server args
    error: SimArgsError | None = None  # ServerArgs refused the settings

    @property
    def spec_on(self) -> bool:
        return bool(self.args.speculative_algorithm)

    @property
    def version(self) -> str:
        return self.contract.version

    @property
    def server_args(self) -> dict[str, Any]:
        """The ServerArgs fields of this version, as ``/server_info`` and the ``server_args=`` line show them."""
        return {name: getattr(self.reported, name, None) for name in self.contract.server_args_fields}


def is_new_layout(version: str) -> bool:
    """0.5.15+: arg groups, renamed flags, resolution pipeline (reference section 2.9)."""
    return parse_version(version) >= (0, 5, 15)


def spec_v2_enabled(version: str, env: Mapping[str, str]) -> bool:
    """SGLANG_ENABLE_SPEC_V2: off by default up to 0.5.10, on by default from 0.5.11, always on from 0.5.18."""
    v = parse_version(version)
    if v >= (0, 5, 18):
        return True
    raw = env.get("SGLANG_ENABLE_SPEC_V2", "").strip().lower()
    if not raw:
        return v >= (0, 5, 11)
    return raw in ("1", "true", "yes", "on")


def _auto_mem_fraction(a: argparse.Namespace, profile: GpuProfile, spec: bool, version: str) -> float:
    """The automatic mem_fraction_static (0.5.9 server_args.py L1032-1066; 0.5.23 memory_hook.py L298-327)."""
    gpu_mb = float(profile.memory_mib)
    reserved = 512 + 1.5 * max(a.chunked_prefill_size or 8192, 2048) + 2 * (a.cuda_graph_max_bs or 256)
    reserved += a.tp_size * a.pp_size / 8 * 1024
    if gpu_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if spec and not is_new_layout(version):
        reserved += 2 * 1024  # eagle draft model and its graphs (0.5.9; gone from 0.5.23's formula)
    return round((gpu_mb - reserved) / gpu_mb, 3)


def _memory_defaults(profile: GpuProfile, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) by GPU memory (0.5.9 server_args.py L935-1000)."""
    mem = profile.memory_mib
    big_tp = tp >= 4
    if mem < 20 * 1024:
        return 2048, 8
    if mem < 35 * 1024:
        return 2048, 80 if big_tp else 24
    if mem < 60 * 1024:
        return 4096, 160 if big_tp else 32
    if mem < 160 * 1024:
        return 8192, 512 if big_tp else 256
    return 16384, 512


class _Both:
    """Writes a resolved value where SGLang writes it: into ServerArgs (reported) and into what runs."""

    def __init__(self, run: argparse.Namespace, reported: argparse.Namespace) -> None:
        self.run, self.reported = run, reported

    def __setitem__(self, name: str, value: object) -> None:
        for ns in (self.run, self.reported):
            setattr(ns, name, value)
            if name in RENAMED and hasattr(ns, RENAMED[name]):
                setattr(ns, RENAMED[name], value)  # the version's own field for this setting


def resolve(args: argparse.Namespace, profile: GpuProfile, model: ModelSpec, env: Mapping[str, str]) -> Resolved:
    """Apply the imitated version's automatic choices (ServerArgs.__post_init__) to ``args``."""
    contract = contract_for(args)
    version = contract.version
    new = is_new_layout(version)
    reported = copy.copy(args)
    both = _Both(args, reported)
    spec_v2 = spec_v2_enabled(version, env)
    res = Resolved(args=args, contract=contract, spec_v2=spec_v2, reported=reported, max_running=1024)
    a = args
    sm = profile.sm
    try:
        _resolve(res, both, a, profile, model, sm, new, version)
    except SimArgsError as exc:
        res.error = exc
    # What only the running engine knows (SGLang keeps these None in ServerArgs).
    if a.context_length is None:
        a.context_length = model.context_len
    if a.quantization is None and model.quant:
        a.quantization = model.quant  # detected from hf_quant_config.json by the model config
    if a.mamba_full_memory_ratio is None:
        a.mamba_full_memory_ratio = 0.9
    res.max_running = a.max_running_requests or 1024
    a.max_running_requests = res.max_running
    return res


def _resolve(
    res: Resolved,
    both: _Both,
    a: argparse.Namespace,
    profile: GpuProfile,
    model: ModelSpec,
    sm: int,
    new: bool,
    version: str,
) -> None:
    contract = res.contract
    warn = res.early.append
    # _handle_missing_default_values
    if a.tokenizer_path is None:
        both["tokenizer_path"] = a.model_path
    if a.served_model_name is None:
        both["served_model_name"] = a.model_path
    if a.random_seed is None:
        both["random_seed"] = a.sim_seed
    if not new and a.mamba_scheduler_strategy == "auto":
        both["mamba_scheduler_strategy"] = "no_buffer"  # 0.5.9: auto means no_buffer
    # _handle_gpu_memory_settings
    chunk, graph_bs = _memory_defaults(profile, a.tp_size)
    if a.chunked_prefill_size is None:
        both["chunked_prefill_size"] = chunk
    if a.cuda_graph_max_bs is None:
        both["cuda_graph_max_bs"] = graph_bs
    spec_requested = bool(a.speculative_algorithm)
    # _handle_model_specific_adjustments (Qwen3-Next / Qwen3.5 on SM100: trtllm MoE, triton attention)
    if model.hybrid and sm == 100:
        if a.quantization is None and model.quant:
            both["quantization"] = model.quant
        if a.quantization in ("fp8", "modelopt_fp4", None) and a.moe_runner_backend == "auto":
            both["moe_runner_backend"] = "flashinfer_trtllm"
            res.notes.append(f"Use flashinfer_trtllm as MoE runner backend on sm100 for {model.arch}")
        if a.attention_backend is None:
            both["attention_backend"] = "triton"
    if model.hybrid and not a.disable_radix_cache and not new:
        if a.mamba_scheduler_strategy == "extra_buffer":
            if a.speculative_num_draft_tokens is not None and a.mamba_track_interval < a.speculative_num_draft_tokens:
                raise SimArgsError(
                    "AssertionError",
                    texts.say(
                        contract,
                        "mamba_track_interval_draft",
                        mamba_track_interval=a.mamba_track_interval,
                        speculative_num_draft_tokens=a.speculative_num_draft_tokens,
                    ),
                    "_handle_mamba_radix_cache",
                )
            if a.page_size is not None and a.mamba_track_interval % a.page_size:
                raise SimArgsError(
                    "AssertionError",
                    texts.say(
                        contract,
                        "mamba_track_interval_page",
                        mamba_track_interval=a.mamba_track_interval,
                        page_size=a.page_size,
                    ),
                    "_handle_mamba_radix_cache",
                )
        elif not spec_requested:
            warn(
                "Disabling overlap schedule since mamba no_buffer is not compatible with overlap schedule, try to "
                "use --disable-radix-cache if overlap schedule is necessary"
            )
            both["disable_overlap_schedule"] = True
        else:
            warn(
                f"Disabling radix cache since speculative decoding for {model.arch} is not supported with radix "
                "cache yet."
            )
            both["disable_radix_cache"] = True
    # _handle_attention_backend_compatibility
    if a.attention_backend is None:
        both["attention_backend"] = "fa3" if sm == 90 else "trtllm_mha" if sm == 100 else "flashinfer"
    if a.attention_backend == "trtllm_mha":
        if not new and sm != 100:
            raise SimArgsError(
                "ValueError", texts.say(contract, "trtllm_mha_sm100"), "_handle_attention_backend_compatibility"
            )
        if new and sm not in (90, 100, 120):
            raise SimArgsError(
                "ValueError", texts.say(contract, "trtllm_mha_prefill_gpu"), "_handle_attention_backend_compatibility"
            )
        if new and sm == 120 and a.kv_cache_dtype == "fp8_e4m3":
            raise SimArgsError(
                "ValueError", texts.say(contract, "trtllm_mha_sm120_fp8_kv"), "_handle_attention_backend_compatibility"
            )
    # _handle_page_size
    if a.page_size is None:
        both["page_size"] = 1
    # 0.5.23's resolution pipeline: the mamba radix cache strategy follows the overlap wish
    if new and model.hybrid and not a.disable_radix_cache and a.mamba_scheduler_strategy == "auto":
        if not a.disable_overlap_schedule or a.page_size > 1:
            both["mamba_scheduler_strategy"] = "extra_buffer"
        else:
            both["mamba_scheduler_strategy"] = "no_buffer"
            both["disable_overlap_schedule"] = True
    # _handle_speculative_decoding
    if spec_requested:
        _resolve_speculative(res, both, a, new)
    # _handle_gpu_memory_settings (mem_fraction_static needs the speculative decision)
    if a.mem_fraction_static is None:
        both["mem_fraction_static"] = _auto_mem_fraction(a, profile, spec_requested, version)


def _resolve_speculative(res: Resolved, both: _Both, a: argparse.Namespace, new: bool) -> None:
    """EAGLE/NEXTN as ServerArgs resolves them (0.5.9 server_args.py L2330-2460; 0.5.23 speculative_hook.py)."""
    warn = res.early.append
    if a.speculative_algorithm == "NEXTN":
        both["speculative_algorithm"] = "EAGLE"  # SGLang renames NEXTN to EAGLE internally
    if a.speculative_algorithm not in ("EAGLE", "EAGLE3", "STANDALONE"):
        return
    if a.max_running_requests is None:
        both["max_running_requests"] = 48
        warn(
            "Max running requests is reset to 48 for speculative decoding. You can override this by explicitly "
            "setting --max-running-requests."
        )
    if new:
        if a.disable_overlap_schedule:
            warn("Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone speculative decoding.")
    elif res.spec_v2:
        both["disable_overlap_schedule"] = False
        warn("Spec v2 is enabled for eagle/eagle3 speculative decoding and overlap schedule is turned on.")
        if a.speculative_eagle_topk is not None and a.speculative_eagle_topk > 1:
            raise SimArgsError("ValueError", texts.say(res.contract, "spec_v2_topk"), "_handle_speculative_decoding")
    else:
        both["disable_overlap_schedule"] = True
        warn(
            "Overlap scheduler is disabled when spec v2 is off or using unsupported speculative algorithm. You can "
            "set env SGLANG_ENABLE_SPEC_V2=True to enable the experimental overlap scheduler. "
        )
    if getattr(a, "enable_mixed_chunk", False):
        both["enable_mixed_chunk"] = False
        warn("Mixed chunked prefill is disabled because of using eagle speculative decoding.")
    if a.speculative_num_steps is None:
        if a.speculative_eagle_topk is not None or a.speculative_num_draft_tokens is not None:
            # `assert topk is None and draft is None`: a bare assert, no message
            raise SimArgsError("AssertionError", "", "_handle_speculative_decoding")
        both["speculative_num_steps"] = 3  # auto_choose_speculative_params: (3, 1, 4) for Qwen3.5 and most
        both["speculative_eagle_topk"] = 1
        both["speculative_num_draft_tokens"] = 4
    if a.speculative_eagle_topk is None:
        # `speculative_eagle_topk > 1` with topk None: Python's own TypeError
        raise SimArgsError(
            "TypeError", "'>' not supported between instances of 'NoneType' and 'int'", "_handle_speculative_decoding"
        )
    if a.speculative_eagle_topk == 1 and a.speculative_num_draft_tokens != a.speculative_num_steps + 1:
        warn("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1")
        both["speculative_num_draft_tokens"] = a.speculative_num_steps + 1
