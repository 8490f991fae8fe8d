"""The tune landscape: the simulator's performance terms folded into goodput at an SLO, in closed form.

``bench/tune_efficiency.py`` asks the search for configs and scores them here instead of launching a
server per config: what it measures is how many *configs the search has to try* before it is within 5 %
of the best, and a launched trial would only add the simulator's measurement noise (and minutes) to the
same answer. The terms are the simulator's (``workers.sim.perf``; docs/sim.md, "The tune landscape"):

* a decode step costs ``STEP_MS`` x the MoE runner's factor, growing with the batch; above
  ``--cuda-graph-max-bs`` the step runs eagerly (``EAGER_PENALTY`` more), so a small graph limit hurts
  at high concurrency and a big one costs memory;
* NEXTN emits ~2x the tokens per step at small batches, a benefit that fades as the batch fills the GPU;
* ``--max-running-requests`` caps the batch: more requests served at once raise throughput until the
  p99 ITL limit binds, and each costs KV memory: a cap whose KV does not fit beside the weights and the
  CUDA graphs' memory fails at start (the sim's OOM);
* ``--chunked-prefill-size`` bounds prefill chunks: a long prompt waits ceil(in/chunk) chunks (TTFT),
  a chunk too big for the activation headroom fails at start;
* the ``flashinfer_trtllm`` MoE runner refuses to start on SM120 with SGLang 0.5.9 (the seed's crash).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from workers.sim.perf import MOE_BACKEND_FACTOR

STEP_MS = 9.0
PER_REQUEST_MS = 0.035
EAGER_PENALTY = 0.3
KV_POOL_GB = 40.0
KV_GB_PER_REQUEST = 0.14
GRAPH_GB_PER_BS = 0.012
ACTIVATION_GB_PER_1K = 0.9
HEADROOM_GB = 12.0
PREFILL_MS_PER_1K = 25.0
MOE = {"cutlass": "flashinfer_cutlass", "triton": "triton", "trtllm": "flashinfer_trtllm"}


@dataclass(frozen=True)
class Point:
    """One config's answer: goodput at the SLO (req/s), or why it did not start."""

    goodput_rps: float
    crashed: str = ""


def evaluate(
    params: Mapping[str, str | int],
    *,
    ttft_ms: float = 2000.0,
    itl_ms: float = 40.0,
    input_len: int = 4096,
    output_len: int = 256,
) -> Point:
    """Goodput at the SLO of one config of the tune landscape (``moe``, ``nextn``, ``max-running``,
    ``cuda-graph-bs``, ``chunked-prefill``)."""
    moe = MOE[str(params.get("moe", "cutlass"))]
    if moe == "flashinfer_trtllm":
        return Point(0.0, "flashinfer_trtllm MoE: no kernel image for SM120 on SGLang 0.5.9")
    cap = int(params.get("max-running", 64))
    graph_bs = int(params.get("cuda-graph-bs", 256))
    chunk = int(params.get("chunked-prefill", 8192))
    if chunk / 1000 * ACTIVATION_GB_PER_1K > HEADROOM_GB:
        return Point(0.0, f"CUDA out of memory: a {chunk}-token prefill chunk's activations do not fit")
    if cap * KV_GB_PER_REQUEST + graph_bs * GRAPH_GB_PER_BS > KV_POOL_GB:
        return Point(0.0, f"CUDA out of memory: KV for {cap} requests beside graphs up to batch {graph_bs}")
    nextn = params.get("nextn", "off") == "on"
    best = 0.0
    for batch in range(1, cap + 1):
        step = STEP_MS * MOE_BACKEND_FACTOR[moe] * (1 + PER_REQUEST_MS * batch)
        if batch > graph_bs:
            step *= 1 + EAGER_PENALTY
        tokens_per_step = 1.0 + (1.04 * max(0.0, 1 - batch / 96) if nextn else 0.0)
        itl = step / tokens_per_step
        ttft = PREFILL_MS_PER_1K * input_len / 1000 + math.ceil(input_len / chunk) * step
        if itl > itl_ms or ttft > ttft_ms:
            break
        best = max(best, batch * 1000.0 / (itl * output_len))
    return Point(best)
