"""What the simulated GPUs are doing right now, for the ``nvidia-smi`` stand-in's telemetry.

A sim server publishes, a few times a second, its GPUs' utilisation and PCIe traffic into its registry
entry (``util``, ``pcie_rx_mbs``, ``pcie_tx_mbs``); ``nvidia-smi --query-gpu`` and ``nvidia-smi dmon``
read them from there. The figures come from the performance model, so a config moves them for the
same reason it moves tok/s:

* **utilisation / power** rise with the running batch (a lone stream leaves most SMs idle; ``power.draw``
  is derived from utilisation in ``gpu_state.py``);
* **PCIe bytes** follow the all-reduce traffic: every forward token does 2 all-reduces per layer of
  ``hidden x 2`` bytes, each GPU sending and receiving ``2 (tp-1)/tp`` of that in a ring. On an NVLink
  host the all-reduce rides NVLink and PCIe only carries the host's token ids. Custom all-reduce
  (one-shot P2P writes, no ring passes) and MSCCL++ (fewer protocol round trips) move fewer bytes than
  NCCL's ring, so they move the number down, the direction the seed's "minimal PCIe roundtrips" asked;
* speculative decoding forwards ``num_draft_tokens`` tokens per verify step but emits only the accepted
  ones, so its bytes per *emitted* token are higher by ``draft_tokens / accept_length``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from workers.sim.engine import Stats
from workers.sim.perf import PerfModel

PUBLISH_PERIOD_S = 0.25
HOST_BYTES_PER_TOKEN = 16.0  # token ids in and out over PCIe on every host (tiny next to an all-reduce)
#: share of NCCL ring bytes each all-reduce path puts on the bus (documented in docs/telemetry.md)
AR_BYTES_FACTOR = {"none": 0.0, "nccl": 1.0, "custom": 0.5, "mscclpp": 0.75}
FULL_BATCH = 32  # running requests at which the simulated SMs are fully busy


def pcie_bytes_per_tok(perf: PerfModel) -> tuple[float, float]:
    """(bytes per emitted decode token, bytes per prefilled token) one GPU moves over PCIe, rx + tx."""
    tp = perf.tp
    host = HOST_BYTES_PER_TOKEN
    if tp <= 1 or perf.profile.nvlink:
        return host, host
    ring = 2 * (tp - 1) / tp * perf.model.hidden * 2 * 2 * perf.model.layers  # send + receive, 2 ARs/layer
    per_forward_token = 2 * ring * AR_BYTES_FACTOR.get(perf.allreduce.mode, 1.0)
    spec = perf.draft_tokens / max(1.0, perf.mean_accept_len) if perf.spec else 1.0
    return host + per_forward_token * spec, host + per_forward_token


def utilisation_pct(running: int, queued: int) -> int:
    """SM utilisation the stand-in shows: 0 idle, ~45 % for one stream, 100 % from a full batch."""
    if running <= 0:
        return 5 if queued else 0
    return min(100, round(45 + 55 * min(1.0, running / FULL_BATCH)))


class LoadPublisher:
    """Publishes the live load every ``PUBLISH_PERIOD_S`` while anything changes (an idle server is quiet)."""

    def __init__(self, stats: Stats, perf: PerfModel | None, publish: Callable[..., None]) -> None:
        self.stats = stats
        self.per_token = pcie_bytes_per_tok(perf) if perf is not None else (HOST_BYTES_PER_TOKEN,) * 2
        self.publish = publish
        self._last: tuple[int, float] | None = None
        self._marks = (stats.emitted_live, stats.prefilled_live, time.monotonic())

    def tick(self) -> None:
        """One update: rates since the previous tick."""
        st = self.stats
        emitted, prefilled, then = self._marks
        now = time.monotonic()
        dt = max(1e-3, now - then)
        decode_b, prefill_b = self.per_token
        mbs = ((st.emitted_live - emitted) * decode_b + (st.prefilled_live - prefilled) * prefill_b) / dt / 1e6
        self._marks = (st.emitted_live, st.prefilled_live, now)
        state = (utilisation_pct(st.running, st.queued), round(mbs, 1))
        if state != self._last:
            self._last = state
            self.publish(util=state[0], pcie_rx_mbs=round(mbs / 2, 1), pcie_tx_mbs=round(mbs / 2, 1))

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until ``stop`` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PUBLISH_PERIOD_S)
            self.tick()
