"""vLLM behind the engine interface (:class:`workers.engines.interface.EngineDriver`).

Facts from the contract recorded from the wheel (``contracts/vllm-<v>.json``, key ``http``): ``vllm serve
MODEL`` binds its port early but listens only once the engine is ready (a loading server refuses
connections, as SGLang's does before it binds); ``/health`` is 200, or 503 once the engine core died;
``/version`` and ``/v1/models`` (``root``, ``max_model_len``) always answer; ``/metrics`` carries the
``vllm:*`` counters, speculative decoding's among them; ``/server_info`` exists only with
``VLLM_SERVER_DEV_MODE=1``. vLLM has no endpoint that returns its launch args, so the observed args are
the owning process's argv read by the recorded parser of the version the server reports (vLLM's own
names and defaults), beside what the server itself says (version, served model, max length, and the
resolved ``vllm_config`` where ``/server_info`` is mounted). The fingerprint is built from those.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence

import httpx

from workers.capped_http import capped_client
from workers.engines import readiness
from workers.engines.args import ArgValues, FlagValue
from workers.engines.contract import Contract
from workers.engines.interface import EngineDriver, ServerReport, ServerView, SpecDecodeCounters
from workers.engines.non_default import non_default_flags
from workers.engines.openai_server import model_card, reported_version
from workers.engines.profiling import ProfileCall
from workers.engines.readiness import auth_headers
from workers.engines.vllm import diagnosis as vllm_diagnosis
from workers.engines.vllm import flags, profile
from workers.json_value import JsonObject
from workers.secrets import redact

#: vLLM serve args left out of the fingerprint: where it listens, secrets, names and logging.
FINGERPRINT_DROPPED_ARGS = frozenset(
    {
        "host",
        "port",
        "uds",
        "api_key",
        "config",
        "model_tag",
        "model",
        "served_model_name",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_ca_certs",
        "ssl_cert_reqs",
        "root_path",
        "allowed_origins",
        "allowed_methods",
        "allowed_headers",
        "allow_credentials",
        "uvicorn_log_level",
        "disable_uvicorn_access_log",
        "disable_log_stats",
        "enable_log_requests",
        "disable_log_requests",
        "max_log_len",
        "log_error_stack",
        "disable_fastapi_docs",
        "middleware",
        "headless",
    }
)

SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
_METRIC_RE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)", re.MULTILINE)


def metric_totals(text: str, names: Sequence[str]) -> dict[str, float]:
    """Prometheus text -> ``{name: sum over its label sets}`` for ``names`` (absent names are left out)."""
    wanted = set(names)
    out: dict[str, float] = {}
    for m in _METRIC_RE.finditer(text):
        name = m.group("name")
        if name in wanted:
            try:
                out[name] = out.get(name, 0.0) + float(m.group("value"))
            except ValueError:
                continue
    return out


#: ``vllm:cache_config_info``'s labels benchbot keeps: the KV cache the server resolved (not what argv asked).
CACHE_INFO_KEYS = ("block_size", "num_gpu_blocks", "cache_dtype", "enable_prefix_caching", "kv_cache_memory_bytes")
_INFO_RE = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def cache_config(text: str) -> dict[str, str]:
    """The KV cache as the server resolved it, from the labels of its ``vllm:cache_config_info`` gauge
    (every ``CacheConfig`` field is a label): block size, blocks, dtype, prefix caching; {} when absent."""
    m = _INFO_RE.search(text)
    if m is None:
        return {}
    labels = dict(_LABEL_RE.findall(m.group("labels")))
    return {k: labels[k] for k in CACHE_INFO_KEYS if labels.get(k) not in (None, "", "None")}


def spec_counters(text: str) -> SpecDecodeCounters | None:
    """The spec-decode counters in a ``/metrics`` answer, None when the server exposes none."""
    totals = metric_totals(text, (SPEC_DRAFTS, SPEC_ACCEPTED))
    if SPEC_DRAFTS not in totals:
        return None
    return SpecDecodeCounters(totals[SPEC_DRAFTS], totals.get(SPEC_ACCEPTED, 0.0))


#: The args :func:`describe_args` says in words; every other one that differs from its default is named as a flag.
DESCRIBED_ARGS = frozenset(
    {
        "moe_backend",
        "linear_backend",
        "speculative_config",
        "tensor_parallel_size",
        "data_parallel_size",
        "pipeline_parallel_size",
        "enable_expert_parallel",
        "kv_cache_dtype",
        "disable_custom_all_reduce",
        "enforce_eager",
    }
)


def describe_args(args: ArgValues, contract: Contract | None = None) -> str:
    """``vLLM flashinfer_cutlass MoE, flashinfer_cudnn FP4 linear, MTP 3, TP8, custom AR off``: what the args say,
    then (with the version's ``contract``) every other flag that differs from vLLM's default (``--max-num-seqs 8``),
    so two different configs never read the same."""
    parts = ["vLLM"]
    moe = args.get("moe_backend")
    if moe and moe != "auto":
        parts.append(f"{moe} MoE")
    linear = args.get("linear_backend")
    if linear and linear != "auto":
        parts.append(f"{linear} FP4 linear" if "fp4" in str(args.get("quantization") or "fp4") else f"{linear} linear")
    spec = args.get("speculative_config")
    if isinstance(spec, Mapping) and spec.get("method"):
        tokens = spec.get("num_speculative_tokens")
        parts.append(f"{str(spec['method']).upper()} {tokens if tokens is not None else '?'}")
    else:
        parts.append("no spec")
    parts.append(f"TP{args.get('tensor_parallel_size') or '?'}")
    for key, label in (("data_parallel_size", "DP"), ("pipeline_parallel_size", "PP")):
        value = args.get(key)
        if isinstance(value, int) and value > 1:
            parts.append(f"{label}{value}")
    if args.get("enable_expert_parallel") is True:
        parts.append("EP")
    kv = args.get("kv_cache_dtype")
    if kv and kv != "auto":
        parts.append(f"KV {kv}")
    if args.get("disable_custom_all_reduce") is True:
        parts.append("custom AR off")
    if args.get("enforce_eager") is True:
        parts.append("eager")
    parts += non_default_flags(contract, args, DESCRIBED_ARGS | FINGERPRINT_DROPPED_ARGS)
    return " ".join(parts[:2]) + (", " + ", ".join(parts[2:]) if len(parts) > 2 else "")


class VllmDriver(EngineDriver):
    """vLLM: ``vllm serve MODEL``; observation from argv + ``/version``, ``/v1/models``, ``/metrics``.

    vLLM refuses connections until ready (the port is bound, not listening): the shared wait, with vLLM's
    rules and ready line; a 503 (dead engine core) is "not ready", and its log line is fatal."""

    kind = "vllm"
    name = "vLLM"
    default_bench_api = "completions"  # vLLM serves the OpenAI APIs; it has no SGLang-style /generate
    # observed_renames, equivalent_values, env_hints: none (the base's); args are read by the recorded parser
    rules = vllm_diagnosis.RULES
    ready_line = readiness.UVICORN_READY_LINE
    smoke = readiness.COMPLETIONS_SMOKE
    smoke_hint = vllm_diagnosis.SMOKE_HINT
    fingerprint_dropped_args = FINGERPRINT_DROPPED_ARGS

    # ---- compiling a launch, reading a process

    def flag_key(self, flag: str) -> str:
        return flags.flag_key(flag)

    def requested_args(self, given: Mapping[str, FlagValue], contract: Contract | None) -> ArgValues:
        return flags.requested_args(given, contract or flags.contract_for(None))

    def serve_args(self, argv: Sequence[str]) -> list[str]:
        return flags.serve_args(argv)

    def redact_argv(self, argv: Sequence[str]) -> list[str]:
        return flags.redact_argv(argv)

    # ---- observation

    async def report(
        self, base_url: str, api_key: str | None, timeout_s: float, argv: Sequence[str] | None
    ) -> ServerReport:
        base = base_url.rstrip("/")
        async with capped_client(headers=auth_headers(api_key), timeout=timeout_s) as client:
            version = await reported_version(client, base, self.name)
            if isinstance(version, ServerReport):
                return version
            try:
                health = await client.get(base + "/health")
                models = await client.get(base + "/v1/models")
                metrics = await client.get(base + "/metrics")
                info = await client.get(base + "/server_info", params={"config_format": "json"})
            except httpx.HTTPError as exc:
                return ServerReport("unreachable", None, f"vLLM {version} stopped answering: {type(exc).__name__}")
        if health.status_code == 503:
            return ServerReport("dead", None, f"vLLM {version}: /health answers 503 (its engine core died)")
        if health.status_code != 200:
            return ServerReport("error", None, f"vLLM {version}: GET /health: HTTP {health.status_code}")
        card = model_card(models)
        contract = flags.contract_for(version)
        args = flags.observed_args(argv, contract) if argv and contract is not None else {}
        max_model_len = card.get("max_model_len")
        counters = spec_counters(metrics.text) if metrics.status_code == 200 else None
        extra: JsonObject = {}
        cache = cache_config(metrics.text) if metrics.status_code == 200 else {}
        if cache:  # kept beside the args, never in the fingerprint: the block count follows free memory
            extra["cache_config"] = cache
        if info.status_code == 200:  # mounted only with VLLM_SERVER_DEV_MODE=1: the resolved vllm_config
            with contextlib.suppress(ValueError):
                extra["server_info"] = redact(info.json())
        root, served, tag = card.get("root"), card.get("id"), args.get("model_tag")
        served = served if isinstance(served, str) else None
        view = ServerView(
            version=version,
            args={**args, **({"served_max_model_len": max_model_len} if isinstance(max_model_len, int) else {})},
            model_path=(root if isinstance(root, str) else None) or (tag if isinstance(tag, str) else None) or served,
            served_model_name=served,
            max_total_num_tokens=None,
            last_gen_throughput=None,
            avg_spec_accept_length=counters.accept_length_since(None) if counters is not None else None,
        )
        detail = "" if args else "launch args unknown: the process's argv is not visible"
        return ServerReport("ok", view, detail, extra)

    # fingerprint: the base's, over the args read from the process (minus FINGERPRINT_DROPPED_ARGS), the model
    # vLLM serves (its ``root``), the max length it reports and its version

    def describe(self, view: ServerView, launch_args: ArgValues) -> str:
        return describe_args(view.args, flags.contract_for(view.version))

    async def spec_decode(self, base_url: str, api_key: str | None) -> SpecDecodeCounters | None:
        try:
            async with capped_client(headers=auth_headers(api_key), timeout=5.0) as client:
                resp = await client.get(base_url.rstrip("/") + "/metrics")
        except httpx.HTTPError:
            return None
        return spec_counters(resp.text) if resp.status_code == 200 else None

    def profile_call(
        self, steps: int, profile_id: str, output_dir: str, launch_args: Mapping[str, object]
    ) -> ProfileCall:
        return profile.profile_call(steps, profile_id, launch_args)


DRIVER = VllmDriver()
