"""How benchbot's plots look and what is on them: the figure kit every plot module draws with.

Slack shows thread images as ~360 px thumbnails, so every figure is drawn for that: 1200x700 px at
150 dpi, big fonts, thick lines, one legend under the axes, the actual load levels as ticks on a log2
axis. Drawing uses the Agg canvas directly (no pyplot, no GUI, no global figure state), so the bot can
draw from any thread; output bytes are deterministic for the same input.

What was drawn is read back from the matplotlib axes (:func:`panel_info`: labels, x and y data) into
:class:`PlotInfo`, so tests and alt texts check the picture, not our intentions. The figures themselves
(which runs, which metrics) are :mod:`bot.plots`.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
import threading
from collections.abc import Iterator, Sequence
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
from matplotlib.ticker import FuncFormatter, NullLocator

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType  # matplotlib >= 3.9; only for the type checker

DPI = 150
WIDTH_IN = 8.0  # 1200 px
HEIGHT_IN = 700 / DPI  # 700 px
BASELINE_COLOR = "#8c8c8c"
FAILED_COLOR = "#b00020"
NOTE_COLOR = "#555555"  # level boundaries and "not sampled"
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
STYLE_LOCK = threading.Lock()  # rc_context mutates global rcParams


@contextlib.contextmanager
def drawing_style() -> Iterator[None]:
    """Draw inside benchbot's style, one set of figures at a time (``rc_context`` changes global rcParams)."""
    with STYLE_LOCK, rc_context(STYLE):
        yield


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


def output_dir(out_dir: str | Path | None) -> Path:
    path = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="benchbot-plots-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def line_color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def line_marker(i: int) -> str:
    return MARKERS[(i // len(PALETTE) + i) % len(MARKERS)]


def setup_x(ax: Axes, levels: Sequence[float], open_loop: bool = False) -> None:
    """Log2 x axis whose ticks are exactly the measured levels (concurrencies, or request rates)."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(levels)) or [1]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    lo, hi = ticks[0], ticks[-1]
    ax.set_xlim(lo / 1.35, hi * 1.35)
    ax.set_xlabel("request rate (req/s)" if open_loop else "concurrency")


def floats(data: Any) -> tuple[float, ...]:
    """A line's x or y data (matplotlib types it as any array-like) as plain floats."""
    return tuple(float(v) for v in data)


def panel_info(ax: Axes, categories: Sequence[str] = ()) -> Panel:
    """Read back what is on the axes: the source of truth for tests and alt text."""
    series = []
    for line in ax.get_lines():
        label = str(line.get_label())
        if label.startswith("_"):
            continue
        series.append(
            Series(
                label=label,
                x=floats(line.get_xdata()),
                y=floats(line.get_ydata()),
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


def new_figure(height_in: float = HEIGHT_IN, panels: int = 2) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    return fig, list(axes)


def grid_figure(height_in: float, *, sharex: bool = False, rows: int = 2) -> tuple[Figure, list[Axes]]:
    """A ``rows`` x 2 figure (the telemetry's four panels; two on a host without GPUs), ``height_in`` tall."""
    fig = Figure(figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, list(fig.subplots(rows, 2, sharex=sharex, squeeze=False).flat)


def label_panel(ax: Axes, title: str, unit: str | None = None, *, from_zero: bool = True) -> None:
    """A panel's title and y unit, its y axis from zero (unless the caller scales it) and short tick labels."""
    ax.set_title(title)
    if unit:
        ax.set_ylabel(unit)
    if from_zero:
        ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(FuncFormatter(short_number))


def not_sampled(ax: Axes) -> None:
    """Say on an empty panel that nothing was sampled (an empty panel must not read as zero)."""
    ax.text(0.5, 0.5, "not sampled", transform=ax.transAxes, ha="center", va="center", color=NOTE_COLOR)


def legend_columns(labels: Sequence[str]) -> int:
    """As many columns as fit 1200 px at 12 pt: long labels get fewer."""
    longest = max((len(label) for label in labels), default=0)
    ncol = 3 if longest <= 28 else 2 if longest <= 48 else 1
    return max(1, min(ncol, len(labels)))


def add_legend(fig: Figure, handles: list[Line2D]) -> None:
    """One legend for the whole figure, under the axes, never on top of the data."""
    if not handles:
        return
    ncol = legend_columns([str(h.get_label()) for h in handles])
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, frameon=False, handlelength=2.6)


def legend_height(labels: Sequence[str]) -> float:
    """Figure height: 700 px, plus a strip per legend row beyond two so the axes keep their size."""
    rows = -(-len(labels) // legend_columns(labels)) if labels else 0
    return HEIGHT_IN + max(0, rows - 2) * 0.3


def save(fig: Figure, path: Path) -> tuple[int, int]:
    fig.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
    w, h = fig.canvas.get_width_height()
    return int(w), int(h)


def file_stem(prefix: str, ids: Sequence[str]) -> str:
    """``compare-r3-r4``; many runs: the first, the last, how many and a digest of them all."""
    if len(ids) <= 6:
        return f"{prefix}-" + "-".join(ids)
    digest = hashlib.sha256(",".join(ids).encode()).hexdigest()[:8]
    return f"{prefix}-{ids[0]}-to-{ids[-1]}-{len(ids)}runs-{digest}"


def note_handles(notes: Sequence[str]) -> list[Line2D]:
    """Legend entries (a red cross, no line) so failed runs are named without covering any data."""
    return [Line2D([], [], linestyle="none", marker="x", color=FAILED_COLOR, markeredgewidth=3, label=n) for n in notes]


def short_number(value: float, _pos: object = None) -> str:
    """Tick labels that stay short at thumbnail size: 12k, 3.5k, 850, 4.2."""
    if abs(value) >= 10000:
        return f"{value / 1000:.0f}k"
    if abs(value) >= 1000:
        return f"{value / 1000:.1f}".rstrip("0").rstrip(".") + "k"
    if abs(value) >= 10 or value == 0:
        return f"{value:.0f}"
    return f"{value:.2g}"
