"""Why a TensorRT-LLM start failed, from its log: its failure RULES and the texts it survives.

The rules are the shared :class:`workers.engines.diagnosis.Rule`, matched by the shared
``diagnose``; each is written against a text recorded from TensorRT-LLM's source or from click, which
parses ``trtllm-serve``'s command line (``contracts/trtllm-<v>.json``, key ``texts``, with the file and line
it came from). ``tests/test_trtllm_driver.py`` matches every rule against the recorded text of every
recorded version. Click reports a bad command line as ``Error: No such option '--x'.`` (exit 2) after
the usage line; a ``--config`` YAML key the LLM API lacks fails pydantic's ``extra = "forbid"`` check.
Ordered most specific first: the root cause wins over a wrapper.
"""

from __future__ import annotations

from workers.engines.diagnosis import Rule, rule

RULES: tuple[Rule, ...] = (
    # Memory (tensorrt_llm/_torch/pyexecutor/resource_manager.py: the KV cache left after the weights and
    # the activations' profile cannot hold one sequence of max_seq_len).
    rule(
        r"Impossible to fit in any sequence in kvCache",
        "oom",
        "TensorRT-LLM's KV cache cannot hold one sequence after loading the weights; raise "
        "--kv_cache_free_gpu_memory_fraction, lower --max_seq_len or --max_batch_size, use more GPUs "
        "(--tp_size), or free the GPUs (/status shows who holds them).",
        "kv_cache_cannot_fit",
    ),
    rule(
        r"CUDA out of memory|torch\.OutOfMemoryError",
        "oom",
        "The GPU ran out of memory; lower --kv_cache_free_gpu_memory_fraction, --max_batch_size or "
        "--max_num_tokens, or use more GPUs (--tp_size).",
    ),
    # GPU support: the trtllm-gen MoE has kernels for SM100/SM103 only (fused_moe_trtllm_gen.py). TensorRT-LLM
    # logs this reason as a warning; the process then fails on the kernel, so it explains an exit only.
    rule(
        r"TRTLLMGenFusedMoE requires SM100 or SM103, got SM(?P<sm>\d+)",
        "unsupported_gpu",
        "The TRTLLM MoE backend (trtllm-gen kernels) runs on SM100/SM103 GPUs only, this one is SM{sm}; "
        "choose another moe_config.backend (the moe-cutlass preset: --moe_config.backend CUTLASS).",
        "trtllm_moe_needs_sm100",
        fatal=False,
    ),
    rule(
        r"Unsupported moe backend: (?P<backend>\S+)",
        "config_error",
        "TensorRT-LLM has no MoE backend {backend}; use one of the moe_config.backend choices (CUTLASS, "
        "TRTLLM, DEEPGEMM, ...).",
        "moe_backend_unsupported",
    ),
    rule(
        r"Invalid decoding type: (?P<kind>\S+)",
        "config_error",
        "TensorRT-LLM has no speculative decoding type {kind}; speculative_config.decoding_type is one of "
        "MTP, Eagle3, NGram, ... (the mtp preset sets MTP).",
        "invalid_decoding_type",
    ),
    rule(
        r"(?P<backend>\S+) is not a known backend, check help for available options",
        "config_error",
        "TensorRT-LLM has no backend {backend}; --backend is pytorch, tensorrt (trt) or _autodeploy.",
        "unknown_backend",
    ),
    # The model: a path that is not a folder is handed to huggingface_hub as a repo id, which refuses it.
    rule(
        r"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '(?P<model>[^'\n]*)'",
        "config_error",
        "TensorRT-LLM cannot find the model {model}: there is no such folder on the host, and it is not a "
        "Hugging Face repo id either (set the model in the host's [engine] config).",
        "hf_repo_id_invalid",
    ),
    rule(
        r"Failed to bind socket to (?P<addr>\S+): \[Errno 98\]",
        "port_in_use",
        "The engine's port ({addr}) is already taken by another process; /status shows who holds it.",
        "port_in_use",
    ),
    # The command line (click's wording; the real CLI is a click group)
    rule(
        r"No such option '(?P<option>[^']+)'",
        "config_error",
        "This TensorRT-LLM has no option {option} (trtllm-serve spells its options with underscores, e.g. "
        "--tp_size); check `trtllm-serve serve --help`.",
        "click_no_such_option",
    ),
    rule(
        r"Invalid value for '(?P<param>[^']+)': (?P<msg>[^\n]+)",
        "config_error",
        "trtllm-serve refused {param}: {msg}",
        "click_invalid_value",
    ),
    rule(
        r"Missing argument '(?P<arg>[^']+)'",
        "config_error",
        "trtllm-serve needs {arg} (the model: set it in the host's [engine] config).",
        "click_missing_argument",
    ),
    rule(
        r"Option '(?P<option>[^']+)' requires an argument",
        "config_error",
        "trtllm-serve's {option} needs a value.",
        "click_requires_argument",
    ),
    # A --config YAML key the LLM API does not have (pydantic's extra="forbid"; pydantic-core's wording)
    rule(
        r"(?P<key>[\w.]+)\n\s+Extra inputs are not permitted",
        "config_error",
        "TensorRT-LLM's LLM API has no setting {key} (a --config YAML key); check the key's name.",
    ),
    # Serving: the executor died (/health turns 503 with this text)
    rule(
        r"LLM is unavailable\. Please check the server logs for more details",
        "crashed",
        "The TensorRT-LLM executor died while serving (/health answers 503); the log tail shows why.",
        "health_unavailable",
    ),
    rule(
        r"(?:ValueError|RuntimeError|AssertionError): (?P<msg>[^\n]+)",
        "config_error",
        "TensorRT-LLM rejected the launch settings ({msg}); change the settings it names.",
        fatal=False,
    ),
)

#: Recorded texts TensorRT-LLM logs on a healthy start: none may end a readiness wait.
BENIGN_TEXTS: tuple[str, ...] = (
    "weights_memory",
    "kv_cache_estimate",
    "overriding_field",
    "uvicorn_started",
    "uvicorn_waiting",
    "ready",
)

#: What a failed smoke generation suggests on TensorRT-LLM.
SMOKE_HINT = "try another moe_config.backend (moe-cutlass) or the pytorch backend."
