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
from collections.abc import Awaitable, Callable, Mapping, Sequence

import httpx

from workers.capped_http import capped_client
from workers.engines import diagnosis, fingerprint, readiness
from workers.engines.args import ArgValues, FlagValue, parse_argv
from workers.engines.contract import Contract
from workers.engines.interface import ServerReport, ServerView, SpecDecodeCounters
from workers.engines.non_default import non_default_flags
from workers.engines.profiling import ProfileCall
from workers.engines.readiness import auth_headers, is_garbage
from workers.engines.vllm import diagnosis as vllm_diagnosis
from workers.engines.vllm import flags, profile
from workers.json_value import JsonObject, JsonValue
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

SMOKE_PROMPT = readiness.SMOKE_PROMPT


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


class VllmDriver:
    """vLLM: ``vllm serve MODEL``; observation from argv + ``/version``, ``/v1/models``, ``/metrics``."""

    kind = "vllm"
    name = "vLLM"
    default_bench_api = "completions"  # vLLM serves the OpenAI APIs; it has no SGLang-style /generate
    observed_renames: Mapping[str, tuple[str, ...]] = {}  # args are read by the recorded parser: vLLM's own names
    equivalent_values: Mapping[tuple[str, str, str], str] = {}
    env_hints: Mapping[str, str] = {}

    # ---- compiling a launch

    def fixed_flags(self, model: str, bind: str, port: int) -> list[tuple[str, FlagValue]]:
        return [("--host", bind), ("--port", str(port))]

    def positionals(self, model: str) -> list[str]:
        return [model]

    def flag_key(self, flag: str) -> str:
        return flags.flag_key(flag)

    def requested_args(self, given: Mapping[str, FlagValue], contract: Contract | None) -> ArgValues:
        return flags.requested_args(given, contract or flags.contract_for(None))

    # ---- reading a process

    def launch_args(self, argv: Sequence[str]) -> ArgValues:
        rest = flags.serve_args(argv)
        args: JsonObject = dict(parse_argv(rest))
        if rest and not rest[0].startswith("-"):  # `vllm serve MODEL ...`: the positional model_tag wins
            args["--model"] = rest[0]
        return args

    def redact_argv(self, argv: Sequence[str]) -> list[str]:
        return flags.redact_argv(argv)

    # ---- readiness

    async def wait_ready(
        self,
        base_url: str,
        *,
        deadline_s: float,
        is_alive: Callable[[], Awaitable[bool]],
        read_new_log: Callable[[], Awaitable[str]],
        api_key: str | None,
        gate: Callable[[], None] | None,
        foreign_listener: Callable[[], Awaitable[str | None]] | None,
        contract: Contract | None,
    ) -> readiness.ReadyResult | diagnosis.Diagnosis:
        # vLLM refuses connections until ready (the port is bound, not listening): the shared wait, with vLLM's
        # rules and ready line; a 503 (dead engine core) is "not ready", and its log line is fatal.
        return await readiness.wait_ready(
            base_url,
            deadline_s=deadline_s,
            is_alive=is_alive,
            read_new_log=read_new_log,
            api_key=api_key,
            gate=gate,
            foreign_listener=foreign_listener,
            contract=contract,
            rules=vllm_diagnosis.RULES,
            engine=self.name,
            ready_line=(contract.ready_line if contract is not None else None) or "Application startup complete.",
        )

    async def smoke_test(self, base_url: str, api_key: str | None) -> readiness.SmokeResult:
        """Greedy 16 tokens of ``POST /v1/completions`` (the served model from ``/v1/models``)."""
        headers = auth_headers(api_key)
        try:
            async with capped_client(headers=headers, timeout=120.0) as client:
                models = await client.get(base_url.rstrip("/") + "/v1/models")
                data = models.json().get("data") if models.status_code == 200 else None
                model = data[0].get("id") if isinstance(data, list) and data and isinstance(data[0], dict) else None
                body = {
                    "prompt": SMOKE_PROMPT,
                    "max_tokens": 16,
                    "temperature": 0,
                    **({"model": model} if model else {}),
                }
                resp = await client.post(base_url.rstrip("/") + "/v1/completions", json=body)
        except (httpx.HTTPError, ValueError) as exc:
            return readiness.SmokeResult(False, "", None, f"the request failed: {type(exc).__name__}: {exc}")
        if resp.status_code != 200:
            return readiness.SmokeResult(
                False, "", None, f"HTTP {resp.status_code}: {diagnosis.clip(resp.text.strip(), 200)}"
            )
        try:
            answer = resp.json()
        except ValueError:
            return readiness.SmokeResult(False, "", None, "the answer is not JSON")
        choices = answer.get("choices") if isinstance(answer, dict) else None
        text = choices[0].get("text") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else ""
        text = text if isinstance(text, str) else ""
        usage = answer.get("usage") if isinstance(answer, dict) else None
        count = usage.get("completion_tokens") if isinstance(usage, dict) else None
        tokens = int(count) if isinstance(count, (int, float)) else None
        if tokens is None:
            return readiness.SmokeResult(False, text, None, "the server reported no completion_tokens")
        if tokens == 0:
            return readiness.SmokeResult(False, text, 0, "the server generated 0 tokens")
        why = is_garbage(text)
        return readiness.SmokeResult(why is None, text, tokens, why or "")

    def smoke_diagnosis(self, result: readiness.SmokeResult, log_text: str) -> diagnosis.Diagnosis:
        return diagnosis.smoke_diagnosis(result, log_text, rules=vllm_diagnosis.RULES, hint=vllm_diagnosis.SMOKE_HINT)

    def diagnose(
        self, log_text: str, *, exited: bool, timed_out: bool, contract: Contract | None
    ) -> diagnosis.Diagnosis:
        return diagnosis.diagnose(
            log_text,
            exited=exited,
            returncode=None,
            timed_out=timed_out,
            contract=contract,
            rules=vllm_diagnosis.RULES,
            engine=self.name,
        )

    # ---- observation

    async def report(
        self, base_url: str, api_key: str | None, timeout_s: float, argv: Sequence[str] | None
    ) -> ServerReport:
        base = base_url.rstrip("/")
        async with capped_client(headers=auth_headers(api_key), timeout=timeout_s) as client:
            try:
                version_resp = await client.get(base + "/version")
            except httpx.HTTPError as exc:
                return ServerReport("unreachable", None, f"GET /version: {type(exc).__name__}")
            try:
                version_data = version_resp.json() if version_resp.status_code == 200 else None
            except ValueError:
                version_data = None
            if not isinstance(version_data, dict) or not isinstance(version_data.get("version"), str):
                return ServerReport("not_engine", None, f"GET /version: HTTP {version_resp.status_code}, not vLLM's")
            version = version_data["version"]
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
        card: Mapping[str, JsonValue] = {}
        with contextlib.suppress(ValueError, AttributeError):
            listed = models.json().get("data") if models.status_code == 200 else None
            if isinstance(listed, list) and listed and isinstance(listed[0], dict):
                card = listed[0]
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

    def fingerprint(self, view: ServerView) -> str:
        """Args read from the process (minus :data:`FINGERPRINT_DROPPED_ARGS`), the model vLLM serves (its
        ``root``), the max length it reports and its version; another engine's same words hash apart."""
        args = {k: v for k, v in view.args.items() if k not in FINGERPRINT_DROPPED_ARGS}
        return fingerprint.digest({"engine": "vllm", "args": args, "model": view.model_path, "version": view.version})

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
