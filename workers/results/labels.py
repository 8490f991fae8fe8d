"""What a stand-alone ``/bench`` run is called in ``/runs``: what differs, not the whole config.

The observed config's summary (``"auto MoE, flashinfer_cudnn FP4, flashinfer attn, NEXTN 3/1/4, TP8, ..."``)
is the same for most of a host's runs up to one part, and a 40-column table cuts it before that part.
So a run is named by the presets benchbot launched the server with when it did, else by the parts
of the summary that differ from the host's baseline, else by the summary itself.
"""

from __future__ import annotations

from workers.observation import RunningConfig
from workers.results.record import RunRecord
from workers.results.summary_diff import summary_parts


def bench_label(observed: RunningConfig, baseline: RunRecord | None = None) -> str:
    """The label of a run measured on the server ``observed``."""
    launched = observed.launched_by
    if observed.managed and launched is not None and launched.label:
        return launched.label  # the preset words and flags it was launched with
    summary = observed.summary or ""
    if not summary:
        return "unknown"
    if baseline is None or not baseline.config_summary:
        return summary
    if observed.fingerprint and observed.fingerprint == baseline.fingerprint:
        return f"baseline config (as {baseline.id})"
    base = set(summary_parts(baseline.config_summary))
    differs = [part for part in summary_parts(summary) if part not in base]
    if not differs:
        return f"baseline config (as {baseline.id})"
    return f"{', '.join(differs)} (vs baseline {baseline.id})"
