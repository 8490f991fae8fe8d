"""``benchbot bench URL ...``: the load generator alone, against any SGLang or OpenAI-compatible server.

No Redis, no worker, no lease: the same grammar as ``/bench`` (levels or ``rate=``, lengths, ``api=``,
``prefix=``, ``data=``), the same client and the same tables, plots and export shapes, so a number
measured here reads exactly like one measured through the bot. What it cannot do without a worker is
observe the server: the result says so (``observed: false``) rather than inventing a config.
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import uvloop

from bot.commands import parse_bench_spec
from bot.plots import plot_bench
from workers.benchmark.client import run_bench
from workers.benchmark.settings import client_settings
from workers.config import Config
from workers.results.export import CSV_COLUMNS, csv_rows
from workers.results.record import RunRecord


def measure(
    url: str,
    words: Sequence[str],
    config: Config,
    *,
    api_key: str | None = None,
    model: str | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> RunRecord:
    """Run the bench ``words`` describe against ``url``; the result as an (unstored) run record."""
    spec = parse_bench_spec(words, config)
    settings = client_settings(spec, config, api_key=api_key, model=model)
    started = time.time()
    levels = uvloop.run(run_bench(url, settings, on_progress=on_progress))
    host = url.split("://", 1)[-1].rstrip("/")
    return RunRecord(
        id="standalone",
        job_id=None,
        user=os.environ.get("USER", "me"),
        host=host,
        created_at=started,
        label=spec.label,
        kind="standalone",
        config={"state": "unobserved", "base_url": url, "observed": False},
        params=spec.to_dict(),
        levels=tuple(level.metrics.to_dict() for level in levels),
    )


def write_outputs(record: RunRecord, out_dir: Path) -> list[Path]:
    """``bench.json`` (the record), ``bench.csv`` (one row per level) and the PNG plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "bench.json"
    json_path.write_text(json.dumps(record.to_dict(), indent=2, sort_keys=True, allow_nan=False, default=str) + "\n")
    csv_path = out_dir / "bench.csv"
    with open(csv_path, "w", encoding="utf-8", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(csv_rows(record))
    return [json_path, csv_path, *plot_bench(record, out_dir=out_dir)]
