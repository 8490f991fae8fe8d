"""docs/metrics.md must define every key a stored level carries, so the doc cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

from workers.benchmark.metrics import ClientLoad, LevelMetrics, RequestRecord, level_metrics

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def _sample_level() -> dict:
    """A real ``LevelMetrics.to_dict()`` (two requests, one client process), not a hand-written key list."""
    ms = 1_000_000
    records = [
        RequestRecord(
            t_send_ns=0,
            t_end_ns=100 * ms,
            chunk_t_ns=(20 * ms, 60 * ms, 100 * ms),
            chunk_tokens=(1, 2, 1),
            input_tokens=8,
            output_tokens=4,
            spec_accept_length=2.0,
        ),
        RequestRecord(t_send_ns=5 * ms, t_end_ns=90 * ms, error="HTTP 500"),
    ]
    load = [ClientLoad(wall_s=0.1, cpu_s=(0.01,), chunks=3, lag_ms=(0.1, 0.2))]
    return level_metrics(records, 2, load).to_dict()


def _documented_keys(text: str) -> set[str]:
    """Every identifier inside a backticked span of the doc (``{start_s, end_s}`` names both keys)."""
    return {word for span in re.findall(r"`([^`]+)`", text) for word in re.findall(r"[a-z_][a-z0-9_]*", span)}


def test_every_level_key_is_documented():
    keys = set(_sample_level())
    assert keys >= {f.name for f in LevelMetrics.__dataclass_fields__.values()}
    documented = _documented_keys(DOC.read_text())
    missing = sorted(keys - documented - {"schema"})
    assert not missing, f"docs/metrics.md does not define: {missing}"
    assert '"schema": 1' in DOC.read_text()


def test_every_key_has_its_own_table_row():
    """Top-level keys are defined in the per-level table, one row each (a mention in prose is not a definition)."""
    text = DOC.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    in_rows = set()
    for row in rows:
        first_cell = row.split("|")[1]
        in_rows |= set(re.findall(r"`([a-z_][a-z0-9_]*)`", first_cell))
    missing = sorted(set(_sample_level()) - {"schema"} - in_rows)
    assert not missing, f"no row in the per-level table of docs/metrics.md for: {missing}"


def test_nested_keys_are_documented():
    level = _sample_level()
    documented = _documented_keys(DOC.read_text())
    nested = set(level["client"]) | set(level["steady"])
    missing = sorted(nested - documented)
    assert not missing, f"docs/metrics.md does not define nested keys: {missing}"
    text = DOC.read_text()
    for stat in level["ttft_ms"]:
        assert f'"{stat}"' in text, f"latency statistic {stat!r} is not named in docs/metrics.md"
