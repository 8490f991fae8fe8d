"""The per-run telemetry plot (issue 22 item 4): what the GPUs, the bus and the server did over the bench.

Four panels over time (GPU power and PCIe rx+tx summed over the GPUs, the server's KV-cache usage and
its queue of waiting requests), drawn from the per-level timelines the worker stored
(``workers/telemetry/summary.py``, at most ``TIMELINE_POINTS`` rows a level), so nothing is re-sampled
and an old run draws the same picture. Levels are laid end to end on one time axis, each level's own
clock offset by the levels before it, and their boundaries are dotted lines labelled with the load: a
queue that builds only at c=64 is read off the picture at once.

Drawn with :mod:`bot.plot_kit`, like :mod:`bot.plots` (same size, fonts and palette; Agg canvas, no
pyplot). A run without telemetry, or whose telemetry was entirely missing, has no such plot:
:func:`draw_telemetry` returns None and the bench's other plots are unaffected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from bot import plot_kit
from workers.results.record import RunRecord, level_key, load_label, metric, number, sub

#: timeline column -> (panel title, y label, scale applied to the stored value)
PANELS = (
    (1, "GPU power (all GPUs)", "W", 1.0),
    (2, "PCIe rx+tx (all GPUs)", "MB/s", 1.0),
    (3, "KV-cache usage", "%", 100.0),
    (4, "Requests queued in the server", "requests", 1.0),
)
LEVEL_COLOR = "#555555"


def _value(row: Sequence[object], column: int, scale: float) -> float:
    """A timeline cell as a float, NaN where it was missing (matplotlib leaves a gap there)."""
    value = row[column] if column < len(row) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return math.nan
    return float(value) * scale


def _timelines(run: RunRecord) -> list[tuple[str, float, list[Sequence[object]]]]:
    """(load label, level length in s, timeline rows) per level in run order, levels without a timeline kept
    (their span stays on the axis, empty)."""
    out = []
    open_loop = run.open_loop
    for level in run.levels:
        timeline = sub(level.get("telemetry")).get("timeline")
        rows: list[Sequence[object]] = [
            r for r in (timeline if isinstance(timeline, list) else []) if isinstance(r, list | tuple) and r
        ]
        ts = [float(r[0]) for r in rows if isinstance(r[0], int | float)]
        length = max(number(level.get("duration_s") or 0.0), max(ts, default=0.0))
        prefix = "rate=" if open_loop else "c="
        out.append((prefix + load_label(level_key(level), open_loop), length, rows))
    return out


def has_telemetry(run: RunRecord) -> bool:
    """True when some level's timeline holds at least one sampled value worth drawing."""
    return any(
        not math.isnan(_value(row, column, 1.0))
        for _, _, rows in _timelines(run)
        for row in rows
        for column, *_ in PANELS
    )


def draw_telemetry(run: RunRecord, title: str, directory: Path) -> plot_kit.PlotInfo | None:
    """``<run-id>-telemetry.png``, or None when the run has no telemetry to show."""
    if not has_telemetry(run):
        return None
    levels = _timelines(run)
    fig = Figure(figsize=(plot_kit.WIDTH_IN, plot_kit.HEIGHT_IN * 1.45), dpi=plot_kit.DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(2, 2, sharex=True).flat)
    starts = []
    offset = 0.0
    for _, length, _ in levels:
        starts.append(offset)
        offset += length
    for i, (ax, (column, name, unit, scale)) in enumerate(zip(axes, PANELS, strict=True)):
        xs: list[float] = []
        ys: list[float] = []
        for (_, _, rows), start in zip(levels, starts, strict=True):
            for row in rows:
                xs.append(start + number(row[0]))
                ys.append(_value(row, column, scale))
            xs.append(math.nan)  # a break between levels: no line drawn across the gap
            ys.append(math.nan)
        ax.plot(xs, ys, color=plot_kit.PALETTE[i], label=name, marker="o", markersize=3)
        ax.set_title(name)
        ax.set_ylabel(unit)
        finite = [y for y in ys if not math.isnan(y)]
        ax.set_ylim(0, max(finite, default=0.0) * 1.3 or 1.0)  # head room for the level labels
        ax.yaxis.set_major_formatter(FuncFormatter(plot_kit.short_number))
        if all(math.isnan(y) for y in ys):
            ax.text(0.5, 0.5, "not sampled", transform=ax.transAxes, ha="center", va="center", color=LEVEL_COLOR)
        for (label, _, _), start in zip(levels, starts, strict=True):
            if start > 0:
                ax.axvline(start, color=LEVEL_COLOR, linestyle=":", linewidth=1.6)
            if i < 2:  # the load of each level, once per column, along the top panels
                ax.text(start, 0.97, f" {label}", transform=ax.get_xaxis_transform(), va="top", fontsize=10)
        ax.set_xlim(0, max(offset, 1e-3))
    fig.supxlabel("seconds into the bench (levels end to end)", fontsize=13)
    fig.suptitle(f"Telemetry {run.id} · {title}", fontweight="bold")
    path = directory / f"{run.id}-telemetry.png"
    size = plot_kit.save(fig, path)
    panels = tuple(plot_kit.panel_info(ax) for ax in axes)
    return plot_kit.PlotInfo(path, "telemetry", title, panels, _alt(run, title), *size, ())


def _alt(run: RunRecord, title: str) -> str:
    """Per level: mean power, mean PCIe MB/s, peak KV usage, mean queue (what the picture shows, in words)."""
    bits = []
    for (label, _, _), level in zip(_timelines(run), run.levels, strict=True):
        tel = sub(level.get("telemetry"))
        total = sub(tel.get("total"))
        parts = []
        if (power := metric(sub(total.get("power_w")), "mean")) is not None:
            parts.append(f"{power:.0f} W")
        if (pcie := metric(sub(total.get("pcie_mbs")), "mean")) is not None:
            parts.append(f"{pcie:.0f} MB/s PCIe")
        if (kv := metric(tel, "kv_usage_peak")) is not None:
            parts.append(f"KV peak {100 * kv:.0f} %")
        if (queue := metric(tel, "queue_mean")) is not None:
            parts.append(f"queue {queue:.1f}")
        bits.append(f"{label}: " + (", ".join(parts) or "not sampled"))
    return f"GPU power, PCIe, KV-cache usage and queued requests over time, {run.id}, {title}. " + "; ".join(bits)


#: per-level figure of a sweep: (panel title, y label, the level telemetry's key, scale)
SWEEP_PANELS = (
    ("Energy per output token", "J/token", "j_per_tok", 1.0),
    ("PCIe bytes per output token", "bytes/token", "pcie_bytes_per_tok", 1.0),
    ("KV-cache usage, peak", "%", "kv_usage_peak", 100.0),
    ("Requests queued, mean", "requests", "queue_mean", 1.0),
)


def draw_sweep_telemetry(runs: Sequence[RunRecord], title: str, path: Path) -> plot_kit.PlotInfo | None:
    """One figure for a sweep's configs: J/token, PCIe bytes/token, peak KV usage and mean queue against load.

    A sweep compares configs, so its telemetry is drawn the way its throughput is (one line per config,
    load on the x axis) rather than one timeline per cell: which config moved fewer bytes per token is read
    at each load. None when no cell has telemetry.
    """
    drawn = [r for r in runs if r.levels and any(sub(lv.get("telemetry")) for lv in r.levels)]
    if not drawn:
        return None
    fig = Figure(figsize=(plot_kit.WIDTH_IN, plot_kit.HEIGHT_IN * 1.6), dpi=plot_kit.DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(2, 2).flat)
    open_loop = any(r.open_loop for r in drawn)
    handles = []
    for i, run in enumerate(drawn):
        label = run.legend_label
        for k, (ax, (_, _, key, scale)) in enumerate(zip(axes, SWEEP_PANELS, strict=True)):
            points = [
                (level_key(lv), scale * value)
                for lv in sorted(run.levels, key=level_key)
                if (value := metric(sub(lv.get("telemetry")), key)) is not None
            ]
            color, marker = plot_kit.PALETTE[i % len(plot_kit.PALETTE)], plot_kit.MARKERS[i % len(plot_kit.MARKERS)]
            (line,) = ax.plot([p[0] for p in points], [p[1] for p in points], color=color, marker=marker, label=label)
            if k == 0:
                handles.append(line)
    loads = [x for r in drawn for x in r.loads]
    for ax, (name, unit, _, _) in zip(axes, SWEEP_PANELS, strict=True):
        plot_kit.setup_x(ax, loads, open_loop=open_loop)
        ax.set_title(name)
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(plot_kit.short_number))
        if not any(len(line.get_xdata()) for line in ax.get_lines()):
            ax.text(0.5, 0.5, "not sampled", transform=ax.transAxes, ha="center", va="center", color=LEVEL_COLOR)
    fig.suptitle(f"Telemetry per config · {title}", fontweight="bold")
    plot_kit.add_legend(fig, handles)
    size = plot_kit.save(fig, path)
    panels = tuple(plot_kit.panel_info(ax) for ax in axes)
    return plot_kit.PlotInfo(path, "telemetry", title, panels, _sweep_alt(drawn, title), *size, ())


def _sweep_alt(runs: Sequence[RunRecord], title: str) -> str:
    bits = []
    for run in runs:
        figures = sub(run.extra.get("telemetry"))
        parts = []
        if (j := metric(figures, "j_per_tok")) is not None:
            parts.append(f"{j:.3f} J/token")
        if (b := metric(figures, "pcie_bytes_per_tok")) is not None:
            parts.append(f"{b:.0f} PCIe bytes/token")
        bits.append(f"{run.legend_label}: " + (", ".join(parts) or "no telemetry figures"))
    return f"Energy and PCIe bytes per output token, KV usage and queue vs load per config, {title}. " + "; ".join(bits)
