"""Engine flags a command may not give: matched after prefix resolution, against the real option lists.

argparse accepts any unique prefix of an option (``--por`` is ``--port``, ``--hos`` is ``--host``,
``--model-pat`` is ``--model-path``), so comparing the typed spelling with a list of names lets every
reserved flag through under another spelling. Here a flag is resolved as SGLang's own parser would
resolve it, in the recorded contract of each SGLang version (``workers/engines/contracts``), and the
*option it becomes* is checked:

* **reserved** options are never taken from a command: benchbot sets them from the host config, or
  they would move where the server listens, what it trusts or where its data goes;
* **admin-only** options change the model or the code the engine loads: an admin may give them (or
  put them in benchbot.toml), nobody else.

The bot does not know the host's SGLang version when it queues a job, so it refuses a flag that is
reserved in *any* recorded version (:func:`check_raw_flag`); the worker, which knows the version,
checks again against that version's contract before spawning (:func:`reserved_flag_problems`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from workers.engines.contract import Contract, all_contracts
from workers.errors import BenchbotError

#: Server args (``/server_info`` names) a command may never set.
RESERVED_ARGS: frozenset[str] = frozenset(
    {
        # where and how the server listens (benchbot observes, benchmarks and stops it there)
        "host",
        "port",
        "fastapi_root_path",
        "grpc_mode",
        "grpc_port",
        "smg_grpc_mode",
        "smg_http_sidecar_port",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_ca_certs",
        "ssl_keyfile_password",
        "enable_ssl_refresh",
        # internal and cluster ports and rendezvous addresses (derived from the port, or another machine)
        "nccl_port",
        "dist_init_addr",
        "disaggregation_bootstrap_port",
        "engine_info_bootstrap_port",
        "encoder_bootstrap_port",
        "gated_launch_port",
        "decoupled_spec_bind_endpoint",
        # what it trusts: its keys, and files of arguments that would bypass every check here
        "api_key",
        "admin_api_key",
        "config",
        "decrypted_config_file",
        "decrypted_draft_config_file",
        # vLLM (vllm serve): a unix socket instead of the port, no API server at all, a URL prefix, the
        # data-parallel rendezvous, TLS client checks, and a Hub token on argv
        "uds",
        "headless",
        "root_path",
        "data_parallel_address",
        "data_parallel_rpc_port",
        "ssl_cert_reqs",
        "hf_token",
    }
)

#: Server args only an admin may set: the model and the code or files the engine loads, and where
#: its data is sent or written.
ADMIN_ONLY_ARGS: frozenset[str] = frozenset(
    {
        "model_path",
        "tokenizer_path",
        "trust_remote_code",
        "revision",
        "download_dir",
        "load_format",
        "model_loader_extra_config",
        "custom_weight_loader",
        "json_model_override_args",
        "speculative_draft_model_path",
        "speculative_draft_model_revision",
        "speculative_token_map",
        "lora_paths",
        "uno_lora_path",
        "kt_weight_path",
        "quantization_param_path",
        "modelopt_checkpoint_restore_path",
        "modelopt_checkpoint_save_path",
        "modelopt_export_path",
        "remote_instance_weight_loader_seed_instance_ip",
        "remote_instance_weight_loader_seed_instance_service_port",
        "remote_instance_weight_loader_send_weights_group_ports",
        "enable_custom_logit_processor",
        "trust_request_chat_template",
        "trust_mm_content_hashes",
        "otlp_traces_endpoint",
        "kv_events_config",
        "load_publish_endpoint",
        "decoupled_spec_connect_endpoints",
        "encoder_urls",
        "encoder_register_urls",
        "crash_dump_folder",
        "export_metrics_to_file_dir",
        "file_storage_path",
        "debug_tensor_dump_output_folder",
        "weight_cache_socket",
        # vLLM: the model and tokenizer by flag, their sources and overrides, code it loads (plugins,
        # processors, worker extensions), files it may read, and where it ships KV or traces
        "model",
        "tokenizer",
        "tokenizer_revision",
        "code_revision",
        "hf_config_path",
        "hf_overrides",
        "allowed_local_media_path",
        "tool_parser_plugin",
        "reasoning_parser_plugin",
        "io_processor_plugin",
        "logits_processors",
        "worker_extension_cls",
        "lora_modules",
        "kv_transfer_config",
        "ec_transfer_config",
    }
)


def _fallback_arg(flag: str) -> str:
    """The arg a flag names when no contract knows it: ``--trust-remote-code`` -> ``trust_remote_code``."""
    return flag.split("=", 1)[0].lstrip("-").replace("-", "_")


def _resolutions(flag: str, contracts: Sequence[Contract]) -> list[tuple[str, str, Contract | None]]:
    """(server arg, option string, contract) for each contract that accepts ``flag``; the plain name
    when none does (a flag no recorded version knows is still checked by its own spelling)."""
    found: list[tuple[str, str, Contract | None]] = []
    for contract in contracts:
        res = contract.resolve(flag)
        if res.option is not None and res.flag is not None:
            found.append((contract.server_arg(flag) or res.option.dest, res.flag, contract))
    if not found:
        name = flag.split("=", 1)[0]
        found.append((_fallback_arg(name), name, None))
    return found


def _as(flag: str, option: str, contract: Contract | None) -> str:
    """``--por (--port in SGLang 0.5.9)``, or just ``--port`` when it was spelled out."""
    if option == flag.split("=", 1)[0] or contract is None:
        return flag
    return f"{flag} ({option} in {contract.label()})"


def reserved_flag_problem(flag: str, contracts: Sequence[Contract], *, admin: bool) -> str | None:
    """Why a command may not give ``flag``, or None when it may."""
    resolutions = _resolutions(flag, contracts)
    for arg, option, contract in resolutions:
        if arg in RESERVED_ARGS:
            return (
                f"{_as(flag, option, contract)} is set by benchbot from the host config and cannot be given "
                "on the command line"
            )
    if not admin:
        for arg, option, contract in resolutions:
            if arg in ADMIN_ONLY_ARGS:
                return (
                    f"{_as(flag, option, contract)} changes the model or what the engine loads or trusts: only "
                    "an admin may give it (or set it in benchbot.toml)"
                )
    return None


def check_reserved_flag(flag: str) -> None:
    """Refuse a flag that is reserved in any recorded SGLang version (the bot does not know the host's)."""
    problem = reserved_flag_problem(flag, all_contracts("sglang"), admin=True)
    if problem:
        raise BenchbotError(problem)


def check_raw_flag(flag: str, *, admin: bool = False) -> None:
    """Refuse a reserved flag always, and an admin-only one for everyone but admins."""
    problem = reserved_flag_problem(flag, all_contracts("sglang"), admin=admin)
    if problem:
        raise BenchbotError(problem)


def reserved_flag_problems(flags: Iterable[str], contract: Contract, *, admin: bool) -> list[str]:
    """The worker's check at launch, against the host's own engine version (SGLang's or vLLM's contract)."""
    return [p for flag in flags if (p := reserved_flag_problem(flag, [contract], admin=admin)) is not None]
