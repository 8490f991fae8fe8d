"""PNG plots of stored runs: throughput and latency vs load, overlays, sweep summaries, SLO searches, telemetry.

Which figures a run gets, and what is on them; how they look (Slack-thumbnail size, style, the read-back
:class:`~bot.plot_kit.PlotInfo`) is :mod:`bot.plot_kit`. Every title names host and engine version (a plot
without its config is the seed's mistake again). :func:`draw_for_result` is the one choice of which plots a
finished job has; it draws from the runs handed to it and never reads Redis.

The telemetry figure (issue 22 item 4) shows what the GPUs, the bus and the server did over a bench: GPU power
and PCIe rx+tx summed over the GPUs, the server's KV-cache usage and its queue, drawn from the per-level
timelines the worker stored (``workers/telemetry/summary.py``), so nothing is re-sampled and an old run draws the
same picture. Levels are laid end to end on one time axis, their boundaries dotted and labelled with the load:
a queue that builds only at c=64 is read off the picture at once. A sweep's telemetry is drawn the way its
throughput is (one line per config against load). A run without telemetry has no such figure.

Every ``draw_*`` function returns :class:`~bot.plot_kit.PlotInfo` objects describing what was actually drawn;
``plot_*`` are the thin ``list[Path]`` wrappers the front ends use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from bot.plot_kit import (
    BASELINE_COLOR,
    FAILED_COLOR,
    HEIGHT_IN,
    LOG_Y_RATIO,
    NOTE_COLOR,
    PlotInfo,
    add_legend,
    drawing_style,
    file_stem,
    floats,
    grid_figure,
    label_panel,
    legend_height,
    line_color,
    line_marker,
    new_figure,
    not_sampled,
    note_handles,
    output_dir,
    panel_info,
    save,
    setup_x,
    short_number,
)
from workers.engines import registry
from workers.results.record import RunRecord, level_key, load_label, metric, number, sub
from workers.results.store import ResultRuns

__all__ = ["BASELINE_COLOR", "PlotInfo", "draw_bench", "draw_compare", "draw_for_result", "draw_sweep"]


def _engine(run: RunRecord) -> str:
    engine = run.engine or str(run.config.get("engine") or registry.DEFAULT_KIND)  # old records: the default's
    return f"{engine} {run.engine_version}".strip() if run.engine_version else engine


def _title(runs: Sequence[RunRecord]) -> str:
    """``gpu-1 · sglang 0.5.6 · 1024→256 tok``: host(s), engine version(s), request shape."""
    hosts = list(dict.fromkeys(r.host for r in runs))
    named = list(dict.fromkeys(_engine(r) for r in runs))
    # a run without a version (a config that failed before its server said one) adds nothing where a run of
    # the same engine names it: "sglang 0.5.9", not "sglang 0.5.9 / sglang"
    engines = [e for e in named if " " in e or not any(other.startswith(e + " ") for other in named)]
    parts = [", ".join(hosts[:3]) + (" …" if len(hosts) > 3 else ""), " / ".join(engines[:3])]
    shapes = {(r.params.get("input_len"), r.params.get("output_len")) for r in runs}
    if len(shapes) == 1:
        (inp, out) = shapes.pop()
        if inp and out:
            parts.append(f"{inp}→{out} tok")
    return " · ".join(p for p in parts if p)


def _points(run: RunRecord, get: Callable[[Mapping[str, object]], float | None]) -> tuple[list[float], list[float]]:
    """(load, value) per level with a value: loads are concurrencies, or request rates (open loop)."""
    xs: list[float] = []
    ys: list[float] = []
    for level in sorted(run.levels, key=level_key):
        value = get(level)
        if value is not None:
            xs.append(level_key(level))
            ys.append(value)
    return xs, ys


def _failed_notes(runs: Sequence[RunRecord]) -> tuple[str, ...]:
    """``"r7 trtllm: failed (unsupported_gpu)"`` for each run that has nothing to draw."""
    bad = [r for r in runs if r.status == "failed" or not r.levels]
    return tuple(f"{r.id} {r.label}".strip() + f": failed ({r.failure_category or 'no data'})" for r in bad)


@dataclass(frozen=True)
class _Styled:
    """A run with how it is drawn: colour, marker, label, whether it is the baseline."""

    run: RunRecord
    color: str
    marker: str
    label: str
    baseline: bool = False


def _styled(runs: Sequence[RunRecord], baseline: RunRecord | None) -> list[_Styled]:
    out = [_Styled(r, line_color(i), line_marker(i), r.legend_label) for i, r in enumerate(runs)]
    if baseline is not None and all(baseline.id != r.id for r in runs):
        out.append(_Styled(baseline, BASELINE_COLOR, "o", f"baseline {baseline.legend_label}", True))
    return out


def _line_kwargs(s: _Styled, linestyle: str = "-") -> dict:
    hollow = not s.run.valid or s.run.status == "failed"
    return {
        "color": s.color,
        "marker": s.marker,
        "linestyle": "--" if s.baseline else linestyle,
        "linewidth": 2.2 if s.baseline else 2.8,
        "markerfacecolor": "white" if hollow else s.color,
        "markeredgewidth": 2.0,
        "alpha": 0.85 if s.baseline else 1.0,
        "zorder": 2 if s.baseline else 3,
    }


# ------------------------------------------------------------------------------------------ figures


def _throughput_figure(styled: list[_Styled], title: str, path: Path) -> PlotInfo:
    notes = _failed_notes([s.run for s in styled])
    entries = [s.label for s in styled if s.run.levels] + list(notes)
    fig, (ax_total, ax_user) = new_figure(legend_height(entries))
    handles = []
    for s in styled:
        xs, ys = _points(s.run, lambda lv: metric(lv, "output_tok_s"))
        if not xs:
            continue
        (h,) = ax_total.plot(xs, ys, label=s.label, **_line_kwargs(s))
        handles.append(h)
        ux, uy = _points(s.run, lambda lv: metric(lv, "per_user_tok_s"))
        ax_user.plot(ux, uy, label=s.label, **_line_kwargs(s))
    levels = [x for s in styled for x in s.run.loads]
    for ax, name in ((ax_total, "Output tok/s (all users)"), (ax_user, "Per-user tok/s")):
        setup_x(ax, levels, open_loop=any(s.run.open_loop for s in styled))
        label_panel(ax, name)
    ax_total.set_ylabel("tok/s")
    fig.suptitle(title, fontweight="bold")
    add_legend(fig, handles + note_handles(notes))
    size = save(fig, path)
    panels = (panel_info(ax_total), panel_info(ax_user))
    return PlotInfo(path, "throughput", title, panels, _throughput_alt(styled, title), *size, notes)


def _metric_getter(name: str, stat: str) -> Callable[[Mapping[str, object]], float | None]:
    return lambda level: metric(level, name, stat)


def _latency_figure(styled: list[_Styled], title: str, path: Path) -> PlotInfo:
    notes = _failed_notes([s.run for s in styled])
    entries = [s.label for s in styled if s.run.levels] + ["p50", "p99", *notes]
    fig, (ax_ttft, ax_itl) = new_figure(legend_height(entries))
    handles: list[Line2D] = []
    for s in styled:
        drawn = False
        for ax, name in ((ax_ttft, "ttft_ms"), (ax_itl, "itl_ms")):
            for stat, style in (("p50", "-"), ("p99", ":")):
                xs, ys = _points(s.run, _metric_getter(name, stat))
                if not xs:
                    continue
                kwargs = _line_kwargs(s, style)
                if s.baseline:
                    kwargs["linestyle"] = "--" if stat == "p50" else ":"
                ax.plot(xs, ys, label=f"{s.label} {stat}", **kwargs)
                drawn = True
        if drawn:
            handles.append(Line2D([], [], label=s.label, **_line_kwargs(s)))
    handles.append(Line2D([], [], color="black", linestyle="-", linewidth=2.8, label="p50"))
    handles.append(Line2D([], [], color="black", linestyle=":", linewidth=2.8, label="p99"))
    levels = [x for s in styled for x in s.run.loads]
    for ax, name in ((ax_ttft, "TTFT (ms)"), (ax_itl, "ITL (ms)")):
        setup_x(ax, levels, open_loop=any(s.run.open_loop for s in styled))
        ys = [y for line in ax.get_lines() for y in floats(line.get_ydata()) if y > 0]
        log_y = bool(ys) and max(ys) / min(ys) > LOG_Y_RATIO
        if log_y:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_minor_locator(NullLocator())
        label_panel(ax, name, from_zero=not log_y)
    ax_ttft.set_ylabel("ms")
    fig.suptitle(title, fontweight="bold")
    add_legend(fig, (handles if len(handles) > 2 else []) + note_handles(notes))
    size = save(fig, path)
    panels = (panel_info(ax_ttft), panel_info(ax_itl))
    return PlotInfo(path, "latency", title, panels, _latency_alt(styled, title), *size, notes)


def _peak_figure(styled: list[_Styled], title: str, path: Path) -> PlotInfo:
    """Horizontal bars of each config's best output tok/s; failed cells are labelled gaps."""

    def peak(s: _Styled) -> float:
        return s.run.best_output_tok_s or 0.0

    order = sorted(styled, key=lambda s: (s.run.status == "failed" or not s.run.levels, -peak(s)))
    height = max(HEIGHT_IN, 1.2 + 0.45 * len(order))
    fig, (ax,) = new_figure(height, panels=1)
    names = [f"{s.run.id} {s.run.label}".strip() for s in order]
    values = [peak(s) for s in order]
    bars = ax.barh(range(len(order)), values, color=[s.color for s in order], label="peak output tok/s")
    top = max(values, default=0.0) or 1.0
    for i, (s, bar) in enumerate(zip(order, bars, strict=True)):
        if s.run.status == "failed" or not s.run.levels:
            why = s.run.failure_category or "no data"
            ax.text(top * 0.01, i, f"{names[i]}: failed ({why})", va="center", fontsize=12,
                    color=FAILED_COLOR, style="italic")  # fmt: skip
            continue
        best = max(s.run.levels, key=lambda lv: metric(lv, "output_tok_s") or 0.0)
        text = f"{short_number(values[i])} @{best['concurrency']}"
        if not s.run.valid:
            bar.set_hatch("//")
            bar.set_facecolor("white")
            bar.set_edgecolor(s.color)
            bar.set_linewidth(2)
            text += " (invalid)"
        evaluated = s.run.accuracy
        if evaluated is not None:  # fast and right: the accuracy beside the speed, red when it dropped
            text += f" · {evaluated.short}"
        color = FAILED_COLOR if evaluated is not None and evaluated.flagged else "black"
        ax.text(values[i] + top * 0.01, i, text, va="center", fontsize=12, color=color)
    ax.set_yticks(range(len(order)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, top * (1.6 if any(s.run.accuracy for s in order) else 1.3))
    ax.set_xlabel("peak output tok/s (best concurrency)")
    ax.set_title("Peak throughput per config")
    ax.grid(axis="y", visible=False)
    ax.xaxis.set_major_formatter(FuncFormatter(short_number))
    fig.suptitle(title, fontweight="bold")
    size = save(fig, path)
    accs = [f" {s.run.accuracy.short}" if s.run.accuracy is not None else "" for s in order]
    alt = f"Peak output tok/s per config, {title}: " + "; ".join(
        f"{n} {'failed' if v == 0 else short_number(v)}{a}" for n, v, a in zip(names, values, accs, strict=True)
    )
    notes = _failed_notes([s.run for s in order])
    return PlotInfo(path, "peak", title, (panel_info(ax, names),), alt, *size, notes)


def _throughput_alt(styled: list[_Styled], title: str) -> str:
    bits = []
    for s in styled:
        best = s.run.best_output_tok_s
        if best is None:
            bits.append(f"{s.label}: no data")
            continue
        level = max(s.run.levels, key=lambda lv: metric(lv, "output_tok_s") or 0.0)
        bits.append(f"{s.label}: peak {best:,.0f} output tok/s at concurrency {level['concurrency']}")
    return f"Throughput vs concurrency, {title}. " + "; ".join(bits)


def _latency_alt(styled: list[_Styled], title: str) -> str:
    bits = []
    for s in styled:
        lows = [lv for lv in s.run.levels if lv.get("concurrency") == min(s.run.concurrencies, default=0)]
        if not lows:
            continue
        ttft, itl = metric(lows[0], "ttft_ms", "p50"), metric(lows[0], "itl_ms", "p50")
        if ttft is not None and itl is not None:
            bits.append(f"{s.label}: TTFT p50 {ttft:.0f} ms, ITL p50 {itl:.1f} ms at lowest concurrency")
    return f"TTFT and ITL (p50, p99) vs concurrency, {title}. " + "; ".join(bits)


def _slo_figure(run: RunRecord, title: str, path: Path) -> PlotInfo:
    """An SLO search: each limited p99 against load with its limit dashed, goodput beside it, the knee marked.

    Points come from the search itself (every measurement, a confirmation included), so a load that
    passed once and failed on a second look shows both.
    """
    search = sub(run.extra.get("slo"))
    raw_points = search.get("points")
    points = sorted(
        (sub(p) for p in (raw_points if isinstance(raw_points, list) else ())), key=lambda p: number(p["load"])
    )
    limits = {str(k): number(v) for k, v in sub(sub(search.get("slo")).get("limits_ms")).items()}
    knee = metric(search, "knee")
    open_loop = run.open_loop
    labels = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "E2E"}
    fig, (ax_p99, ax_good) = new_figure(legend_height([*limits, "limit", "knee"]))
    handles: list[Line2D] = []
    for i, (key, limit) in enumerate(limits.items()):
        measured = [(number(p["load"]), metric(sub(p.get("p99_ms")), key)) for p in points]
        xs = [load for load, p99 in measured if p99 is not None]
        ys = [p99 for _, p99 in measured if p99 is not None]
        (h,) = ax_p99.plot(xs, ys, color=line_color(i), marker=line_marker(i), label=f"p99 {labels.get(key, key)}")
        ax_p99.axhline(limit, color=line_color(i), linestyle="--", linewidth=1.6)
        handles.append(h)
    goodput = [(number(p["load"]), metric(p, "goodput_rps")) for p in points]
    gx = [load for load, good in goodput if good is not None]
    gy = [good for _, good in goodput if good is not None]
    ax_good.plot(gx, gy, color=line_color(len(limits)), marker="o", label="goodput")
    loads = [number(p["load"]) for p in points] or [1.0]
    for ax, name in ((ax_p99, "p99 latency vs its limit (ms)"), (ax_good, "Goodput (req/s meeting the SLO)")):
        setup_x(ax, loads, open_loop=open_loop)
        label_panel(ax, name)
        if knee is not None:
            ax.axvline(knee, color="black", linestyle=":", linewidth=2.0)
    handles.append(Line2D([], [], color="black", linestyle="--", linewidth=1.6, label="limit"))
    handles.append(Line2D([], [], color="black", linestyle=":", linewidth=2.0, label="knee"))
    fig.suptitle(title, fontweight="bold")
    add_legend(fig, handles)
    size = save(fig, path)
    panels = (panel_info(ax_p99), panel_info(ax_good))
    alt = f"SLO search, {title}. " + str(run.extra.get("slo_summary") or "")
    return PlotInfo(path, "slo", title, panels, alt, *size, ())


# ------------------------------------------------------------------------------------------ telemetry


#: timeline column -> (panel title, y label, scale applied to the stored value)
TIMELINE_PANELS = (
    (1, "GPU power (all GPUs)", "W", 1.0),
    (2, "PCIe rx+tx (all GPUs)", "MB/s", 1.0),
    (3, "KV-cache usage", "%", 100.0),
    (4, "Requests queued in the server", "requests", 1.0),
)


def _timeline_value(row: Sequence[object], column: int, scale: float) -> float:
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


def no_gpus(runs: Sequence[RunRecord]) -> bool:
    """True when every sampled level of ``runs`` ran on a host without GPUs (``gpus = 0``): its figures leave
    out the GPU panels instead of drawing them empty."""
    sampled = [sub(lv.get("telemetry")) for run in runs for lv in run.levels if sub(lv.get("telemetry"))]
    return bool(sampled) and all(tel.get("no_gpus") is True for tel in sampled)


def has_telemetry(run: RunRecord) -> bool:
    """True when some level's timeline holds at least one sampled value worth drawing."""
    return any(
        not math.isnan(_timeline_value(row, column, 1.0))
        for _, _, rows in _timelines(run)
        for row in rows
        for column, *_ in TIMELINE_PANELS
    )


def draw_telemetry(run: RunRecord, title: str, directory: Path) -> PlotInfo | None:
    """``<run-id>-telemetry.png``, or None when the run has no telemetry to show."""
    if not has_telemetry(run):
        return None
    levels = _timelines(run)
    shown = TIMELINE_PANELS[2:] if no_gpus([run]) else TIMELINE_PANELS
    fig, axes = grid_figure(HEIGHT_IN * (0.85 if len(shown) == 2 else 1.45), sharex=True, rows=len(shown) // 2)
    starts = []
    offset = 0.0
    for _, length, _ in levels:
        starts.append(offset)
        offset += length
    for i, (ax, (column, name, unit, scale)) in enumerate(zip(axes, shown, strict=True)):
        xs: list[float] = []
        ys: list[float] = []
        for (_, _, rows), start in zip(levels, starts, strict=True):
            for row in rows:
                xs.append(start + number(row[0]))
                ys.append(_timeline_value(row, column, scale))
            xs.append(math.nan)  # a break between levels: no line drawn across the gap
            ys.append(math.nan)
        ax.plot(xs, ys, color=line_color(i), label=name, marker="o", markersize=3)
        finite = [y for y in ys if not math.isnan(y)]
        ax.set_ylim(0, max(finite, default=0.0) * 1.3 or 1.0)  # head room for the level labels
        label_panel(ax, name, unit, from_zero=False)
        if not finite:
            not_sampled(ax)
        for (label, _, _), start in zip(levels, starts, strict=True):
            if start > 0:
                ax.axvline(start, color=NOTE_COLOR, linestyle=":", linewidth=1.6)
            if i < 2:  # the load of each level, once per column, along the top panels
                ax.text(start, 0.97, f" {label}", transform=ax.get_xaxis_transform(), va="top", fontsize=10)
        ax.set_xlim(0, max(offset, 1e-3))
    fig.supxlabel("seconds into the bench (levels end to end)", fontsize=13)
    fig.suptitle(f"Telemetry {run.id} · {title}", fontweight="bold")
    path = directory / f"{run.id}-telemetry.png"
    size = save(fig, path)
    panels = tuple(panel_info(ax) for ax in axes)
    return PlotInfo(path, "telemetry", title, panels, _telemetry_alt(run, title), *size, ())


def _telemetry_alt(run: RunRecord, title: str) -> str:
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
    what = (
        "KV-cache usage and queued requests"
        if no_gpus([run])
        else "GPU power, PCIe, KV-cache usage and queued requests"
    )
    return f"{what} over time, {run.id}, {title}. " + "; ".join(bits)


#: per-level figure of a sweep: (panel title, y label, the level telemetry's key, scale)
SWEEP_PANELS = (
    ("Energy per output token", "J/token", "j_per_tok", 1.0),
    ("PCIe bytes per output token", "bytes/token", "pcie_bytes_per_tok", 1.0),
    ("KV-cache usage, peak", "%", "kv_usage_peak", 100.0),
    ("Requests queued, mean", "requests", "queue_mean", 1.0),
)


def draw_sweep_telemetry(runs: Sequence[RunRecord], title: str, path: Path) -> PlotInfo | None:
    """One figure for a sweep's configs: J/token, PCIe bytes/token, peak KV usage and mean queue against load.

    A sweep compares configs, so its telemetry is drawn the way its throughput is (one line per config,
    load on the x axis) rather than one timeline per cell: which config moved fewer bytes per token is read
    at each load. None when no cell has telemetry.
    """
    drawn = [r for r in runs if r.levels and any(sub(lv.get("telemetry")) for lv in r.levels)]
    if not drawn:
        return None
    shown = SWEEP_PANELS[2:] if no_gpus(drawn) else SWEEP_PANELS
    fig, axes = grid_figure(HEIGHT_IN * (0.9 if len(shown) == 2 else 1.6), rows=len(shown) // 2)
    open_loop = any(r.open_loop for r in drawn)
    handles = []
    for i, run in enumerate(drawn):
        label = run.legend_label
        for k, (ax, (_, _, key, scale)) in enumerate(zip(axes, shown, strict=True)):
            points = [
                (level_key(lv), scale * value)
                for lv in sorted(run.levels, key=level_key)
                if (value := metric(sub(lv.get("telemetry")), key)) is not None
            ]
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            (line,) = ax.plot(xs, ys, color=line_color(i), marker=line_marker(i), label=label)
            if k == 0:
                handles.append(line)
    loads = [x for r in drawn for x in r.loads]
    for ax, (name, unit, _, _) in zip(axes, shown, strict=True):
        setup_x(ax, loads, open_loop=open_loop)
        label_panel(ax, name, unit)
        if not any(floats(line.get_xdata()) for line in ax.get_lines()):
            not_sampled(ax)
    fig.suptitle(f"Telemetry per config · {title}", fontweight="bold")
    add_legend(fig, handles)
    size = save(fig, path)
    panels = tuple(panel_info(ax) for ax in axes)
    return PlotInfo(path, "telemetry", title, panels, _sweep_telemetry_alt(drawn, title), *size, ())


def _sweep_telemetry_alt(runs: Sequence[RunRecord], title: str) -> str:
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


# ---------------------------------------------------------------------------------------- public API


def draw_bench(run: RunRecord, baseline: RunRecord | None = None, out_dir: str | Path | None = None) -> list[PlotInfo]:
    """Throughput and latency figures of one run, with the host's baseline dashed grey behind it."""
    directory = output_dir(out_dir)
    styled = _styled([run], baseline)
    title = _title([run])
    with drawing_style():
        figures = [
            _throughput_figure(styled, title, directory / f"{run.id}-throughput.png"),
            _latency_figure(styled, title, directory / f"{run.id}-latency.png"),
        ]
        if run.extra.get("slo"):
            figures.append(_slo_figure(run, title, directory / f"{run.id}-slo.png"))
        if (telemetry := draw_telemetry(run, title, directory)) is not None:
            figures.append(telemetry)
        return figures


def draw_compare(runs: Iterable[RunRecord], out_dir: str | Path | None = None) -> list[PlotInfo]:
    """The same two figures with any number of runs overlaid, each labelled ``"r3 nextn cudnn"``."""
    runs = list(runs)
    if not runs:
        raise ValueError("draw_compare needs at least one run")
    directory = output_dir(out_dir)
    styled = _styled(runs, None)
    title = _title(runs)
    stem = file_stem("compare", [r.id for r in runs])
    with drawing_style():
        return [
            _throughput_figure(styled, title, directory / f"{stem}-throughput.png"),
            _latency_figure(styled, title, directory / f"{stem}-latency.png"),
        ]


def draw_sweep(runs: Iterable[RunRecord], out_dir: str | Path | None = None) -> list[PlotInfo]:
    """Compare figures over the sweep's cells plus a peak-throughput bar per config (failures as gaps)."""
    runs = list(runs)
    if not runs:
        raise ValueError("draw_sweep needs at least one run")
    directory = output_dir(out_dir)
    sweep_ids = {r.sweep_id for r in runs if r.sweep_id}
    stem = sweep_ids.pop() if len(sweep_ids) == 1 else file_stem("sweep", [r.id for r in runs])
    styled = _styled(runs, None)
    title = _title(runs)
    with drawing_style():
        figures = [
            _throughput_figure(styled, title, directory / f"{stem}-throughput.png"),
            _latency_figure(styled, title, directory / f"{stem}-latency.png"),
            _peak_figure(styled, title, directory / f"{stem}-peak.png"),
        ]
        if (telemetry := draw_sweep_telemetry(runs, title, directory / f"{stem}-telemetry.png")) is not None:
            figures.append(telemetry)
        return figures


def plot_bench(run: RunRecord, baseline: RunRecord | None = None, out_dir: str | Path | None = None) -> list[Path]:
    """PNG paths of :func:`draw_bench` (``<run-id>-throughput.png``, ``<run-id>-latency.png``)."""
    return [info.path for info in draw_bench(run, baseline, out_dir)]


def plot_compare(runs: Iterable[RunRecord], out_dir: str | Path | None = None) -> list[Path]:
    """PNG paths of :func:`draw_compare` (``compare-r3-r4-throughput.png`` ...)."""
    return [info.path for info in draw_compare(runs, out_dir)]


def plot_sweep(runs: Iterable[RunRecord], out_dir: str | Path | None = None) -> list[Path]:
    """PNG paths of :func:`draw_sweep` (``<sweep-id>-throughput|latency|peak.png``)."""
    return [info.path for info in draw_sweep(runs, out_dir)]


def draw_for_result(runs: ResultRuns, out_dir: str | Path | None = None) -> list[PlotInfo]:
    """The plots of a finished job, drawn from the runs it names: the one choice of which plots a job has,
    shared by the Slack thread (:mod:`bot.job_threads`), ``follow`` (CLI) and the console.

    A sweep's cells get :func:`draw_sweep`; a bench's run gets :func:`draw_bench` against its host's
    baseline. An eval alone (no levels) and runs that could not be read get none.
    """
    if runs.sweep:
        return draw_sweep(runs.runs, out_dir) if runs.runs else []
    record = runs.run
    if record is None or not record.levels:  # an eval alone: its verdict is the result, no curve to draw
        return []
    return draw_bench(record, runs.baseline, out_dir)
