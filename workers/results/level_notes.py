"""What a bench table says under its rows about how far its numbers can be trusted, each thing said once.

- **The client's timing** (``level["client"]``): a client over its CPU limit is the bottleneck at that level
  (said per level by the table); event-loop lag at a low CPU share is the box, not the client (the engine
  or something else shares its cores): said once for the run, with the timing error it bounds.
- **Bursty delivery** (``level["delivery"]``): chunks that carry several tokens each; said once, with
  the levels and their tokens per chunk.
- **A per-user rate above the aggregate** (``tok/s/user`` > ``out tok/s``): the decode rate after the
  first token; when TTFT is most of each request the server as a whole delivered less: said per level.
- **The server's view** (``level["server_view"]``, :mod:`workers.telemetry.server_latency`): client-vs-server
  gaps larger than noise, per level.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from workers.results.record import metric, sub
from workers.telemetry.server_latency import gap_notes

#: The table's mark on a per-user rate the whole server did not reach (the note under it says why).
ABOVE_AGGREGATE = "*"


def _levels_named(names: Sequence[str]) -> str:
    return ", ".join(names)


def shared_cores_note(levels: Sequence[tuple[str, Mapping[str, object]]]) -> str | None:
    """One sentence for every level whose client lagged at a low CPU share (``cause`` descheduled or lag)."""
    lagged = [(where, sub(lv.get("client"))) for where, lv in levels]
    lagged = [(where, c) for where, c in lagged if c.get("cause") in ("descheduled", "lag")]
    if not lagged:
        return None
    worst_lag = max(metric(c, "lag_p99_ms") or 0.0 for _, c in lagged)
    cpu = max(metric(c, "cpu_pct") or 0.0 for _, c in lagged)
    waits = [w for _, c in lagged if (w := metric(c, "run_delay_pct")) is not None]
    names = _levels_named([where for where, _ in lagged])
    if any(c.get("cause") == "descheduled" for _, c in lagged):
        why = (
            f"the client waited for a core up to {max(waits):.0f}% of the time at {cpu:.0f}% CPU or less: "
            "the engine (or something else) shares its cores"
        )
    else:
        why = f"the client used {cpu:.0f}% of a core or less, so this is not its own work"
    return (
        f"client timing ({names}): event-loop lag p99 up to {worst_lag:.0f} ms; {why}. Its timestamps may be "
        f"late by up to {worst_lag:.0f} ms (TTFT/ITL tails the most); tok/s and token counts are unaffected"
    )


def bursty_note(levels: Sequence[tuple[str, Mapping[str, object]]]) -> str | None:
    """One sentence naming the levels whose chunks carried several tokens each."""
    parts = []
    late_reader = False  # a client kept off its core reads several chunks' worth at once, too
    for where, lv in levels:
        d = sub(lv.get("delivery"))
        if d.get("bursty"):
            per = sub(d.get("tokens_per_chunk"))
            parts.append(f"{where} {metric(per, 'p50') or 0:.0f}/{metric(per, 'p99') or 0:.0f}")
            late_reader = late_reader or sub(lv.get("client")).get("cause") is not None
    if not parts:
        return None
    who = (
        "the server sent them together, or the client read late (see client timing)"
        if late_reader
        else ("the server sends them together")
    )
    return (
        f"delivery is bursty (tokens per chunk p50/p99: {', '.join(parts)}): several tokens arrive at once ({who}); "
        "ITL spreads each chunk's gap over its tokens, a streaming user sees the chunks"
    )


def above_aggregate(level: Mapping[str, object]) -> bool:
    """Is the per-user rate above what the whole server delivered at this level?"""
    per_user, total = metric(level, "per_user_tok_s"), metric(level, "output_tok_s")
    return per_user is not None and total is not None and per_user > total


def per_user_note(where: str, level: Mapping[str, object]) -> str | None:
    """Why a per-user rate is above the aggregate: it leaves TTFT out, and TTFT is that much of each request."""
    if not above_aggregate(level):
        return None
    share = metric(sub(level.get("delivery")), "ttft_share")
    ttft = metric(level, "ttft_ms", "mean")
    if share is None and ttft is not None and (e2e := metric(level, "e2e_ms", "mean")):
        share = ttft / e2e
    lead = f"TTFT is {share * 100:.0f}% of each request" if share is not None else "it leaves each TTFT out"
    return (
        f"{where}: {ABOVE_AGGREGATE} tok/s/user {metric(level, 'per_user_tok_s') or 0:,.0f} is each stream's rate "
        f"after its first token; {lead}, so the server as a whole delivered {metric(level, 'output_tok_s') or 0:,.0f}"
        " tok/s"
    )


def level_notes(levels: Sequence[tuple[str, Mapping[str, object]]]) -> list[str]:
    """Every note of the table, in order: per-level ones (per-user rate, server gaps), then run-wide ones."""
    notes: list[str] = []
    for where, lv in levels:
        if note := per_user_note(where, lv):
            notes.append(note)
        notes.extend(gap_notes(where, lv))
    for note in (bursty_note(levels), shared_cores_note(levels)):
        if note:
            notes.append(note)
    return notes


def server_cells(level: Mapping[str, object], fmt: Callable[[float | None], str]) -> list[str]:
    """``client/server`` means of TTFT and E2E for the table (``fmt`` formats ms; ``-`` where unknown)."""
    view = sub(level.get("server_view"))
    return [f"{fmt(metric(level, f'{k}_ms', 'mean'))}/{fmt(metric(view, f'{k}_ms'))}" for k in ("ttft", "e2e")]
