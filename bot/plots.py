"""PNG plots of stored runs: throughput and latency vs concurrency, overlays, sweep summaries.

Slack shows thread images as ~360 px thumbnails, so every figure is drawn for that: 1200x700 px at
150 dpi, big fonts, thick lines, one legend under the axes, the actual concurrency levels as ticks
on a log2 axis, and a title naming host and engine version (a plot without its config is the
seed's mistake again). Drawing uses the Agg canvas directly (no pyplot, no GUI, no global figure
state), so the bot can draw from any thread; output bytes are deterministic for the same input.

Every ``draw_*`` function returns :class:`PlotInfo` objects describing what was actually drawn,
read back from the matplotlib axes (labels, x and y data), so tests and alt texts check the
picture, not our intentions. ``plot_*`` are the thin ``list[Path]`` wrappers the front ends use.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # never a GUI backend, whoever imports us first

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from workers.jobs.outcomes import SweepOutcome, parse_outcome, run_ids_of
from workers.results import store

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType  # matplotlib >= 3.9; only for the type checker
from workers.results.record import RunRecord, level_key, metric

DPI = 150
WIDTH_IN = 8.0  # 1200 px
HEIGHT_IN = 700 / DPI  # 700 px
BASELINE_COLOR = "#8c8c8c"
FAILED_COLOR = "#b00020"
# tab10 without its grey (kept for the baseline), in a fixed order: run i always gets colour i.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#bcbd22", "#17becf",
)  # fmt: skip
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")
LOG_Y_RATIO = 20.0  # latency panels switch to a log y axis when max/min exceeds this
STYLE: dict[RcKeyType, Any] = {
    "font.size": 12,
    "axes.titlesize": 14,
    "axes.labelsize": 13,
    "xtick.labelsize": 12,
    "ytick.labelsize": 12,
    "legend.fontsize": 12,
    "figure.titlesize": 15,
    "axes.grid": True,
    "grid.alpha": 0.35,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 2.8,
    "lines.markersize": 8,
    "svg.hashsalt": "benchbot",
}
_STYLE_LOCK = threading.Lock()  # rc_context mutates global rcParams


# ----------------------------------------------------------------------------------------- what we drew


@dataclass(frozen=True)
class Series:
    """One line (or the bars) as drawn: its legend label, x and y data and line style."""

    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    linestyle: str = "-"
    color: str = ""


@dataclass(frozen=True)
class Panel:
    """One axes of a figure: its title, y scale, x ticks, the series on it and any text notes."""

    title: str
    ylabel: str
    yscale: str
    xticks: tuple[float, ...]
    series: tuple[Series, ...]
    notes: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()  # bar charts: the bar labels, in bar order

    def labels(self) -> list[str]:
        """Legend labels of the series on this panel."""
        return [s.label for s in self.series]

    def get(self, label: str) -> Series:
        """The series with exactly this label (KeyError lists the ones there are)."""
        for s in self.series:
            if s.label == label:
                return s
        raise KeyError(f"no series {label!r} on {self.title!r}; have {self.labels()}")


@dataclass(frozen=True)
class PlotInfo:
    """A written PNG and what is on it; ``alt_text`` is ready for a Slack image block."""

    path: Path
    kind: str  # "throughput" | "latency" | "peak"
    title: str
    panels: tuple[Panel, ...]
    alt_text: str
    width_px: int
    height_px: int
    notes: tuple[str, ...] = ()  # runs named but not drawn (failed, no data)

    def panel(self, title_part: str) -> Panel:
        """The first panel whose title contains ``title_part`` (case-insensitive)."""
        for p in self.panels:
            if title_part.lower() in p.title.lower():
                return p
        raise KeyError(f"no panel like {title_part!r}; have {[p.title for p in self.panels]}")


# -------------------------------------------------------------------------------------------- helpers


def _out_dir(out_dir: str | Path | None) -> Path:
    path = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="benchbot-plots-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _engine(run: RunRecord) -> str:
    engine = run.engine or str(run.config.get("engine") or "sglang")
    return f"{engine} {run.engine_version}".strip() if run.engine_version else engine


def _title(runs: Sequence[RunRecord]) -> str:
    """``gpu-1 · sglang 0.5.6 · 1024→256 tok``: host(s), engine version(s), request shape."""
    hosts = list(dict.fromkeys(r.host for r in runs))
    engines = list(dict.fromkeys(_engine(r) for r in runs))
    parts = [", ".join(hosts[:3]) + (" …" if len(hosts) > 3 else ""), " / ".join(engines[:3])]
    shapes = {(r.params.get("input_len"), r.params.get("output_len")) for r in runs}
    if len(shapes) == 1:
        (inp, out) = shapes.pop()
        if inp and out:
            parts.append(f"{inp}→{out} tok")
    return " · ".join(p for p in parts if p)


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _marker(i: int) -> str:
    return MARKERS[(i // len(PALETTE) + i) % len(MARKERS)]


def _points(run: RunRecord, get: Callable[[dict], float | None]) -> tuple[list[float], list[float]]:
    """(load, value) per level with a value: loads are concurrencies, or request rates (open loop)."""
    xs: list[float] = []
    ys: list[float] = []
    for level in sorted(run.levels, key=level_key):
        value = get(level)
        if value is not None:
            xs.append(level_key(level))
            ys.append(value)
    return xs, ys


def _setup_x(ax: Axes, levels: Sequence[float], open_loop: bool = False) -> None:
    """Log2 x axis whose ticks are exactly the measured levels (concurrencies, or request rates)."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(levels)) or [1]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    lo, hi = ticks[0], ticks[-1]
    ax.set_xlim(lo / 1.35, hi * 1.35)
    ax.set_xlabel("request rate (req/s)" if open_loop else "concurrency")


def _floats(data: Any) -> tuple[float, ...]:
    """A line's x or y data (matplotlib types it as any array-like) as plain floats."""
    return tuple(float(v) for v in data)


def _panel_info(ax: Axes, categories: Sequence[str] = ()) -> Panel:
    """Read back what is on the axes: the source of truth for tests and alt text."""
    series = []
    for line in ax.get_lines():
        label = str(line.get_label())
        if label.startswith("_"):
            continue
        series.append(
            Series(
                label=label,
                x=_floats(line.get_xdata()),
                y=_floats(line.get_ydata()),
                linestyle=str(line.get_linestyle()),
                color=str(line.get_color()),
            )
        )
    for container in ax.containers:
        widths = tuple(float(p.get_width()) for p in getattr(container, "patches", ()))
        series.append(Series(label=str(container.get_label()), x=tuple(range(len(widths))), y=widths))
    return Panel(
        title=ax.get_title(),
        ylabel=ax.get_ylabel(),
        yscale=ax.get_yscale(),
        xticks=tuple(float(t) for t in ax.get_xticks()) if not categories else (),
        series=tuple(series),
        notes=tuple(t.get_text() for t in ax.texts),
        categories=tuple(categories),
    )


def _new_figure(height_in: float = HEIGHT_IN, panels: int = 2) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    return fig, list(axes)


def _legend_columns(labels: Sequence[str]) -> int:
    """As many columns as fit 1200 px at 12 pt: long labels get fewer."""
    longest = max((len(label) for label in labels), default=0)
    ncol = 3 if longest <= 28 else 2 if longest <= 48 else 1
    return max(1, min(ncol, len(labels)))


def _legend(fig: Figure, handles: list[Line2D]) -> None:
    """One legend for the whole figure, under the axes, never on top of the data."""
    if not handles:
        return
    ncol = _legend_columns([str(h.get_label()) for h in handles])
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, frameon=False, handlelength=2.6)


def _legend_height(labels: Sequence[str]) -> float:
    """Figure height: 700 px, plus a strip per legend row beyond two so the axes keep their size."""
    rows = -(-len(labels) // _legend_columns(labels)) if labels else 0
    return HEIGHT_IN + max(0, rows - 2) * 0.3


def _save(fig: Figure, path: Path) -> tuple[int, int]:
    fig.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
    w, h = fig.canvas.get_width_height()
    return int(w), int(h)


def _file_stem(prefix: str, runs: Sequence[RunRecord]) -> str:
    ids = [r.id for r in runs]
    if len(ids) <= 6:
        return f"{prefix}-" + "-".join(ids)
    digest = hashlib.sha256(",".join(ids).encode()).hexdigest()[:8]
    return f"{prefix}-{ids[0]}-to-{ids[-1]}-{len(ids)}runs-{digest}"


def _failed_notes(runs: Sequence[RunRecord]) -> tuple[str, ...]:
    """``"r7 trtllm: failed (unsupported_gpu)"`` for each run that has nothing to draw."""
    bad = [r for r in runs if r.status == "failed" or not r.levels]
    return tuple(f"{r.id} {r.label}".strip() + f": failed ({r.failure_category or 'no data'})" for r in bad)


def _note_handles(notes: Sequence[str]) -> list[Line2D]:
    """Legend entries (a red cross, no line) so failed runs are named without covering any data."""
    return [Line2D([], [], linestyle="none", marker="x", color=FAILED_COLOR, markeredgewidth=3, label=n) for n in notes]


@dataclass(frozen=True)
class _Styled:
    """A run with how it is drawn: colour, marker, label, whether it is the baseline."""

    run: RunRecord
    color: str
    marker: str
    label: str
    baseline: bool = False


def _run_label(run: RunRecord) -> str:
    """``r3 nextn cudnn``, with its accuracy when it has an eval: ``r4 cutlass fp4-cutlass (acc 94.7 % DROP)``."""
    evaluated = run.accuracy
    return run.display_label + (f" ({evaluated.short})" if evaluated is not None else "")


def _styled(runs: Sequence[RunRecord], baseline: RunRecord | None) -> list[_Styled]:
    out = [_Styled(r, _color(i), _marker(i), _run_label(r)) for i, r in enumerate(runs)]
    if baseline is not None and all(baseline.id != r.id for r in runs):
        out.append(_Styled(baseline, BASELINE_COLOR, "o", f"baseline {_run_label(baseline)}", True))
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
    fig, (ax_total, ax_user) = _new_figure(_legend_height(entries))
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
        _setup_x(ax, levels, open_loop=any(s.run.open_loop for s in styled))
        ax.set_title(name)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(_short_number))
    ax_total.set_ylabel("tok/s")
    fig.suptitle(title, fontweight="bold")
    _legend(fig, handles + _note_handles(notes))
    size = _save(fig, path)
    panels = (_panel_info(ax_total), _panel_info(ax_user))
    return PlotInfo(path, "throughput", title, panels, _throughput_alt(styled, title), *size, notes)


def _metric_getter(name: str, stat: str) -> Callable[[dict], float | None]:
    return lambda level: metric(level, name, stat)


def _latency_figure(styled: list[_Styled], title: str, path: Path) -> PlotInfo:
    notes = _failed_notes([s.run for s in styled])
    entries = [s.label for s in styled if s.run.levels] + ["p50", "p99", *notes]
    fig, (ax_ttft, ax_itl) = _new_figure(_legend_height(entries))
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
        _setup_x(ax, levels, open_loop=any(s.run.open_loop for s in styled))
        ax.set_title(name)
        ys = [y for line in ax.get_lines() for y in _floats(line.get_ydata()) if y > 0]
        if ys and max(ys) / min(ys) > LOG_Y_RATIO:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_minor_locator(NullLocator())
        else:
            ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(_short_number))
    ax_ttft.set_ylabel("ms")
    fig.suptitle(title, fontweight="bold")
    _legend(fig, (handles if len(handles) > 2 else []) + _note_handles(notes))
    size = _save(fig, path)
    panels = (_panel_info(ax_ttft), _panel_info(ax_itl))
    return PlotInfo(path, "latency", title, panels, _latency_alt(styled, title), *size, notes)


def _peak_figure(styled: list[_Styled], title: str, path: Path) -> PlotInfo:
    """Horizontal bars of each config's best output tok/s; failed cells are labelled gaps."""

    def peak(s: _Styled) -> float:
        return s.run.best_output_tok_s or 0.0

    order = sorted(styled, key=lambda s: (s.run.status == "failed" or not s.run.levels, -peak(s)))
    height = max(HEIGHT_IN, 1.2 + 0.45 * len(order))
    fig, (ax,) = _new_figure(height, panels=1)
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
        text = f"{_short_number(values[i])} @{best['concurrency']}"
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
    ax.xaxis.set_major_formatter(FuncFormatter(_short_number))
    fig.suptitle(title, fontweight="bold")
    size = _save(fig, path)
    accs = [f" {s.run.accuracy.short}" if s.run.accuracy is not None else "" for s in order]
    alt = f"Peak output tok/s per config, {title}: " + "; ".join(
        f"{n} {'failed' if v == 0 else _short_number(v)}{a}" for n, v, a in zip(names, values, accs, strict=True)
    )
    notes = _failed_notes([s.run for s in order])
    return PlotInfo(path, "peak", title, (_panel_info(ax, names),), alt, *size, notes)


def _short_number(value: float, _pos: object = None) -> str:
    """Tick labels that stay short at thumbnail size: 12k, 3.5k, 850, 4.2."""
    if abs(value) >= 10000:
        return f"{value / 1000:.0f}k"
    if abs(value) >= 1000:
        return f"{value / 1000:.1f}".rstrip("0").rstrip(".") + "k"
    if abs(value) >= 10 or value == 0:
        return f"{value:.0f}"
    return f"{value:.2g}"


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
    search = run.extra.get("slo") or {}
    points = sorted(search.get("points") or [], key=lambda p: p["load"])
    limits = (search.get("slo") or {}).get("limits_ms") or {}
    knee = search.get("knee")
    open_loop = run.open_loop
    labels = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "E2E"}
    fig, (ax_p99, ax_good) = _new_figure(_legend_height([*limits, "limit", "knee"]))
    handles: list[Line2D] = []
    for i, (key, limit) in enumerate(limits.items()):
        xs = [p["load"] for p in points if (p.get("p99_ms") or {}).get(key) is not None]
        ys = [p["p99_ms"][key] for p in points if (p.get("p99_ms") or {}).get(key) is not None]
        (h,) = ax_p99.plot(xs, ys, color=_color(i), marker=_marker(i), label=f"p99 {labels.get(key, key)}")
        ax_p99.axhline(limit, color=_color(i), linestyle="--", linewidth=1.6)
        handles.append(h)
    gx = [p["load"] for p in points if p.get("goodput_rps") is not None]
    gy = [p["goodput_rps"] for p in points if p.get("goodput_rps") is not None]
    ax_good.plot(gx, gy, color=_color(len(limits)), marker="o", label="goodput")
    loads = [p["load"] for p in points] or [1]
    for ax, name in ((ax_p99, "p99 latency vs its limit (ms)"), (ax_good, "Goodput (req/s meeting the SLO)")):
        _setup_x(ax, loads, open_loop=open_loop)
        ax.set_title(name)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(_short_number))
        if knee is not None:
            ax.axvline(knee, color="black", linestyle=":", linewidth=2.0)
    handles.append(Line2D([], [], color="black", linestyle="--", linewidth=1.6, label="limit"))
    handles.append(Line2D([], [], color="black", linestyle=":", linewidth=2.0, label="knee"))
    fig.suptitle(title, fontweight="bold")
    _legend(fig, handles)
    size = _save(fig, path)
    panels = (_panel_info(ax_p99), _panel_info(ax_good))
    alt = f"SLO search, {title}. " + str(run.extra.get("slo_summary") or "")
    return PlotInfo(path, "slo", title, panels, alt, *size, ())


# ---------------------------------------------------------------------------------------- public API


def draw_bench(run: RunRecord, baseline: RunRecord | None = None, out_dir: str | Path | None = None) -> list[PlotInfo]:
    """Throughput and latency figures of one run, with the host's baseline dashed grey behind it."""
    directory = _out_dir(out_dir)
    styled = _styled([run], baseline)
    title = _title([run])
    with _STYLE_LOCK, rc_context(STYLE):
        figures = [
            _throughput_figure(styled, title, directory / f"{run.id}-throughput.png"),
            _latency_figure(styled, title, directory / f"{run.id}-latency.png"),
        ]
        if run.extra.get("slo"):
            figures.append(_slo_figure(run, title, directory / f"{run.id}-slo.png"))
        from bot.telemetry_plot import draw_telemetry  # it draws with this module's helpers

        if (telemetry := draw_telemetry(run, title, directory)) is not None:
            figures.append(telemetry)
        return figures


def draw_compare(runs: Iterable[RunRecord], out_dir: str | Path | None = None) -> list[PlotInfo]:
    """The same two figures with any number of runs overlaid, each labelled ``"r3 nextn cudnn"``."""
    runs = list(runs)
    if not runs:
        raise ValueError("draw_compare needs at least one run")
    directory = _out_dir(out_dir)
    styled = _styled(runs, None)
    title = _title(runs)
    stem = _file_stem("compare", runs)
    with _STYLE_LOCK, rc_context(STYLE):
        return [
            _throughput_figure(styled, title, directory / f"{stem}-throughput.png"),
            _latency_figure(styled, title, directory / f"{stem}-latency.png"),
        ]


def draw_sweep(runs: Iterable[RunRecord], out_dir: str | Path | None = None) -> list[PlotInfo]:
    """Compare figures over the sweep's cells plus a peak-throughput bar per config (failures as gaps)."""
    runs = list(runs)
    if not runs:
        raise ValueError("draw_sweep needs at least one run")
    directory = _out_dir(out_dir)
    sweep_ids = {r.sweep_id for r in runs if r.sweep_id}
    stem = sweep_ids.pop() if len(sweep_ids) == 1 else _file_stem("sweep", runs)
    styled = _styled(runs, None)
    title = _title(runs)
    with _STYLE_LOCK, rc_context(STYLE):
        figures = [
            _throughput_figure(styled, title, directory / f"{stem}-throughput.png"),
            _latency_figure(styled, title, directory / f"{stem}-latency.png"),
            _peak_figure(styled, title, directory / f"{stem}-peak.png"),
        ]
        from bot.telemetry_plot import draw_sweep_telemetry  # it draws with this module's helpers

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


def draw_for_result(r: Any, result: Mapping[str, Any], out_dir: str | Path | None = None) -> list[PlotInfo]:
    """The plots of a finished job, drawn from its stored runs: the one choice of which plots a job has,
    shared by the Slack notifier, ``follow`` (CLI) and the console.

    A sweep (``kind: sweep`` with ``run_ids``) gets :func:`draw_sweep`; a bench (``run_id``, also under
    ``bench`` for ``launch ... then bench``) gets :func:`draw_bench` against its host's baseline.
    Anything else has none. A run that cannot be read raises :class:`workers.errors.BenchbotError`.
    """
    outcome = parse_outcome(result)
    run_ids = run_ids_of(outcome)
    if isinstance(outcome, SweepOutcome) and run_ids:
        return draw_sweep(store.get_runs(r, list(run_ids)), out_dir)
    if run_ids:
        record = store.get_run(r, run_ids[0])
        if not record.levels:  # an eval alone: its verdict is the result, there is no curve to draw
            return []
        baseline = store.baseline_for(r, record.host)
        if baseline is not None and baseline.id == record.id:
            baseline = None
        return draw_bench(record, baseline, out_dir)
    return []


def plots_for_result(r: Any, result: Mapping[str, Any], out_dir: Path) -> list[str]:
    """PNG paths of :func:`draw_for_result`."""
    return [str(info.path) for info in draw_for_result(r, result, out_dir)]
