"""What an SGLang server says about itself: ``/server_info`` asked and read, the fingerprint of what it
reports, and a short label of what matters for speed.

SGLang's ``/server_info`` (``/get_server_info`` in other releases) returns the resolved server args, so
the observation of an SGLang host is the server's own word, not the process's argv. The fingerprint
drops what changes per start or only names things (:data:`FINGERPRINT_DROPPED_KEYS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import httpx

from workers.capped_http import capped_client
from workers.engines import fingerprint
from workers.engines.args import ArgValues, FlagValue
from workers.engines.contract import Contract
from workers.engines.interface import ServerView
from workers.engines.non_default import non_default_flags
from workers.engines.readiness import auth_headers
from workers.engines.sglang.flags import compare_requested, flag_to_arg, requested_args
from workers.engines.sglang.server_info import ServerInfo, looks_like_sglang
from workers.json_value import JsonValue

#: Server args left out of the fingerprint, and why. Everything else counts: a fingerprint must change
#: when anything that can change performance or output changes, and stay put across plain restarts.
FINGERPRINT_DROPPED_KEYS: dict[str, str] = {
    # where it listens / how it is reached: same config on another port is the same config
    "host": "bind address",
    "port": "listen port",
    "nccl_port": "picked at random per start when unset",
    "dist_init_addr": "rendezvous address, per start",
    "bootstrap_port": "disaggregation rendezvous port",
    "metrics_port": "listen port",
    "api_key": "secret",
    "admin_api_key": "secret",
    "ssl_keyfile": "file path",
    "ssl_certfile": "file path",
    "ssl_ca_certs": "file path",
    "ssl_keyfile_password": "secret",
    # chosen per start
    "random_seed": "random per start when unset",
    "launch_command": "the raw command line (port, key, order of flags)",
    "startup_time": "timestamp",
    "pid": "process id",
    # naming and logging: no effect on what is served
    "model_path": "passed separately as the model",
    "served_model_name": "a label for the same weights",
    "log_level": "logging",
    "log_level_http": "logging",
    "log_requests": "logging",
    "log_requests_level": "logging",
    "log_requests_format": "logging",
    "log_requests_target": "logging",
    "decode_log_interval": "logging cadence",
    "show_time_cost": "logging",
    "crash_dump_folder": "file path",
    "file_storage_path": "file path",
    "log_requests_folder": "file path",
    "prometheus_multiproc_dir": "file path",
    "otlp_traces_endpoint": "tracing sink",
    "uvicorn_access_log_exclude_prefixes": "logging",
    "kv_events": "event sink config",
    "frontend": "reported frontend name",
}


def _finite(value: JsonValue) -> float | None:
    """A reported number, None when it is none (missing, a bool, text, NaN or infinite)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _text(value: JsonValue) -> str | None:
    return value if isinstance(value, str) else None


def server_view(info: ServerInfo) -> ServerView:
    """What SGLang's ``/server_info`` says, as the engine-neutral :class:`workers.observation.ServerView`."""
    args = info.args
    model = _text(args.get("model_path"))
    tokens = _finite(info.internal.get("max_total_num_tokens"))
    return ServerView(
        version=info.version,
        args=dict(args),
        model_path=model,
        served_model_name=_text(args.get("served_model_name")) or model,
        max_total_num_tokens=int(tokens) if tokens is not None else None,
        last_gen_throughput=_finite(info.internal.get("last_gen_throughput")),
        avg_spec_accept_length=_finite(info.internal.get("avg_spec_accept_length")),
    )


def config_fingerprint(server_info_args: ArgValues, model: str | None, version: str | None) -> str:
    """12 hex chars naming a configuration: canonical args (minus :data:`FINGERPRINT_DROPPED_KEYS`),
    the model and the engine version. Same config after a restart -> same value; any change -> another."""
    args = {k: v for k, v in server_info_args.items() if k not in FINGERPRINT_DROPPED_KEYS}
    return fingerprint.digest({"args": args, "model": model, "version": version})


def _is_on(value: JsonValue) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


#: The server args :func:`describe_config` says in words; every other one the launch set is named as a flag.
DESCRIBED_ARGS = frozenset(
    {
        "moe_runner_backend",
        "attention_backend",
        "speculative_algorithm",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
        "tp_size",
        "dp_size",
        "ep_size",
        "pp_size",
        "kv_cache_dtype",
        "disable_custom_all_reduce",
        "enable_mscclpp",
        "disable_overlap_schedule",
        "disable_cuda_graph",
    }
)
_FP4_BACKEND = "fp4_gemm_runner_backend"


def describe_config(args: ArgValues, launch_args: ArgValues | None = None, contract: Contract | None = None) -> str:
    """A short label of what matters for speed, e.g.
    ``"flashinfer_cutlass MoE, flashinfer_cudnn FP4, NEXTN 3/1/4, TP8, custom AR off, --max-running-requests 8"``.

    It only states what the args say: custom all-reduce is shown when it is disabled, never claimed
    "on" (SGLang turns it off by itself on more than two PCIe GPUs, which the args do not reveal).
    ``launch_args`` (the process's own ``{--flag: value}``) names the speculative algorithm as it was
    asked for when the server renamed it: ``"NEXTN 3/1/4 (server reports EAGLE 3/1/4)"``. With the version's
    ``contract``, every other option the command line set to a value other than SGLang's default follows as
    a flag (:func:`workers.engines.non_default.non_default_flags`); what SGLang filled in by itself is not
    named unless no command line was seen.
    """
    parts: list[str] = []
    moe = args.get("moe_runner_backend")
    if moe:
        parts.append(f"{moe} MoE")
    quant = str(args.get("quantization") or "").lower()
    fp4 = args.get(_FP4_BACKEND)
    fp4_said = bool(fp4 and (not quant or "fp4" in quant))
    if fp4_said:
        parts.append(f"{fp4} FP4")
    attn = args.get("attention_backend")
    if attn:
        parts.append(f"{attn} attn")
    algo = args.get("speculative_algorithm")
    if algo:
        steps = args.get("speculative_num_steps")
        topk = args.get("speculative_eagle_topk")
        draft = args.get("speculative_num_draft_tokens")
        shape = "/".join("?" if v is None else str(v) for v in (steps, topk, draft))
        asked = (launch_args or {}).get("--speculative-algorithm")
        if isinstance(asked, str) and asked and asked.upper() != str(algo).upper():
            parts.append(f"{asked} {shape} (server reports {algo} {shape})")
        else:
            parts.append(f"{algo} {shape}")
    else:
        parts.append("no spec")
    parts.append(f"TP{args.get('tp_size', '?')}")
    for key, label in (("dp_size", "DP"), ("ep_size", "EP"), ("pp_size", "PP")):
        value = args.get(key)
        if isinstance(value, int) and value > 1:
            parts.append(f"{label}{value}")
    kv = args.get("kv_cache_dtype")
    if kv and kv != "auto":
        parts.append(f"KV {kv}")
    if _is_on(args.get("disable_custom_all_reduce")):
        parts.append("custom AR off")
    if _is_on(args.get("enable_mscclpp")):
        parts.append("mscclpp")
    if _is_on(args.get("disable_overlap_schedule")):
        parts.append("overlap off")
    if _is_on(args.get("disable_cuda_graph")):
        parts.append("cuda graph off")
    given = {flag_to_arg(flag, contract) for flag in launch_args} if launch_args else None
    skip = DESCRIBED_ARGS | FINGERPRINT_DROPPED_KEYS.keys() | ({_FP4_BACKEND} if fp4_said else set())
    parts += non_default_flags(contract, args, skip, given)
    return ", ".join(parts)


class _Flagged(Protocol):
    """A ``workers.config.Preset`` as far as matching goes (the engine folders stay below the config)."""

    @property
    def flags(self) -> Sequence[tuple[str, FlagValue]]: ...


def preset_words_for(args: ArgValues, presets: Mapping[str, _Flagged | Mapping[str, FlagValue]]) -> list[str]:
    """SGLang preset words whose flags all match the observed args (sorted), to label an unmanaged server.

    ``presets`` maps a word to a ``workers.config.Preset`` (anything with ``.flags`` as (flag, value)
    pairs) or to a plain ``{flag: value}`` mapping. Presets with no flags never match.
    """
    words: list[str] = []
    for word, preset in presets.items():
        pairs = list(preset.items()) if isinstance(preset, Mapping) else list(preset.flags)
        if not pairs:
            continue
        if not compare_requested(requested_args(dict(pairs)), args).diffs:
            words.append(word)
    return sorted(words)


async def server_info(base_url: str, api_key: str | None, timeout_s: float) -> tuple[str, JsonValue, str]:
    """SGLang's ``/server_info`` (or ``/get_server_info``): (outcome, json, detail), outcome ok | starting |
    not_engine | unreachable | error."""
    detail = ""
    async with capped_client(headers=auth_headers(api_key), timeout=timeout_s) as client:
        for path in ("/server_info", "/get_server_info"):
            try:
                resp = await client.get(base_url.rstrip("/") + path)
            except httpx.HTTPError as exc:
                return "unreachable", None, f"GET {path}: {type(exc).__name__}"
            if resp.status_code == 404:
                detail = f"GET {path}: 404"
                continue  # older or newer name: try the other one
            if resp.status_code == 503:
                return "starting", None, f"GET {path}: 503"
            if resp.status_code != 200:
                return "error", None, f"GET {path}: HTTP {resp.status_code}"
            try:
                data = resp.json()
            except ValueError:
                return "not_engine", None, f"GET {path}: not JSON"
            if not looks_like_sglang(data):
                return "not_engine", None, f"GET {path}: JSON without SGLang's version/model_path"
            return "ok", data, ""
    return "not_engine", None, detail or "no server_info endpoint"
