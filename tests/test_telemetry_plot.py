"""The per-run telemetry plot (issue 22 item 4), drawn from level summaries made by the real summariser."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from bot import plots
from tests.factories import make_run
from workers.results.record import RunRecord
from workers.telemetry.gpu_parse import GpuReading, PcieReading
from workers.telemetry.sampler import Sample
from workers.telemetry.server_metrics import ServerReading
from workers.telemetry.summary import summarize_level


def _gpu(index: int, watts: float) -> GpuReading:
    return GpuReading(index, "NVIDIA H200", watts, 80.0, 40.0, 1000.0, 1980.0, 3201.0, 60.0)


def _samples(watts: float, queued: float, kv: float | None, n: int = 4) -> list[Sample]:
    server = ServerReading(running=4.0, queued=queued, kv_usage=kv) if kv is not None else None
    return [
        Sample(0.25 * k, (_gpu(0, watts), _gpu(1, watts + 10)), (PcieReading(0, 100.0, 50.0),), server)
        for k in range(n)
    ]


def _with_telemetry(run: RunRecord, per_level: list[list[Sample]], missing: str | None = None) -> RunRecord:
    levels = tuple(
        {**lv, "telemetry": summarize_level(samples, lv, missing)}
        for lv, samples in zip(run.levels, per_level, strict=True)
    )
    return dataclasses.replace(run, levels=levels)


def test_a_sampled_run_gets_a_telemetry_plot_with_every_level_on_one_time_axis(tmp_path: Path) -> None:
    run = _with_telemetry(make_run("r4", levels=(1, 8)), [_samples(300, 0, 0.2), _samples(500, 3, 0.95)])
    infos = plots.draw_bench(run, None, tmp_path)
    assert [i.kind for i in infos] == ["throughput", "latency", "telemetry"]
    tel = infos[-1]
    assert tel.path == tmp_path / "r4-telemetry.png" and tel.path.read_bytes().startswith(b"\x89PNG")
    power = tel.panel("power").series[0]
    points = [(x, y) for x, y in zip(power.x, power.y, strict=True) if not math.isnan(y)]
    assert [y for _, y in points] == [610.0] * 4 + [1010.0] * 4  # summed over both GPUs, per level
    second_start = run.levels[0]["duration_s"]
    assert points[4][0] == second_start  # the second level starts where the first one ended
    assert tel.panel("KV").series[0].y[5:9] == (95.0,) * 4  # shown as a percentage (index 4: the break between levels)
    assert set(tel.panel("queued").series[0].y[5:9]) == {3.0}
    assert [n.strip() for n in tel.panel("power").notes] == ["c=1", "c=8"]
    assert "c=8: 1010 W, 150 MB/s PCIe, KV peak 95 %, queue 3.0" in tel.alt_text


def test_a_run_without_telemetry_has_no_telemetry_plot_and_its_other_plots_stand(tmp_path: Path) -> None:
    plain = make_run("r5", levels=(1, 8))
    assert [i.kind for i in plots.draw_bench(plain, None, tmp_path)] == ["throughput", "latency"]
    missing = _with_telemetry(
        make_run("r6", levels=(1, 8)),
        [[Sample(0.0, (), (), None)], [Sample(0.0, (), (), None)]],
        missing="no nvidia-smi on the host (nvidia-smi)",
    )
    assert missing.levels[0]["telemetry"]["missing"]  # telemetry was attempted, found nothing
    assert [i.kind for i in plots.draw_bench(missing, None, tmp_path)] == ["throughput", "latency"]
    assert not (tmp_path / "r6-telemetry.png").exists()


def test_a_server_without_metrics_leaves_its_panels_marked_not_sampled(tmp_path: Path) -> None:
    run = _with_telemetry(make_run("r7", levels=(1,)), [_samples(300, 0, None)])
    tel = plots.draw_bench(run, None, tmp_path)[-1]
    assert tel.kind == "telemetry"
    assert "not sampled" in tel.panel("KV").notes and "not sampled" in tel.panel("queued").notes
    assert "not sampled" not in tel.panel("power").notes


def test_a_sweep_gets_one_telemetry_figure_with_a_line_per_config(tmp_path: Path) -> None:
    kw = {"kind": "sweep-cell", "sweep_id": "s9", "levels": (1, 8)}
    nccl = _with_telemetry(make_run("r8", label="nccl", **kw), [_samples(300, 0, 0.2), _samples(500, 3, 0.9)])
    car = _with_telemetry(make_run("r9", label="custom ar", **kw), [_samples(280, 0, 0.2), _samples(450, 1, 0.7)])
    plain = make_run("r10", label="no telemetry", **kw)
    infos = plots.draw_sweep([nccl, car, plain], tmp_path)
    assert [i.kind for i in infos] == ["throughput", "latency", "peak", "telemetry"]
    tel = infos[-1]
    assert tel.path == tmp_path / "s9-telemetry.png" and tel.path.read_bytes().startswith(b"\x89PNG")
    energy = tel.panel("energy")
    assert energy.labels() == ["r8 nccl", "r9 custom ar"]  # the cell without telemetry draws no line
    assert energy.get("r8 nccl").x == (1.0, 8.0)
    assert energy.get("r8 nccl").y == tuple(lv["telemetry"]["j_per_tok"] for lv in nccl.levels)
    assert tel.panel("KV").get("r9 custom ar").y == (20.0, 70.0)
    assert "r8 nccl:" in tel.alt_text
    assert [i.kind for i in plots.draw_sweep([plain], tmp_path)] == ["throughput", "latency", "peak"]
