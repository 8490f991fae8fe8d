"""The tune's words: the live line (trial k of N, incumbent, margin, ETA) and the trials table."""

from __future__ import annotations

from collections.abc import Sequence

from workers.tune.outcome import TuneOutcome
from workers.tune.state import DONE, TrialRecord


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def incumbent_of(trials: Sequence[TrialRecord]) -> TrialRecord | None:
    """The best trial that may win: done (not pruned, crashed or an accuracy drop), highest goodput."""
    done = [t for t in trials if t.status == DONE and t.goodput_rps is not None]
    return max(done, key=lambda t: (t.goodput_rps or 0.0, t.tokens_per_joule or 0.0)) if done else None


def live_line(trial: TrialRecord, trials: Sequence[TrialRecord], budget: int, eta_s: float | None) -> str:
    """``trial 3 of 6: moe=... done, 1.42 req/s; incumbent trial 2 (1.50 req/s, +5.6 % over the next); ETA 4 min``."""
    head = f"trial {trial.number} of {budget}: {trial.config}: {trial.status}"
    if trial.goodput_rps is not None:
        head += f", goodput {trial.goodput_rps:.2f} req/s at the SLO"
    if trial.reason and trial.status != DONE:
        head += f" ({trial.reason[:160]})"
    best = incumbent_of(trials)
    if best is not None:
        others = [t.goodput_rps or 0.0 for t in trials if t.status == DONE and t is not best]
        margin = ""
        if others and max(others) > 0:
            margin = f", {((best.goodput_rps or 0.0) / max(others) - 1) * 100:+.1f} % over the next best"
        head += f"; incumbent: trial {best.number} ({best.config}, {best.goodput_rps:.2f} req/s{margin})"
    if eta_s is not None:
        head += f"; ETA {max(1, round(eta_s / 60))} min"
    return head


def trials_table(trials: Sequence[TrialRecord]) -> str:
    """One row per trial: config, goodput at the SLO, J/token, accuracy, status, run."""
    rows = [("#", "config", "goodput req/s", "J/tok", "accuracy", "status", "run")]
    for t in trials:
        jpt = 1.0 / t.tokens_per_joule if t.tokens_per_joule else None
        rows.append(
            (
                str(t.number),
                t.config,
                _num(t.goodput_rps, ".2f"),
                _num(jpt, ".3f"),
                "-" if t.accuracy is None else f"{t.accuracy * 100:.1f} %",
                t.status,
                t.run_id or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def pareto_front(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """Done trials no other done trial beats on both goodput and tokens per joule."""
    done = [t for t in trials if t.status == DONE and t.goodput_rps is not None]

    def dominated(a: TrialRecord) -> bool:
        ga, ea = a.goodput_rps or 0.0, a.tokens_per_joule or 0.0
        return any(
            (b.goodput_rps or 0.0) >= ga
            and (b.tokens_per_joule or 0.0) >= ea
            and ((b.goodput_rps or 0.0) > ga or (b.tokens_per_joule or 0.0) > ea)
            for b in done
        )

    return sorted((t for t in done if not dominated(t)), key=lambda t: -(t.goodput_rps or 0.0))


def outcome_text(outcome: TuneOutcome) -> str:
    """A tune step's closing words; the last step's: the trials table, the pruned, the finalists, the winner."""
    lines = [outcome.message]
    if outcome.next_job is not None:
        return lines[0]
    if outcome.table:
        lines += ["", outcome.table]
    for trial in outcome.trials:
        if trial.get("status") != DONE and trial.get("reason"):
            lines.append(f"  trial {trial.get('number')} {trial.get('status')}: {str(trial.get('reason'))[:200]}")
    if outcome.pruned:
        lines.append(f"pruned before any launch: {len(outcome.pruned)} config(s)")
        lines += [f"  {p.get('config')}: {p.get('reason')}" for p in outcome.pruned[:10]]
    for c in outcome.confirmed:
        verdict = c.get("problem") or "confirmed"
        lines.append(f"finalist trial {c.get('trial')} ({c.get('config')}): {verdict}")
    winner = outcome.winner
    if winner:
        baseline = winner.get("baseline")
        lines += [
            f"WINNER: trial {winner.get('trial')}: {winner.get('config')}",
            f"  running config: {winner.get('running_config')}",
            f"  reproduce it: {winner.get('launch')}",
        ]
        if isinstance(baseline, dict):
            lines.append(f"  {baseline.get('text')}")
    return "\n".join(lines)
