"""The performance and memory model: how long a prefill or a decode step takes, and where memory goes.

A roofline-flavoured model with a few physical terms, so configs move the numbers in the right
direction for the right reason (documented in docs/sim.md):

* decode step = fixed per-layer launch cost + dense weight reads + routed-expert weight reads (the
  share of distinct experts a batch touches grows sub-linearly with batch size) + per-token compute +
  KV reads + 2 all-reduces per layer (latency by all-reduce mode, bytes over PCIe/NVLink) + scheduler
  overhead when the overlap scheduler is off;
* speculative decoding (EAGLE/NEXTN) runs ``num_steps`` cheap draft passes plus one verify pass over
  ``num_draft_tokens`` tokens per request, and emits 1..num_draft_tokens tokens per request per step
  (accepted drafts + the bonus token), drawn from a chained-acceptance distribution;
* prefill = fixed cost + compute per token + all-reduce bytes per token.

Calibration anchor (the seed, on SGLang 0.5.9): Qwen3.5-397B-A17B NVFP4, TP 8 on RTX PRO 6000 (PCIe),
MoE flashinfer_cutlass + FP4 GEMM flashinfer_cudnn, no speculation -> 72.0 tok/s for one stream. On
0.5.9 that config runs with the overlap scheduler off (the hybrid model's mamba cache defaults to
no_buffer, which turns overlap off), so the scheduler overhead is part of the 72.0; NEXTN with spec v2
and extra_buffer (overlap on) is 2.04x that. On 0.5.23 the same baseline gets extra_buffer and overlap,
so it runs slightly faster (~75.2 tok/s).
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from workers.sim.profile import GpuProfile, ModelSpec

LAYER_OVERHEAD_MS = 0.102042  # launch + small kernels per layer per step (CUDA graphs on); calibrated: 72.0 tok/s
DRAFT_STEP_MS = 0.55  # one MTP draft pass excluding its all-reduces
VERIFY_EXTRA_MS = 1.506  # tree/verify bookkeeping of one verify pass; calibrated: NEXTN 2.04x
SCHED_OVERHEAD_MS = 0.6  # CPU scheduling not hidden when the overlap scheduler is off
SCHED_OVERHEAD_PER_REQ_MS = 0.004
EFFECTIVE_TFLOPS = 250.0  # achieved FP4/BF16 mix per GPU
AR_BW_GBS = {False: 40.0, True: 300.0}  # effective all-reduce bus bandwidth: PCIe vs NVLink
PREFILL_FIXED_MS = 8.0
#: A decode batch above ``--cuda-graph-max-bs`` runs eagerly: every kernel is launched from the CPU, so the
#: per-layer launch cost (the fixed part) grows by this factor: +4.3 ms a step at TP 8 (+15 % at batch 64).
EAGER_LAUNCH_FACTOR = 1.7
ACCEPT_ALPHA = {1: 0.72}  # per-draft-token acceptance for topk=1; topk>1 drafts a tree, accepts more
ACCEPT_ALPHA_TREE = 0.78

MOE_BACKEND_FACTOR = {
    "auto": 1.0,
    "cutlass": 0.97,
    "flashinfer_cutlass": 1.0,
    "flashinfer_cutedsl": 0.95,
    "triton": 1.3,
    "triton_kernel": 1.25,
    "deep_gemm": 1.0,
    "flashinfer_mxfp4": 1.05,
    "flashinfer_trtllm": 0.9,
}
FP4_GEMM_FACTOR = {"flashinfer_cudnn": 1.0, "flashinfer_cutlass": 0.985, "auto": 1.0, "flashinfer_trtllm": 0.95}
ATTN_FACTOR = {"triton": 1.0, "flashinfer": 0.97, "fa3": 0.9, "trtllm_mha": 0.9}


@dataclass(frozen=True)
class AllReduce:
    """Which all-reduce path runs, what it costs per call (µs), and the warning SGLang would log."""

    mode: str  # none | custom | nccl | mscclpp
    latency_us: float
    bw_gbs: float
    warning: str | None


def choose_allreduce(args: argparse.Namespace, profile: GpuProfile) -> AllReduce:
    """SGLang's all-reduce selection: custom AR is off on >2 PCIe-only GPUs; mscclpp needs 8 or 16."""
    tp = args.tp_size
    bw = AR_BW_GBS[profile.nvlink]
    if tp <= 1:
        return AllReduce("none", 0.0, bw, None)
    nccl = profile.allreduce_us * (0.5 + 0.5 * (tp - 1) / 7)
    warning = None
    if args.enable_mscclpp:
        if tp in (8, 16):
            return AllReduce("mscclpp", nccl * 0.88, bw, None)
        warning = f"PyMscclpp is disabled due to an unsupported world size: {tp}."
    if not args.disable_custom_all_reduce:
        if not profile.nvlink and tp > 2:
            warning = (
                "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs. "
                "To silence this warning, specify disable_custom_all_reduce=True explicitly."
            )
        elif tp in (2, 4, 6, 8):
            return AllReduce("custom", nccl * 0.55, bw, warning)
    return AllReduce("nccl", nccl, bw, warning)


def kv_cache_bytes(dtype: str) -> float:
    """Bytes per KV element for ``--kv-cache-dtype`` (fp8 and mxfp8: 1, fp4 kinds: 0.5, else 2)."""
    if dtype.startswith("fp8") or dtype == "mxfp8":
        return 1
    if dtype in ("fp4_e2m1", "nvfp4", "fp4_mx_block16"):
        return 0.5
    return 2


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory in GiB, as SGLang would log it, and the KV capacity in tokens."""

    total_gb: float
    weights_gb: float
    static_gb: float
    kv_pool_gb: float
    graph_gb: float
    runtime_need_gb: float  # what must stay free beyond the static pool (graphs, activations, context)
    max_total_num_tokens: int

    @property
    def available_after_gb(self) -> float:
        return self.total_gb - self.static_gb - self.graph_gb - 1.2

    @property
    def used_gb(self) -> float:
        return min(self.total_gb, self.static_gb + self.graph_gb + 1.2)

    @property
    def oom(self) -> bool:
        return self.total_gb * (1.0 - self.static_fraction) < self.runtime_need_gb

    @property
    def static_fraction(self) -> float:
        return self.static_gb / self.total_gb


def memory_plan(args: argparse.Namespace, profile: GpuProfile, model: ModelSpec) -> MemoryPlan:
    """Weights per rank, the static pool (mem_fraction_static), KV capacity and the runtime headroom."""
    total = profile.memory_gib
    tp = max(1, args.tp_size)
    weights = model.weight_gb / tp
    if args.speculative_algorithm:
        weights += model.weight_gb / model.layers / tp * 1.5  # MTP layer + its lm head share
    static = total * args.mem_fraction_static
    graph = 0.8 + 0.0045 * (args.cuda_graph_max_bs or 256) * (1.2 if args.speculative_algorithm else 1.0)
    act = 0.000427 * (args.chunked_prefill_size or 8192)
    need = 1.0 + graph + act + (0.1 if args.speculative_algorithm else 0.0)
    pool = static - weights
    kv_bytes = kv_cache_bytes(args.kv_cache_dtype)
    heads = max(1, model.kv_heads // tp)
    per_token = model.full_attn_layers * 2 * heads * model.head_dim * kv_bytes
    kv_share = args.mamba_full_memory_ratio if model.hybrid else 1.0
    tokens = int(max(0.0, pool) * kv_share * (1 << 30) / per_token) if pool > 0 else 0
    if args.max_total_tokens:
        tokens = min(tokens, args.max_total_tokens)
    return MemoryPlan(total, weights, static, pool, graph, need, tokens)


class PerfModel:
    """Step and prefill durations for one resolved config. Pure arithmetic; the RNG only draws accepts."""

    def __init__(self, args: argparse.Namespace, profile: GpuProfile, model: ModelSpec) -> None:
        self.args = args
        self.profile = profile
        self.model = model
        self.tp = max(1, args.tp_size)
        self.allreduce = choose_allreduce(args, profile)
        self.spec = bool(args.speculative_algorithm)
        self.draft_tokens = int(args.speculative_num_draft_tokens or 1) if self.spec else 1
        self.spec_steps = int(args.speculative_num_steps or 0) if self.spec else 0
        topk = int(args.speculative_eagle_topk or 1)
        self.alpha = ACCEPT_ALPHA.get(topk, ACCEPT_ALPHA_TREE)
        self.overlap = not args.disable_overlap_schedule
        self.kernel_factor = MOE_BACKEND_FACTOR.get(args.moe_runner_backend, 1.0) * FP4_GEMM_FACTOR.get(
            args.fp4_gemm_runner_backend, 1.0
        )
        self.attn_factor = ATTN_FACTOR.get(args.attention_backend, 1.0)
        kv = args.kv_cache_dtype
        self.kv_bytes_per_token = (
            model.full_attn_layers * 2 * max(1, model.kv_heads // self.tp) * model.head_dim * kv_cache_bytes(kv)
        )
        # accept-length distribution: P(len = k) for k = 1..draft_tokens (chained acceptance + bonus token)
        probs = []
        for k in range(1, self.draft_tokens + 1):
            p = self.alpha ** (k - 1) * (1 - self.alpha) if k < self.draft_tokens else self.alpha ** (k - 1)
            probs.append(p)
        self.accept_probs = probs
        self._cum = [sum(probs[: i + 1]) for i in range(len(probs))]

    # -- pieces -------------------------------------------------------------------------------------
    def _allreduce_ms(self, tokens: int, calls: int) -> float:
        ar = self.allreduce
        if ar.mode == "none":
            return 0.0
        nbytes = tokens * self.model.hidden * 2
        lat = ar.latency_us
        if ar.mode == "mscclpp" and nbytes > 1 << 20:
            lat = lat / 0.88  # large messages go to NCCL
        ring = 2 * (self.tp - 1) / self.tp * nbytes / (ar.bw_gbs * 1e9) * 1e6
        return calls * (lat + ring) / 1000.0

    def _forward_ms(self, batch: int, tokens: int, avg_ctx: float, eager: bool = False) -> float:
        """One target-model forward over ``tokens`` tokens from ``batch`` requests (``eager``: no CUDA graph)."""
        m = self.model
        bw = self.profile.mem_bw_tbs * 1e12
        fixed = m.layers * LAYER_OVERHEAD_MS * (EAGER_LAUNCH_FACTOR if eager else 1.0)
        dense_gb = (m.weight_gb - m.expert_gb) / self.tp
        dense = dense_gb * 1e9 / bw * 1e3
        moe = 0.0
        if m.experts:
            touched = 1.0 - (1.0 - m.active_experts / m.experts) ** tokens
            moe = m.expert_gb / self.tp * 1e9 / bw * 1e3 * touched
        compute = tokens * m.active_params_b * 2e9 / (self.tp * EFFECTIVE_TFLOPS * 1e12) * 1e3
        attn = batch * avg_ctx * self.kv_bytes_per_token / bw * 1e3 * self.attn_factor
        return (fixed + dense + moe + compute) * self.kernel_factor + attn + self._allreduce_ms(tokens, 2 * m.layers)

    # -- public -------------------------------------------------------------------------------------
    def decode_step_s(self, batch: int, avg_ctx: float = 1024.0) -> float:
        """Seconds for one decode step (one verify step with speculation) of ``batch`` running requests."""
        batch = max(1, batch)
        eager = not self.in_graph(batch)
        if self.spec:
            ms = self._forward_ms(batch, batch * self.draft_tokens, avg_ctx, eager) + VERIFY_EXTRA_MS
            ms += self.spec_steps * (DRAFT_STEP_MS + self._allreduce_ms(batch, 2))
        else:
            ms = self._forward_ms(batch, batch, avg_ctx, eager)
        if not self.overlap:
            ms += SCHED_OVERHEAD_MS + SCHED_OVERHEAD_PER_REQ_MS * batch
        return ms / 1000.0

    def in_graph(self, batch: int) -> bool:
        """Whether a decode batch of ``batch`` requests replays a captured CUDA graph (``--cuda-graph-max-bs``;
        an engine whose equivalent sets no limit, as vLLM's does here, always does)."""
        limit = getattr(self.args, "cuda_graph_max_bs", None)
        return not limit or batch <= int(limit)

    def prefill_s(self, new_tokens: int, seqs: int = 1) -> float:
        """Seconds for one prefill batch of ``new_tokens`` uncached tokens over ``seqs`` requests."""
        m = self.model
        tokens = max(1, new_tokens)
        compute = tokens * m.active_params_b * 2e9 / (self.tp * EFFECTIVE_TFLOPS * 1e12) * 1e3
        bw = self.profile.mem_bw_tbs * 1e12
        weights = m.weight_gb / self.tp * 1e9 / bw * 1e3 * min(1.0, tokens / 64)
        ms = PREFILL_FIXED_MS + seqs * 0.2 + compute + weights + self._allreduce_ms(tokens, 2 * m.layers)
        return ms * self.kernel_factor / 1000.0

    @property
    def mean_accept_len(self) -> float:
        return sum((k + 1) * p for k, p in enumerate(self.accept_probs))

    def draw_accept(self, rng: random.Random) -> int:
        """Tokens emitted by one verify step for one request: 1..num_draft_tokens."""
        if not self.spec:
            return 1
        u = rng.random()
        for k, c in enumerate(self._cum):
            if u < c:
                return k + 1
        return self.draft_tokens

    def single_stream_tok_s(self, avg_ctx: float = 1024.0) -> float:
        """Expected decode tok/s of one lone stream (the calibration figure)."""
        return self.mean_accept_len / self.decode_step_s(1, avg_ctx)

    def aggregate_tok_s(self, batch: int, avg_ctx: float = 1024.0) -> float:
        """Expected decode tok/s of ``batch`` concurrent streams (capped by max_running_requests)."""
        b = min(batch, self.args.max_running_requests)
        return b * self.mean_accept_len / self.decode_step_s(b, avg_ctx)
