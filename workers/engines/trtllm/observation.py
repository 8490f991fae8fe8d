"""What a TensorRT-LLM server runs: asked of ``/version``, ``/v1/models`` and ``/health``, read from its argv and
from benchbot's ``--config`` file; what its fingerprint leaves out, and its label.

Facts from the contract recorded from the source (``contracts/trtllm-<v>.json``, key ``http``): ``/health`` is
200, or 503 with ``LLM is unavailable...`` once the executor died; ``/version`` answers ``{"version": ...}``
(the same shape as vLLM's, so the ``/v1/models`` card's ``owned_by: tensorrt_llm`` is what tells the two
apart); ``/metrics`` is a JSON list of iteration stats, not Prometheus text. No endpoint returns the launch
settings, so the observed args are the owning process's argv read by the recorded options of the version the
server reports, plus the settings of benchbot's ``--config`` file, which generic code reads back and folds in
(``Engine.settings_file``, :mod:`workers.observed_settings`): the fingerprint and the label hold both, and a
file that could not be read is part of the fingerprint too (``benchbot.settings_file_unread``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import httpx

from workers.capped_http import capped_client
from workers.engines.contract import Contract
from workers.engines.interface import SETTINGS_UNREAD_ARG, ServerReport, ServerView
from workers.engines.non_default import non_default_flags
from workers.engines.openai_server import model_card, reported_version
from workers.engines.readiness import auth_headers
from workers.engines.trtllm import flags
from workers.json_value import JsonValue

#: What ``/v1/models`` says owns the model on TensorRT-LLM (``ModelCard.owned_by``, recorded).
OWNED_BY = "tensorrt_llm"

#: serve args left out of the fingerprint: where it listens, names, logging, and where benchbot's file is.
FINGERPRINT_DROPPED_ARGS = frozenset(
    {
        "host",
        "port",
        "model",
        "tokenizer",
        "log_level",
        "extra_llm_api_options",
        "metadata_server_config_file",
        "otlp_traces_endpoint",
        "disagg_cluster_uri",
        "chat_template",
        "custom_module_dirs",
    }
)


async def report(base_url: str, api_key: str | None, timeout_s: float, argv: Sequence[str] | None) -> ServerReport:
    """What the server on ``base_url`` says it runs, with the args of its process (``argv``) when visible."""
    base = base_url.rstrip("/")
    async with capped_client(headers=auth_headers(api_key), timeout=timeout_s) as client:
        version = await reported_version(client, base, "TensorRT-LLM")
        if isinstance(version, ServerReport):
            return version
        try:
            models = await client.get(base + "/v1/models")
            health = await client.get(base + "/health")
        except httpx.HTTPError as exc:
            return ServerReport("unreachable", None, f"TensorRT-LLM {version} stopped answering: {type(exc).__name__}")
    card = model_card(models)
    if card.get("owned_by") != OWNED_BY:
        return ServerReport("not_engine", None, f"/v1/models is not owned by {OWNED_BY} (not TensorRT-LLM)")
    if health.status_code == 503:
        return ServerReport("dead", None, f"TensorRT-LLM {version}: /health answers 503 (its executor died)")
    if health.status_code != 200:
        return ServerReport("error", None, f"TensorRT-LLM {version}: GET /health: HTTP {health.status_code}")
    contract = flags.contract_for(version)
    args = flags.observed_args(argv, contract) if argv and contract is not None else {}
    card_id = card.get("id")
    served = card_id if isinstance(card_id, str) else None
    view = ServerView(
        version=version,
        args=args,
        model_path=str(args["model"]) if isinstance(args.get("model"), str) else served,
        served_model_name=served,
        max_total_num_tokens=None,
        last_gen_throughput=None,
        avg_spec_accept_length=None,
    )
    return ServerReport("ok", view, "" if args else "launch args unknown: the process's argv is not visible")


#: The serve args :func:`describe` says in words; every other one that differs from its default is named as a flag.
DESCRIBED_ARGS = frozenset(
    {
        "backend",
        "tensor_parallel_size",
        "moe_expert_parallel_size",
        "pipeline_parallel_size",
        "context_parallel_size",
        "free_gpu_memory_fraction",
        "max_batch_size",
        "enable_chunked_prefill",
    }
)


def _file_keys(contract: Contract | None) -> set[str]:
    """The recorded YAML keys (``moe_config.backend``): settings only benchbot's ``--config`` file carries."""
    return {name[2:] for name in flags.yaml_keys(contract.version)} if contract is not None else set()


def _settings_words(settings: Mapping[str, JsonValue], contract: Contract | None) -> list[str]:
    """``MoE CUTLASS``, ``MTP x3``, ``FP8 KV``... for what matters for speed; each other setting that differs
    from its recorded default as its flag (``--moe_config.max_num_tokens 4096``)."""
    words: list[str] = []
    used = set()
    if backend := settings.get("moe_config.backend"):
        words.append(f"MoE {backend}")
        used.add("moe_config.backend")
    if decoding := settings.get("speculative_config.decoding_type"):
        depth = settings.get("speculative_config.num_nextn_predict_layers") or settings.get(
            "speculative_config.max_draft_len"
        )
        words.append(f"{decoding}" + (f" x{depth}" if depth else ""))
        used |= {"speculative_config.decoding_type", "speculative_config.num_nextn_predict_layers"}
        used.add("speculative_config.max_draft_len")
    fraction = settings.get("kv_cache_config.free_gpu_memory_fraction")
    if isinstance(fraction, int | float):
        words.append(f"KV {fraction:g} of free memory")
        used.add("kv_cache_config.free_gpu_memory_fraction")
    if dtype := settings.get("kv_cache_config.dtype"):
        words.append(f"{str(dtype).upper()} KV")
        used.add("kv_cache_config.dtype")
    if settings.get("enable_attention_dp") is True:
        words.append("attention DP")
        used.add("enable_attention_dp")
    return words + non_default_flags(contract, settings, used)


def describe(view: ServerView) -> str:
    """``TensorRT-LLM pytorch, TP8, KV 0.85 of free memory, --max_num_tokens 4096; from its --config file: MoE
    CUTLASS, MTP x3``: what the args say in words, then every other one that differs from the recorded default
    of the version (:func:`workers.engines.non_default.non_default_flags`), so two configs never read the same."""
    args = view.args
    contract = flags.contract_for(view.version)
    file_keys = _file_keys(contract)
    parts = [f"TensorRT-LLM {args.get('backend') or 'pytorch'}", f"TP{args.get('tensor_parallel_size') or '?'}"]
    for key, label in (
        ("moe_expert_parallel_size", "EP"),
        ("pipeline_parallel_size", "PP"),
        ("context_parallel_size", "CP"),
    ):
        value = args.get(key)
        if isinstance(value, int) and value > 1:
            parts.append(f"{label}{value}")
    fraction = args.get("free_gpu_memory_fraction")
    if isinstance(fraction, int | float):
        parts.append(f"KV {fraction:g} of free memory")
    batch = args.get("max_batch_size")
    if isinstance(batch, int):
        parts.append(f"max batch {batch}")
    if args.get("enable_chunked_prefill") is True:
        parts.append("chunked prefill")
    parts += non_default_flags(contract, args, DESCRIBED_ARGS | FINGERPRINT_DROPPED_ARGS | file_keys)
    text = ", ".join(parts)
    if unread := args.get(SETTINGS_UNREAD_ARG):
        return f"{text}; its --config file not read back ({unread})"
    settings = _settings_words({k: v for k, v in args.items() if k in file_keys}, contract)
    return f"{text}; from its --config file: {', '.join(settings)}" if settings else text
