"""Plots: valid PNGs of thumbnail-friendly size that show exactly the stored metrics."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import matplotlib
import pytest

from bot import plots
from tests.factories import make_run
from workers.results.record import RunRecord, metric

LEVELS = (1, 4, 16, 64)


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG signature + IHDR chunk (fails on anything that is not a PNG)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def values(run: RunRecord, name: str, stat: str | None = None) -> tuple[float, ...]:
    return tuple(metric(level, name, stat) for level in run.levels)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    run = make_run("r12", label="cutlass cudnn", levels=LEVELS)
    baseline = make_run("r3", label="flashinfer", speed=0.7, levels=LEVELS, tags=("baseline",))
    out = tmp_path_factory.mktemp("bench")
    return run, baseline, plots.draw_bench(run, baseline, out), out


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    kw = {"kind": "sweep-cell", "sweep_id": "s3", "levels": LEVELS}
    runs = [
        make_run("r4", label="cutlass cudnn", **kw),
        make_run("r5", label="nextn cudnn", speed=1.4, **kw),
        make_run("r6", label="fp8 kv", speed=1.1, valid=False, invalid_reason="restarted", **kw),
        make_run("r7", label="trtllm", failure="unsupported_gpu", **kw),
    ]
    out = tmp_path_factory.mktemp("sweep")
    return runs, plots.draw_sweep(runs, out), out


def test_bench_writes_two_thumbnail_friendly_pngs(bench):
    _run, _baseline, infos, out = bench
    assert [i.path for i in infos] == [out / "r12-throughput.png", out / "r12-latency.png"]
    for info in infos:
        width, height = png_size(info.path)
        assert (width, height) == (info.width_px, info.height_px)
        assert width == 1200 and 650 <= height <= 900
        assert info.path.stat().st_size > 10_000
        assert info.title.startswith("gpu-1 · sglang 0.5.6")
    assert matplotlib.get_backend().lower() == "agg"


def test_bench_throughput_shows_the_stored_metrics_and_the_baseline(bench):
    run, baseline, infos, _ = bench
    throughput = infos[0]
    total = throughput.panel("output tok/s")
    assert total.labels() == ["r12 cutlass cudnn", "baseline r3 flashinfer"]
    assert total.get("r12 cutlass cudnn").y == values(run, "output_tok_s")
    assert total.get("r12 cutlass cudnn").x == tuple(float(c) for c in LEVELS)
    base = total.get("baseline r3 flashinfer")
    assert base.y == values(baseline, "output_tok_s")
    assert base.linestyle == "--"
    assert base.color == plots.BASELINE_COLOR
    per_user = throughput.panel("per-user")
    assert per_user.get("r12 cutlass cudnn").y == values(run, "per_user_tok_s")
    # log2 x axis whose ticks are the measured levels
    assert total.xticks == tuple(float(c) for c in LEVELS)
    assert "peak" in throughput.alt_text and "r12 cutlass cudnn" in throughput.alt_text


def test_bench_latency_shows_ttft_and_itl_percentiles(bench):
    run, baseline, infos, _ = bench
    latency = infos[1]
    ttft, itl = latency.panel("ttft"), latency.panel("itl")
    assert ttft.get("r12 cutlass cudnn p50").y == values(run, "ttft_ms", "p50")
    assert ttft.get("r12 cutlass cudnn p99").y == values(run, "ttft_ms", "p99")
    assert itl.get("r12 cutlass cudnn p50").y == values(run, "itl_ms", "p50")
    assert itl.get("r12 cutlass cudnn p99").y == values(run, "itl_ms", "p99")
    assert ttft.get("baseline r3 flashinfer p50").y == values(baseline, "ttft_ms", "p50")
    # TTFT spans far more than 20x across these levels: log y; ITL does not: linear
    assert ttft.yscale == "log"
    assert itl.yscale == "linear"


def test_baseline_equal_to_the_run_is_not_drawn_twice(tmp_path):
    run = make_run("r3", levels=(1, 8), tags=("baseline",))
    infos = plots.draw_bench(run, run, tmp_path)
    assert infos[0].panel("output").labels() == ["r3 cutlass cudnn"]


def test_compare_overlays_three_runs(tmp_path):
    runs = [
        make_run("r3", label="nextn cudnn", levels=(1, 8, 32)),
        make_run("r8", label="cutlass", speed=1.2, levels=(1, 8, 32, 128)),
        make_run("r9", host="gpu-2", label="fp8", speed=0.9, version="0.5.7", levels=(2, 8)),
    ]
    infos = plots.draw_compare(runs, tmp_path)
    paths = [i.path for i in infos]
    assert [p.name for p in paths] == ["compare-r3-r8-r9-throughput.png", "compare-r3-r8-r9-latency.png"]
    assert all(png_size(p)[0] == 1200 for p in paths)
    total = infos[0].panel("output tok/s")
    assert total.labels() == ["r3 nextn cudnn", "r8 cutlass", "r9 fp8"]
    for run in runs:
        assert total.get(run.display_label).y == values(run, "output_tok_s")
    assert len(infos[0].panel("per-user").series) == 3
    assert len(infos[1].panel("ttft").series) == 6  # p50 + p99 per run
    assert total.xticks == (1.0, 2.0, 8.0, 32.0, 128.0)
    assert "gpu-1, gpu-2" in infos[0].title and "0.5.6 / sglang 0.5.7" in infos[0].title


def test_plots_are_deterministic_and_plot_functions_return_the_paths(tmp_path):
    run, other = make_run("r1", levels=(1, 8)), make_run("r2", levels=(1, 8), speed=2.0)
    a = plots.plot_bench(run, other, tmp_path / "a")
    b = plots.plot_bench(run, other, tmp_path / "b")
    assert [p.name for p in a] == ["r1-throughput.png", "r1-latency.png"]
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]


def test_sweep_draws_compare_figures_and_a_peak_bar_chart(sweep):
    runs, infos, _out = sweep
    assert [i.path.name for i in infos] == ["s3-throughput.png", "s3-latency.png", "s3-peak.png"]
    for info in infos:
        assert png_size(info.path)[0] == 1200
    total = infos[0].panel("output tok/s")
    assert total.labels() == ["r4 cutlass cudnn", "r5 nextn cudnn", "r6 fp8 kv (invalid)"]
    assert "r7 trtllm: failed (unsupported_gpu)" in infos[0].notes
    peak = infos[2].panel("peak")
    # best first, the failed cell last as a labelled gap
    assert peak.categories == ("r5 nextn cudnn", "r6 fp8 kv", "r4 cutlass cudnn", "r7 trtllm")
    by_id = {r.id: r for r in runs}
    expected = (
        by_id["r5"].best_output_tok_s,
        by_id["r6"].best_output_tok_s,
        by_id["r4"].best_output_tok_s,
        0.0,
    )
    assert peak.series[0].y == expected
    assert "r7 trtllm: failed (unsupported_gpu)" in peak.notes
    assert any("(invalid)" in note for note in peak.notes)
    assert "r7 trtllm failed" in infos[2].alt_text


def test_a_failed_cell_without_a_version_does_not_split_the_engine_in_the_title(tmp_path):
    """Issue 36 item 5: a sweep whose failed config never reported a version is titled "sglang 0.5.6", not
    "sglang 0.5.6 / sglang"; two versions of one engine are still both named."""
    kw = {"kind": "sweep-cell", "sweep_id": "s3", "levels": (1, 8)}
    failed = make_run("r7", label="trtllm", failure="unsupported_gpu", **kw)
    failed = dataclasses.replace(failed, config={k: v for k, v in failed.config.items() if k != "server"})
    assert failed.engine_version == ""
    infos = plots.draw_sweep([make_run("r4", **kw), failed], tmp_path)
    assert infos[0].title == "gpu-1 · sglang 0.5.6 · 1024→256 tok"
    newer = make_run("r8", version="0.5.7", **kw)
    assert plots.draw_sweep([make_run("r4", **kw), newer, failed], tmp_path)[0].title.startswith(
        "gpu-1 · sglang 0.5.6 / sglang 0.5.7 · "
    )


def test_a_failed_run_alone_still_gives_labelled_pngs(tmp_path):
    run = make_run("r7", label="trtllm", failure="oom")
    infos = plots.draw_bench(run, None, tmp_path)
    assert infos[0].panel("output").series == ()
    assert infos[0].notes == ("r7 trtllm: failed (oom)",)
    assert all(png_size(i.path)[0] == 1200 for i in infos)


def test_many_runs_get_a_short_stable_file_name_and_a_taller_legend(tmp_path):
    runs = [make_run(f"r{i}", label=f"config number {i} long label", levels=(1, 8)) for i in range(1, 10)]
    infos = plots.draw_compare(runs, tmp_path)
    name = infos[0].path.name
    assert name.startswith("compare-r1-to-r9-9runs-") and name.endswith("-throughput.png")
    assert len(infos[0].panel("output").series) == 9
    assert infos[0].height_px > 700  # the legend grows the figure instead of squashing the axes


def test_empty_input_is_refused(tmp_path):
    with pytest.raises(ValueError):
        plots.draw_compare([], tmp_path)
    with pytest.raises(ValueError):
        plots.draw_sweep([], tmp_path)
