"""A finished tune's figures: goodput per trial with the incumbent's line, and (objective=both) the Pareto
front of goodput against output tokens per joule. Drawn from the tune's result alone (no run is read)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.lines import Line2D

from bot.plot_kit import (
    PlotInfo,
    add_legend,
    drawing_style,
    label_panel,
    legend_height,
    line_color,
    new_figure,
    output_dir,
    panel_info,
    save,
)
from workers.tune.outcome import TuneOutcome
from workers.tune.state import DONE, TrialRecord

STATUS_MARKERS = {"done": "o", "pruned": "v", "crashed": "x", "accuracy drop": "X"}


def draw_tune(outcome: TuneOutcome, out_dir: str | Path | None = None) -> list[PlotInfo]:
    """``tune-ID-goodput.png`` (and ``tune-ID-pareto.png`` when two objectives were searched: objective=both)."""
    trials = [TrialRecord.from_dict(t) for t in outcome.trials]
    if not trials:
        return []
    directory = output_dir(out_dir)
    with drawing_style():
        infos = [_goodput_figure(outcome.tune_id, trials, directory / f"tune-{outcome.tune_id}-goodput.png")]
        if "pareto" in outcome.extra:  # objective=both: the front is the answer, not one winner
            infos.append(_pareto_figure(outcome.tune_id, trials, directory / f"tune-{outcome.tune_id}-pareto.png"))
    return infos


def _goodput_figure(tune_id: str, trials: list[TrialRecord], path: Path) -> PlotInfo:
    labels = [*STATUS_MARKERS, "incumbent"]
    fig, (ax,) = new_figure(legend_height(labels), panels=1)
    handles: list[Line2D] = []
    for i, (status, marker) in enumerate(STATUS_MARKERS.items()):
        mine = [t for t in trials if t.status == status]
        if mine:
            (h,) = ax.plot(
                [t.number for t in mine],
                [t.goodput_rps or 0.0 for t in mine],
                linestyle="none",
                marker=marker,
                color=line_color(i),
                label=status,
            )
            handles.append(h)
    best, line = 0.0, []
    for t in trials:  # the incumbent: the best goodput of a trial that may win, so far
        if t.status == DONE and (t.goodput_rps or 0.0) > best:
            best = t.goodput_rps or 0.0
        line.append(best)
    (h,) = ax.step([t.number for t in trials], line, where="post", color="black", linestyle="--", label="incumbent")
    handles.append(h)
    ax.set_xlabel("trial")
    ax.set_xticks([t.number for t in trials])
    label_panel(ax, "Goodput at the SLO per trial (req/s)")
    fig.suptitle(f"tune {tune_id}", fontweight="bold")
    add_legend(fig, handles)
    size = save(fig, path)
    alt = f"tune {tune_id}: goodput of {len(trials)} trials; the incumbent reaches {best:.2f} req/s"
    return PlotInfo(path, "tune", f"tune {tune_id}", (panel_info(ax),), alt, *size, ())


def _pareto_figure(tune_id: str, trials: list[TrialRecord], path: Path) -> PlotInfo:
    from workers.tune.report import pareto_front

    fig, (ax,) = new_figure(legend_height(["trials", "Pareto front"]), panels=1)
    done = [t for t in trials if t.status == DONE]
    (a,) = ax.plot(
        [t.goodput_rps or 0.0 for t in done],
        [t.tokens_per_joule or 0.0 for t in done],
        linestyle="none",
        marker="o",
        color=line_color(0),
        label="trials",
    )
    front = sorted(pareto_front(trials), key=lambda t: t.goodput_rps or 0.0)
    (b,) = ax.plot(
        [t.goodput_rps or 0.0 for t in front],
        [t.tokens_per_joule or 0.0 for t in front],
        marker="D",
        color=line_color(1),
        label="Pareto front",
    )
    ax.set_xlabel("goodput at the SLO (req/s)")
    label_panel(ax, "Output tokens per joule")
    fig.suptitle(f"tune {tune_id}: goodput vs tokens per joule", fontweight="bold")
    add_legend(fig, [a, b])
    size = save(fig, path)
    alt = f"tune {tune_id}: {len(front)} configs on the Pareto front of goodput and tokens per joule"
    return PlotInfo(path, "pareto", f"tune {tune_id}", (panel_info(ax),), alt, *size, ())
