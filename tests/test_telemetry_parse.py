"""Telemetry parsers on the documented nvidia-smi formats (tests/fixtures/nvidia_smi) and /metrics texts."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.telemetry.gpu_parse import parse_dmon, parse_query
from workers.telemetry.sampler import Sample
from workers.telemetry.server_metrics import ServerReading, parse_server_metrics
from workers.telemetry.summary import header_words, run_figures, stat, summarize_level

FIX = Path(__file__).parent / "fixtures"


def test_query_rows_keep_names_and_turn_unavailable_fields_into_none() -> None:
    rows = parse_query((FIX / "nvidia_smi" / "query_gpu.csv").read_text())
    assert [r.index for r in rows] == [0, 1, 2]
    assert rows[0].name == "NVIDIA H200" and rows[0].power_w == pytest.approx(412.35)
    assert rows[0].mem_clock_mhz == 3201 and rows[0].temperature_c == 61
    assert rows[2].power_w is None and rows[2].temperature_c is None and rows[2].util_pct == 3


def test_query_skips_malformed_rows() -> None:
    assert parse_query("garbage\n0, x, 1\n, , , , , , , , \n") == []


def test_dmon_columns_are_found_by_header_in_both_column_sets() -> None:
    new = parse_dmon((FIX / "nvidia_smi" / "dmon_pucvmt.txt").read_text())
    assert [(r.index, r.rx_mbs, r.tx_mbs) for r in new] == [(0, 1834, 1790), (1, None, None)]
    old = parse_dmon((FIX / "nvidia_smi" / "dmon_old.txt").read_text())
    assert [(r.index, r.rx_mbs, r.tx_mbs) for r in old] == [(0, 12, 3)]


def test_dmon_without_pcie_columns_or_header_gives_nothing() -> None:
    assert parse_dmon("# gpu pwr sm\n# Idx W %\n 0 70 3\n") == []
    assert parse_dmon("    0    71     33\n") == []


def test_server_metrics_of_both_engines() -> None:
    sg = parse_server_metrics((FIX / "sglang_metrics.txt").read_text())
    assert sg == ServerReading(running=6.0, queued=2.0, kv_usage=0.42)
    vl = parse_server_metrics((FIX / "vllm_metrics.txt").read_text())
    assert vl == ServerReading(running=7.0, queued=0.0, kv_usage=0.93)  # summed over DP engines
    assert parse_server_metrics("") == ServerReading(None, None, None)


def test_stat_p95_interpolates() -> None:
    assert stat([]) is None
    assert stat([float(v) for v in range(1, 21)]) == {"mean": 10.5, "p95": 19.05, "max": 20.0}


def _sample(t: float, watts: tuple[float, ...], mbs: float, kv: float, queued: float) -> Sample:
    from workers.telemetry.gpu_parse import GpuReading, PcieReading

    gpus = tuple(GpuReading(i, "g", w, 50, 20, 1000, 1900, 3000, 60) for i, w in enumerate(watts))
    pcie = tuple(PcieReading(i, mbs / 2, mbs / 2) for i in range(len(watts)))
    return Sample(t, gpus, pcie, ServerReading(4, queued, kv))


def test_level_summary_derives_energy_and_pcie_per_output_token_and_the_bound() -> None:
    samples = [_sample(0.0, (100, 100), 10, 0.5, 2), _sample(0.5, (300, 300), 30, 0.95, 2)]
    level = {"duration_s": 2.0, "output_tokens": 400, "output_tok_s": 200.0}
    tel = summarize_level(samples, level, None)
    assert tel["total"]["power_w"]["mean"] == 400  # summed over 2 GPUs: (200 + 600) / 2
    assert tel["j_per_tok"] == pytest.approx(400 * 2.0 / 400)
    assert tel["pcie_bytes_per_tok"] == pytest.approx(40e6 * 2.0 / 400)  # (20 + 60) / 2 MB/s summed
    assert tel["tok_s_per_w"] == pytest.approx(0.5)
    assert tel["bound"] == ["queue", "cache"] and tel["kv_usage_peak"] == 0.95
    assert tel["gpus"]["1"]["power_w"]["max"] == 300 and tel["missing"] == []
    figures = run_figures([{**level, "telemetry": tel}])
    assert figures["j_per_tok"] == pytest.approx(2.0)
    assert header_words(figures) == "2.00 J/tok, 200.0 KB PCIe/tok"


def test_missing_telemetry_is_reported_not_zero() -> None:
    tel = summarize_level([], {"duration_s": 1.0, "output_tokens": 10}, "no nvidia-smi on the host (nvidia-smi)")
    assert tel["j_per_tok"] is None and tel["pcie_bytes_per_tok"] is None
    assert "no nvidia-smi on the host (nvidia-smi)" in tel["missing"]
    assert run_figures([{"telemetry": tel, "output_tokens": 10}])["j_per_tok"] is None
    assert header_words({"j_per_tok": None, "pcie_bytes_per_tok": None}) is None


def test_tables_show_j_and_pcie_per_token_and_the_header_words() -> None:
    from dataclasses import replace

    from tests.factories import make_run
    from workers.results.tables import compare_table, format_levels_table

    plain = make_run(levels=(4,))
    level = dict(plain.levels[0])
    level["telemetry"] = {"j_per_tok": 0.41, "pcie_bytes_per_tok": 1900.0, "bound": ["queue"], "missing": []}
    figures = {"j_per_tok": 0.41, "pcie_bytes_per_tok": 1900.0, "missing": []}
    run = replace(plain, id="r2", levels=(level,), extra={"telemetry": figures})
    table = format_levels_table(run)
    assert "(0.41 J/tok, 1.9 KB PCIe/tok)" in table.splitlines()[0]
    assert "J/tok" in table and "0.410" in table and "1.9 KB" in table and "queue-bound" in table
    assert "J/tok" not in format_levels_table(plain)
    assert "J/tok" in compare_table([run, plain])


def test_the_figures_survive_the_records_secret_scrubber() -> None:
    # Stored records pass through workers.secrets.redact, which hides any field named like ``*_token``:
    # the figures are named ``*_per_tok`` so J/tok and PCIe/tok reach /compare as numbers (they once read
    # "REDACTED" and /compare failed formatting them).
    from workers.secrets import is_secret_name, redact

    figures = {"j_per_tok": 0.41, "pcie_bytes_per_tok": 1900.0, "tok_s_per_w": 2.4}
    assert redact({"telemetry": figures}) == {"telemetry": figures}
    assert not any(is_secret_name(name) for name in figures)
    assert is_secret_name("hf_token")  # the scrubber itself is unchanged
