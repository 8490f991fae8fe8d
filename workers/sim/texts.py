"""The engine's own words for every failure and warning the simulator produces, per imitated version.

The contract recorded from the wheel (``workers/engines/contracts/sglang-<v>.json``) holds the exact
texts behind benchbot's diagnosis rules, keyed (``kv_pool_too_small``, ``cuda_graph_capture_failed``,
...). An f-string's fields were recorded with sample values (the recorder's ``fills``), so each key
here also knows its template: when ``template.format(**samples)`` reproduces the recorded text, the
simulator renders the template with the real values; when it does not (the recording changed), the
recorded text is used verbatim, sample values and all, so the wording can never drift from the wheel.

``WHEEL_TEXTS`` holds texts the recorder does not record yet (or that come from FlashInfer, torch or
uvicorn rather than SGLang), each with its source; ``missing_keys()`` lists them for the lead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from workers.engines.contract import Contract, parse_version


@dataclass(frozen=True)
class Wording:
    """A text with ``{fields}``, and the sample values the recorder filled in for them."""

    template: str
    samples: Mapping[str, str] = field(default_factory=dict)

    def render(self, values: Mapping[str, object]) -> str:
        return self.template.format(**values)


#: Recorded keys -> the templates their recorded text may come from (one per wording the wheels use).
RECORDED: dict[str, tuple[Wording, ...]] = {
    "ready": (Wording("The server is fired up and ready to roll!"),),
    "kv_pool_too_small": (
        # 0.5.9 model_runner_kv_cache_mixin.py: f"... Current value: {self.server_args.mem_fraction_static=}"
        Wording("Not enough memory. Please try to increase --mem-fraction-static. "
                "Current value: self.server_args.mem_fraction_static={value}", {"value": "1"}),
        # 0.5.23 pool_configurator.py: the first literal; the value is a second one (WHEEL_TEXTS)
        Wording("Not enough memory. Please try to increase --mem-fraction-static."),
    ),
    "cuda_graph_capture_failed": (
        Wording("Capture cuda graph failed: {e}\n{hint}", {"e": "CUDA out of memory", "hint": "1"}),
    ),
    "scheduler_exception": (
        Wording("Scheduler hit an exception: {traceback}", {"traceback": "Traceback (most recent call last):"}),
    ),
    "child_sigquit": (Wording("Received sigquit from a child process. It usually means the child failed."),),
    "spec_v2_topk": (Wording("Spec v2 currently only supports topk = 1 for speculative decoding."),),
    "trtllm_mha_sm100": (
        Wording("TRTLLM MHA backend is only supported on Blackwell GPUs (SM100). Please use a different backend."),
    ),
    "nvfp4_unsupported_platform": (
        Wording("Current platform does not support NVFP4 quantization. Please use Blackwell and above."),
    ),
    "nan_in_logits": (Wording("Detected errors during sampling! NaN in the logits."),),
    "internal_port_wait": (
        Wording("port {port} is in use. Waiting for {i} seconds for {port_name} to be available. {error_message}",
                {"port": "30001", "i": "10", "port_name": "nccl_port", "error_message": ""}),
    ),
    "kv_pool_full_retract": (Wording("KV cache pool is full. Retract requests. "),),
    "mamba_track_interval_draft": (
        Wording("mamba_track_interval {interval} must be greater than or equal to speculative_num_draft_tokens "
                "{draft}", {"interval": "2", "draft": "4"}),
    ),
}


@dataclass(frozen=True)
class WheelText:
    """A text the contract does not record (yet): its template, where it comes from, which versions."""

    template: str
    source: str
    since: tuple[int, ...] = (0,)
    until: tuple[int, ...] = (99,)  # exclusive

    def applies(self, version: str) -> bool:
        return self.since <= parse_version(version) < self.until


#: key -> wordings by version range. Sources are paths inside the wheels (``[0.5.9]`` = sglang==0.5.9).
WHEEL_TEXTS: dict[str, tuple[WheelText, ...]] = {
    "kv_pool_current_value": (
        WheelText(" Current value: mem_fraction_static={value}",
                  "[0.5.23] srt/model_executor/pool_configurator.py L98", since=(0, 5, 15)),
    ),
    "cuda_graph_capture_hint": (
        WheelText("Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
                  "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n3. disable torch compile by not "
                  "using --enable-torch-compile\n4. disable CUDA graph by --disable-cuda-graph. (Not recommended. "
                  "Huge performance loss)\nOpen an issue on GitHub https://github.com/sgl-project/sglang/issues/"
                  "new/choose \n", "[0.5.9] srt/model_executor/cuda_graph_runner.py L935", until=(0, 5, 15)),
        WheelText("Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
                  "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n3. disable decode CUDA graph "
                  "by --cuda-graph-backend-decode=disabled. (Not recommended. Huge performance loss)\nOpen an "
                  "issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n",
                  "[0.5.23] srt/model_executor/runner_backend_utils/__init__.py L14", since=(0, 5, 15)),
    ),
    # The recorder's needle "must be divisible by page_size" finds another literal first (0.5.9:
    # trtllm_fp8_kv_kernel.py "total_slots ..."), so this one is read from the wheel.
    "mamba_track_interval_page": (
        WheelText("mamba_track_interval {interval} must be divisible by page_size {page}",
                  "[0.5.9] srt/server_args.py L1740", until=(0, 5, 15)),
    ),
    "trtllm_mha_sm120_fp8_kv": (
        WheelText("TRTLLM FMHAv2 prefill on SM120 does not support fp8_e4m3 KV cache or skip-softmax.",
                  "[0.5.23] srt/arg_groups/attention_hook.py L220", since=(0, 5, 15)),
    ),
    "trtllm_mha_prefill_arch": (
        WheelText("TRTLLM MHA backend for prefill requires Hopper (SM90), Blackwell (SM100), or SM120 GPUs. "
                  "Please use a different prefill backend.", "[0.5.23] srt/arg_groups/attention_hook.py L203",
                  since=(0, 5, 15)),
    ),
    "nan_sanitized": (
        WheelText("NaN detected in {msg}; values were sanitized before sampling. This usually indicates numerical "
                  "overflow (e.g. fp16 activations) or an upstream bug producing NaN. Logged once; further "
                  "occurrences are silent.", "[0.5.23] srt/utils/async_probe.py L40 (SGLANG_SANITIZE_NAN_LOGITS=1)",
                  since=(0, 5, 15)),
    ),
    "internal_port_not_found": (
        WheelText("The port {port} is in use, but we could not find the process that uses it.",
                  "[0.5.9] srt/utils/common.py L720; [0.5.23] srt/utils/network.py L90"),
    ),
    "internal_port_used_by": (
        WheelText("{port_name} is used by a process already. process.name()={name!r}' process.cmdline()={cmdline!r} "
                  "process.status()={status!r} pid={pid!r}",
                  "[0.5.9] srt/utils/common.py L724; [0.5.23] srt/utils/network.py L95"),
    ),
    "internal_port_timeout": (
        WheelText("{port_name} at {port} is not available in {timeout_s} seconds. {error_message}",
                  "[0.5.9] srt/utils/common.py L731; [0.5.23] srt/utils/network.py L102"),
    ),
    "internal_port_in_use": (
        WheelText("Port is already in use. dist_init_port={dist_init_port!r} port_base={port_base!r} "
                  "detokenizer_port={detokenizer_port!r} nccl_port={nccl_port!r} "
                  "scheduler_input_port={scheduler_input_port!r}",
                  "[0.5.9] srt/server_args.py L5690; [0.5.23] srt/server_args.py L886"),
    ),
    # Not SGLang's words: the libraries it calls raise these.
    "flashinfer_backend_unsupported": (
        WheelText("{func} does not support backend '{backend}' with capability {cc}",
                  "flashinfer/utils.py backend_requirement (flashinfer.utils.BackendSupportedError)"),
    ),
    "flashinfer_no_arch": (
        WheelText("No supported CUDA architectures found for major versions {majors}.",
                  "flashinfer/compilation_context.py get_nvcc_flags_list (trtllm-gen MoE is built for [10])"),
    ),
    "uvicorn_bind_failed": (
        WheelText("[Errno 98] error while attempting to bind on address ({host!r}, {port}): address already in use",
                  "uvicorn/server.py startup (logger.error of the OSError)"),
    ),
}


class TextMissing(LookupError):
    """The imitated version has no such text (the failure mode does not exist there)."""


def recorded(contract: Contract, key: str, **values: object) -> str:
    """The recorded text ``key`` of this version, rendered with ``values`` where it has fields."""
    text = contract.text(key)
    if text is None:
        raise TextMissing(f"{contract.label()} has no recorded text {key!r}")
    for wording in RECORDED.get(key, ()):
        try:
            if wording.render(wording.samples) == text:
                return wording.render(values)
        except (KeyError, IndexError):
            continue
    return text


def wheel(contract: Contract, key: str, **values: object) -> str:
    """A text from ``WHEEL_TEXTS`` for this version, rendered with ``values``."""
    for option in WHEEL_TEXTS.get(key, ()):
        if option.applies(contract.version):
            return option.template.format(**values)
    raise TextMissing(f"no wheel text {key!r} for {contract.label()}")


def say(contract: Contract, key: str, **values: object) -> str:
    """The recorded text when the contract has it, else the wheel text."""
    try:
        return recorded(contract, key, **values)
    except TextMissing:
        return wheel(contract, key, **values)


def missing_keys(contract: Contract) -> list[str]:
    """Keys the simulator takes from the wheel source because the contract does not record them."""
    return sorted(k for k, options in WHEEL_TEXTS.items() if any(o.applies(contract.version) for o in options))
