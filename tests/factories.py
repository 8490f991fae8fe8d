"""Realistic run records for tests (results, plots, render, notifier ...) to share.

Numbers follow the shape of a real SGLang serving curve on one H200 with an 8B model: total
throughput rises sub-linearly with concurrency while per-user speed, TTFT and ITL degrade. All
values are deterministic functions of the arguments, so tests can recompute what they expect.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from workers.observation import GpuInfo, ObservedState, ProcessView, RunningConfig, ServerView
from workers.results.record import RunRecord

BASE_TIME = 1764680000.0  # 2025-12-02T12:53:20Z


def latency(p50: float, spread: float = 1.0) -> dict[str, float]:
    """A latency summary dict {mean, p50, p90, p99, max} around ``p50`` (ms)."""
    return {
        "mean": round(p50 * 1.08, 3),
        "p50": round(p50, 3),
        "p90": round(p50 * (1 + 0.5 * spread), 3),
        "p99": round(p50 * (1 + 1.5 * spread), 3),
        "max": round(p50 * (1 + 3.0 * spread), 3),
    }


def make_level(
    concurrency: int,
    *,
    speed: float = 1.0,
    input_len: int = 1024,
    output_len: int = 256,
    errors: int = 0,
    spec_accept_length: float | None = None,
) -> dict[str, Any]:
    """One ``LevelMetrics.to_dict()``-shaped level; ``speed`` scales throughput (2.0 = twice as fast)."""
    per_user = round(185.0 * speed / (1 + concurrency / 48), 2)
    output_tok_s = round(per_user * concurrency, 2)
    num_requests = max(concurrency * 4, 16)
    duration = round(num_requests * output_len / output_tok_s, 3)
    request_s = round(num_requests / duration, 4)
    total_tok_s = round(output_tok_s * (input_len + output_len) / output_len, 2)
    itl = 1000.0 / per_user
    ttft = 22.0 * (1 + concurrency / 6) / speed
    return {
        "concurrency": concurrency,
        "num_requests": num_requests,
        "completed": num_requests - errors,
        "errors": errors,
        "duration_s": duration,
        "input_tokens": input_len * num_requests,
        "output_tokens": output_len * (num_requests - errors),
        "output_tok_s": output_tok_s,
        "total_tok_s": total_tok_s,
        "request_s": request_s,
        "per_user_tok_s": per_user,
        "ttft_ms": latency(ttft, spread=1.2),
        "itl_ms": latency(itl, spread=0.6),
        "chunk_gap_ms": latency(itl, spread=0.7),
        "tpot_ms": latency(itl * 1.02, spread=0.3),
        "e2e_ms": latency(ttft + itl * output_len, spread=0.4),
        "spec_accept_length": spec_accept_length,
        "steady": {
            "start_s": 0.4,
            "end_s": round(duration - 0.3, 3),
            "output_tok_s": round(output_tok_s * 1.03, 2),
        },
        "peak_output_tok_s": round(output_tok_s * 1.2, 2),
        "client": {
            "cpu_pct": round(3.0 + concurrency * 0.4, 1),
            "cpu_us_per_chunk": 9.5,
            "lag_p99_ms": 0.8,
            "bottleneck": "server",
            "reason": "client CPU well below saturation",
        },
        "error_messages": ["HTTP 503: server overloaded"] * min(errors, 3),
    }


def make_config(
    *,
    host: str = "gpu-1",
    version: str = "0.5.6",
    label: str = "cutlass cudnn",
    fingerprint: str = "fp1c0ffee5",
    pid: int = 4242,
    extra_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``RunningConfig.to_dict()``-shaped observation of an SGLang server on ``host``."""
    args: dict[str, Any] = {
        "model_path": "/models/Qwen3-8B",
        "tp_size": 1,
        "port": 30000,
        "attention_backend": "cudnn" if "cudnn" in label else "flashinfer",
        "moe_runner_backend": "cutlass" if "cutlass" in label else "auto",
        "speculative_algorithm": "NEXTN" if "nextn" in label else None,
        "mem_fraction_static": 0.88,
        "api_key": None,
    }
    args.update(extra_args or {})
    # Built from the real types, so the shape is exactly what a worker writes (schema, process ids...).
    return RunningConfig(
        host=host,
        port=30000,
        observed_at=1764679500.0,
        state=ObservedState.RUNNING,
        process=ProcessView(
            pid=pid,
            pgid=pid,
            argv=("python3", "-m", "sglang.launch_server", "--model-path", "/models/Qwen3-8B", "--port", "30000"),
            start_time=1764679000.0 + pid,
            start_ticks=1764679000 + pid,
        ),
        server=ServerView(
            version=version,
            args=args,
            model_path="/models/Qwen3-8B",
            served_model_name=None,
            max_total_num_tokens=None,
            last_gen_throughput=None,
            avg_spec_accept_length=None,
        ),
        gpus=(
            GpuInfo(
                index=0,
                name="NVIDIA H200",
                memory_used_mib=125000,
                memory_total_mib=143771,
                utilization_pct=97,
                compute_cap="9.0",
            ),
        ),
        fingerprint=fingerprint,
        instance_id=f"{host}:{pid}:{1764679000 + pid}",
        summary=f"sglang {version} · Qwen3-8B · tp1 · {label}",
    ).to_dict()


def make_run(
    run_id: str = "r1",
    *,
    host: str = "gpu-1",
    user: str = "alice",
    label: str = "cutlass cudnn",
    levels: tuple[int, ...] = (1, 8, 32),
    speed: float = 1.0,
    created_at: float | None = None,
    tags: tuple[str, ...] = (),
    kind: str = "bench",
    sweep_id: str | None = None,
    version: str = "0.5.6",
    fingerprint: str | None = None,
    valid: bool = True,
    invalid_reason: str | None = None,
    status: str = "ok",
    failure: str | None = None,
    job_id: str = "17",
    input_len: int = 1024,
    output_len: int = 256,
) -> RunRecord:
    """A complete, valid schema-1 run record; ``failure="oom"`` makes a failed run with a diagnosis."""
    n = int(run_id[1:]) if run_id[1:].isdigit() else 1
    fp = fingerprint or hashlib.sha256(f"{label}|{version}".encode()).hexdigest()[:10]
    config = make_config(host=host, version=version, label=label, fingerprint=fp, pid=4000 + n)
    after = copy.deepcopy(config)
    if not valid:
        after["process"]["pid"] += 1
        after["instance_id"] = f"{host}:{after['process']['pid']}:0"
    diagnosis = None
    level_dicts: list[dict[str, Any]] = [
        make_level(c, speed=speed, input_len=input_len, output_len=output_len) for c in levels
    ]
    if failure is not None:
        status = "failed"
        level_dicts = []
        diagnosis = {
            "category": failure,
            "summary": f"the engine failed: {failure}",
            "evidence_line": "RuntimeError: CUDA error: no kernel image is available for execution",
            "log_tail": ["loading weights", "RuntimeError: CUDA error: no kernel image is available"],
        }
    return RunRecord(
        id=run_id,
        job_id=job_id,
        user=user,
        host=host,
        created_at=created_at if created_at is not None else BASE_TIME + 60 * n,
        label=label,
        tags=tags,
        kind=kind,
        sweep_id=sweep_id,
        config=config,
        config_after=after if failure is None else None,
        valid=valid and failure is None,
        invalid_reason=invalid_reason if valid is False else None,
        params={
            "levels": list(levels),
            "input_len": input_len,
            "output_len": output_len,
            "num_requests": None,
            "warmup": None,
        },
        levels=tuple(level_dicts),
        status=status,
        diagnosis=diagnosis,
    )
