"""A simulated ``vllm serve``'s config in the terms of the simulator's shared models.

The vLLM personality has no performance or accuracy model of its own: a mixed fleet's ``/compare`` and
``/eval`` must show differences that come from the configs, not from two simulators tuned apart. So the
vLLM flags are translated here, following what the vLLM 0.34 wheel does with them:

* **kernels** (``moe_kernel``, ``linear_kernel``): ``--moe-backend`` / ``--linear-backend`` name their
  kernels as SGLang's ``--moe-runner-backend`` / ``--fp4-gemm-backend`` do; ``auto`` is resolved as the
  wheel's NVFP4 oracles pick (MoE: ``flashinfer_trtllm`` on the SM100 family, else ``flashinfer_cutlass``
  from SM100 up, else ``marlin``; linear: ``flashinfer_cutedsl`` on the SM100 family, else
  ``flashinfer_cutlass`` from SM100 up, else ``marlin``). A dense model runs no MoE kernel and a model
  that is not NVFP4 no FP4 GEMM (``none``);
* **answer quality** (``quality``): ``answers.kernel_quality`` of those kernels, the table both engines share;
* **performance** (``perf_args``): the same config in SGLang's argument names, for ``perf.PerfModel``:
  MTP with ``k`` speculative tokens is NEXTN with ``k`` steps, top-k 1 and ``k + 1`` draft tokens; vLLM's
  async scheduling (on unless ``--no-async-scheduling``) is SGLang's overlap scheduler; ``--max-num-seqs``
  and ``--max-num-batched-tokens`` (defaults by GPU memory, as ``_set_default_max_num_seqs_and_batched_
  tokens_args`` sets them for the API server) are ``max_running_requests`` and ``chunked_prefill_size``.
"""

from __future__ import annotations

import argparse
from typing import Protocol

from workers.sim import answers
from workers.sim.profile import GpuProfile, ModelSpec

SM100_FAMILY = (100, 103)  # where FlashInfer's trtllm-gen and CuTe-DSL NVFP4 kernels exist
NVFP4 = "modelopt_fp4"
# vLLM --attention-backend (upper case in vLLM) -> the attention factor's key in perf.py
ATTENTION = {"flashinfer": "flashinfer", "triton_attn": "triton", "flash_attn": "fa3"}


class VllmSettings(Protocol):
    """What this module reads of ``workers.sim.vllm.Settings``."""

    tp: int
    moe_backend: str
    linear_backend: str
    quantization: str | None
    spec_method: str | None
    spec_tokens: int
    disable_custom_all_reduce: bool
    raw: dict


def is_nvfp4(cfg: VllmSettings, model: ModelSpec) -> bool:
    return (cfg.quantization or model.quant) == NVFP4


def moe_kernel(cfg: VllmSettings, model: ModelSpec, sm: int) -> str:
    """The MoE kernel the server runs: the flag, or what vLLM's NVFP4 MoE oracle picks for ``auto``."""
    if not model.experts:
        return "none"
    if cfg.moe_backend != "auto":
        return cfg.moe_backend
    return "flashinfer_trtllm" if sm in SM100_FAMILY else "flashinfer_cutlass" if sm >= 100 else "marlin"


def linear_kernel(cfg: VllmSettings, model: ModelSpec, sm: int) -> str:
    """The FP4 GEMM kernel: the flag, or the first of vLLM's NVFP4 linear kernels this GPU supports."""
    if not is_nvfp4(cfg, model):
        return "none"
    if cfg.linear_backend != "auto":
        return cfg.linear_backend
    return "flashinfer_cutedsl" if sm in SM100_FAMILY else "flashinfer_cutlass" if sm >= 100 else "marlin"


def quality(cfg: VllmSettings, model: ModelSpec, sm: int) -> str:
    """``good``, ``degraded`` or ``garbage`` (``answers.kernel_quality``, the table SGLang's sim reads too)."""
    return answers.kernel_quality(moe_kernel(cfg, model, sm), linear_kernel(cfg, model, sm))


def default_batch_limits(profile: GpuProfile) -> tuple[int, int]:
    """vLLM's API-server defaults by GPU memory: (max_num_seqs, max_num_batched_tokens)."""
    gib = profile.memory_gib
    if gib >= 160:
        return 1024, 16384
    if gib >= 70 and "a100" not in profile.gpu_name.lower():
        return 1024, 8192
    return 256, 2048


#: What profiling the forward pass takes besides the weights (GiB per GPU) at up to 8,192 batched tokens.
ACTIVATION_GIB = 2.0


def profile_activation_gib(cfg: VllmSettings, profile: GpuProfile) -> float:
    """vLLM profiles one forward of ``--max-num-batched-tokens`` tokens before it sizes the KV cache: the
    activations it peaks at grow with that budget (2 GiB up to 8,192 tokens, in proportion above), and what
    they take is not left for the KV cache (too much: ``kv_cache_no_memory`` at start-up)."""
    tokens = human_int(cfg.raw.get("max_num_batched_tokens"), default_batch_limits(profile)[1])
    return ACTIVATION_GIB * max(1.0, tokens / 8192)


def human_int(value: object, default: int) -> int:
    """``32768``, ``32k`` (10**3) or ``32K`` (2**10), as vLLM's ``human_readable_int`` reads them."""
    if value is None:
        return default
    raw = str(value).strip()
    if raw in ("-1", "auto"):
        return default
    mult = {"k": 10**3, "m": 10**6, "K": 2**10, "M": 2**20}.get(raw[-1:], 1)
    return int(float(raw[:-1]) * mult) if mult != 1 else int(raw)


def perf_args(cfg: VllmSettings, model: ModelSpec, profile: GpuProfile) -> argparse.Namespace:
    """The equivalent SGLang server's resolved arguments, as ``perf.PerfModel`` reads them."""
    raw = cfg.raw
    seqs, batched = default_batch_limits(profile)
    spec = bool(cfg.spec_method and cfg.spec_tokens)
    attention = str(raw.get("attention_backend") or "").lower()
    sm = profile.sm
    return argparse.Namespace(
        tp_size=max(1, cfg.tp),
        enable_mscclpp=False,
        disable_custom_all_reduce=cfg.disable_custom_all_reduce,
        speculative_algorithm="NEXTN" if spec else None,
        speculative_num_steps=cfg.spec_tokens if spec else None,
        speculative_num_draft_tokens=cfg.spec_tokens + 1 if spec else None,
        speculative_eagle_topk=1 if spec else None,
        disable_overlap_schedule=raw.get("async_scheduling") is False,
        moe_runner_backend=moe_kernel(cfg, model, sm),
        fp4_gemm_runner_backend=linear_kernel(cfg, model, sm),
        attention_backend=ATTENTION.get(attention) or ("fa3" if sm == 90 else "flashinfer"),
        kv_cache_dtype=str(raw.get("kv_cache_dtype") or "auto"),
        max_running_requests=human_int(raw.get("max_num_seqs"), seqs),
        chunked_prefill_size=human_int(raw.get("max_num_batched_tokens"), batched),
    )
