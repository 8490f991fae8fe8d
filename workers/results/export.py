"""Run history out of benchbot: JSONL (the records as stored) and CSV (one flat row per run and level)."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TextIO

import redis as redis_lib

from workers.errors import BenchbotError
from workers.results.notes import Note, notes_of
from workers.results.record import RunRecord, error_count, level_key, metric, sub
from workers.results.store import list_runs

CSV_COLUMNS = (
    "run_id", "created_at", "user", "host", "label", "tags", "kind", "sweep_id", "status",
    "fingerprint", "engine_version", "valid", "invalid_reason", "concurrency", "output_tok_s",
    "per_user_tok_s", "total_tok_s", "request_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
    "itl_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "errors",
    "spec_accept_length", "client_bottleneck", "failure_category", "rate", "schedule_lag_p99_ms",
    "eval_task", "eval_n", "eval_accuracy", "eval_ci_low", "eval_ci_high", "eval_verdict", "eval_baseline_run",
    "notes",
)  # fmt: skip


def iso_time(ts: float) -> str:
    """A unix time as ISO-8601 UTC (``2025-12-02T13:33:20Z``)."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def _lag_p99(level: Mapping[str, object]) -> float | None:
    return metric(sub(sub(level.get("arrivals")).get("lag")), "p99_ms")


def _eval_cells(record: RunRecord) -> dict[str, str]:
    """The accuracy beside the speed: the same on every level row of a run; empty without an eval."""
    evaluated = record.accuracy
    if evaluated is None:
        return {}
    return {
        "eval_task": evaluated.task,
        "eval_n": str(evaluated.n),
        "eval_accuracy": _cell(evaluated.accuracy),
        "eval_ci_low": _cell(evaluated.ci95[0]),
        "eval_ci_high": _cell(evaluated.ci95[1]),
        "eval_verdict": evaluated.verdict,
        "eval_baseline_run": evaluated.baseline_run or "",
    }


def _notes_cell(run_notes: Sequence[Note]) -> str:
    """A run's notes in one CSV cell: ``@alice 2026-12-06T19:40:00Z: text`` joined by `` | ``."""
    return " | ".join(f"@{n.by} {iso_time(n.at)}: {n.text}" for n in run_notes)


def csv_rows(record: RunRecord, run_notes: Sequence[Note] = ()) -> list[dict[str, str]]:
    """The flat CSV rows of one run: one per level (one level-less row for a run with none)."""
    base = {
        "notes": _notes_cell(run_notes),
        "run_id": record.id,
        "created_at": iso_time(record.created_at),
        "user": record.user,
        "host": record.host,
        "label": record.label,
        "tags": " ".join(record.tags),
        "kind": record.kind,
        "sweep_id": record.sweep_id or "",
        "status": record.status,
        "fingerprint": record.fingerprint,
        "engine_version": record.engine_version,
        "valid": "true" if record.valid else "false",
        "invalid_reason": record.invalid_reason or "",
        "failure_category": record.failure_category,
        **_eval_cells(record),
    }
    if not record.levels:
        return [{col: base.get(col, "") for col in CSV_COLUMNS}]
    rows = []
    for level in sorted(record.levels, key=level_key):
        client = sub(level.get("client"))
        row = dict(base)
        row.update(
            {
                "concurrency": str(level["concurrency"]),
                "output_tok_s": _cell(metric(level, "output_tok_s")),
                "per_user_tok_s": _cell(metric(level, "per_user_tok_s")),
                "total_tok_s": _cell(metric(level, "total_tok_s")),
                "request_s": _cell(metric(level, "request_s")),
                "errors": str(error_count(level)),
                "spec_accept_length": _cell(metric(level, "spec_accept_length")),
                "client_bottleneck": str(client.get("bottleneck") or ""),
                "rate": _cell(metric(level, "rate")),
                "schedule_lag_p99_ms": _cell(_lag_p99(level)),
            }
        )
        for name in ("ttft", "itl", "tpot", "e2e"):
            for stat in ("p50", "p99"):
                row[f"{name}_{stat}_ms"] = _cell(metric(level, f"{name}_ms", stat))
        rows.append({col: row.get(col, "") for col in CSV_COLUMNS})
    return rows


def export_runs(
    redis: redis_lib.Redis,
    fmt: str,
    stream: TextIO,
    *,
    filter: str | None = None,
    n: int | None = None,
) -> int:
    """Write runs to ``stream`` (oldest first); returns how many runs were written.

    ``jsonl``: one full record per line, the same shape as stored (with its ``eval`` object, the per-item
    results left out: they stay in Redis beside the record) and its ``notes`` (the thread's discussion).
    ``csv``: one row per (run, level)
    with the flat columns of :data:`CSV_COLUMNS`, ready for a spreadsheet or pandas.
    """
    if fmt not in ("jsonl", "csv"):
        raise BenchbotError(f"unknown export format {fmt!r}: use jsonl or csv")
    records = list_runs(redis, n=n if n is not None else 1 << 62, filter=filter)
    records.reverse()
    writer = csv.DictWriter(stream, fieldnames=CSV_COLUMNS, lineterminator="\n") if fmt == "csv" else None
    if writer is not None:
        writer.writeheader()
    for record in records:
        run_notes = notes_of(redis, record.id)
        if writer is None:
            line = record.to_dict()
            if run_notes:  # a run nobody discussed is exported exactly as stored
                line["notes"] = [n.to_dict() for n in run_notes]
            stream.write(json.dumps(line, sort_keys=True, allow_nan=False, default=str) + "\n")
        else:
            writer.writerows(csv_rows(record, run_notes))
    return len(records)
