"""A stand-alone /bench run is named by what differs, so /runs does not cut it off (issue 16.7)."""

from __future__ import annotations

import copy

import redis

from tests.factories import make_run
from workers.observation import RunningConfig
from workers.results import store, tables
from workers.results.labels import bench_label

BASE = "auto MoE, flashinfer_cudnn FP4, flashinfer attn, no spec, TP8, KV fp8_e4m3, custom AR off"
NEXTN = "auto MoE, flashinfer_cudnn FP4, flashinfer attn, NEXTN 3/1/4, TP8, KV fp8_e4m3, custom AR off"


def _observed(
    summary: str, *, managed: bool, launched: str | None = None, fingerprint: str = "fp-other"
) -> RunningConfig:
    data = copy.deepcopy(make_run("r9").config)
    data.update(summary=summary, fingerprint=fingerprint, managed=managed)
    data["launched_by"] = {"user": "alice", "job": "3", "at": 0.0, "label": launched} if managed else None
    return RunningConfig.from_dict(data)


def _baseline(r: redis.Redis) -> str:
    base = make_run(store.new_run_id(r), host="gpu-1")
    base.config["summary"] = BASE
    run_id = store.save_run(r, base)
    store.tag_run(r, run_id, "baseline", by="alice")
    return run_id


def test_a_server_benchbot_launched_is_named_by_its_presets(redis_client: redis.Redis) -> None:
    _baseline(redis_client)
    observed = _observed(NEXTN, managed=True, launched="nextn cudnn")
    assert bench_label(observed, store.baseline_for(redis_client, "gpu-1")) == "nextn cudnn"


def test_an_unmanaged_server_is_named_by_its_difference_to_the_baseline(redis_client: redis.Redis) -> None:
    base_id = _baseline(redis_client)
    baseline = store.baseline_for(redis_client, "gpu-1")
    label = bench_label(_observed(NEXTN, managed=False), baseline)
    assert label == f"NEXTN 3/1/4 (vs baseline {base_id})"
    same = _observed(BASE, managed=False, fingerprint=baseline.fingerprint)
    assert bench_label(same, baseline) == f"baseline config (as {base_id})"
    # In the /runs table the part that differs is what shows (the old label was cut before it).
    run = make_run("r7", host="gpu-1", label=label)
    row = next(line for line in tables.format_runs_table([run]).splitlines() if line.startswith("r7"))
    assert "NEXTN 3/1/4" in row
    old_row = tables.format_runs_table([make_run("r7", host="gpu-1", label=NEXTN)]).splitlines()[-1]
    assert "NEXTN" not in old_row  # what issue 16.7 saw: "auto MoE, flashinfer_cudnn FP4, flashin…"


def test_without_a_baseline_the_summary_stays() -> None:
    assert bench_label(_observed(NEXTN, managed=False)) == NEXTN
    assert bench_label(_observed("", managed=False)) == "unknown"
