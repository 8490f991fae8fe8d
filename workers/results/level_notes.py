"""What a bench table says under its rows about how far its numbers can be trusted, each thing said once.

- **The client's timing** (``level["client"]``): a client over its CPU limit is the bottleneck at that level
  (said per level by the table); event-loop lag at a low CPU share is the box, not the client (the engine
  or something else shares its cores): said once for the run, with the timing error it bounds.
- **Bursty delivery** (``level["delivery"]``): chunks that carry several tokens each; said once, with
  the levels and their tokens per chunk.
- **A per-user rate above the aggregate** (``tok/s/user`` > ``out tok/s``): the decode rate after the
  first token; when TTFT is most of each request the server as a whole delivered less: marked per level,
  explained once.
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
    """One sentence naming the levels whose chunks carried several tokens each, and the likely reasons."""
    parts = []
    spec = late_reader = False  # speculative decoding emits several per step; a client kept off its core reads late
    for where, lv in levels:
        d = sub(lv.get("delivery"))
        if d.get("bursty"):
            per = sub(d.get("tokens_per_chunk"))
            parts.append(f"{where} {metric(per, 'p50') or 0:.0f}/{metric(per, 'p99') or 0:.0f}")
            spec = spec or (metric(lv, "spec_accept_length") or 0) > 1
            late_reader = late_reader or sub(lv.get("client")).get("cause") is not None
    if not parts:
        return None
    why = ["speculative decoding accepts several per step" if spec else "the server sent them together"]
    if late_reader:
        why.append("the client read late, see client timing")
    return (
        f"delivery is bursty (tokens per chunk p50/p99: {', '.join(parts)}): several tokens arrive at once "
        f"({'; or '.join(why)}); ITL spreads each chunk's gap over its tokens, a streaming user sees the chunks"
    )


def above_aggregate(level: Mapping[str, object]) -> bool:
    """Is the per-user rate above what the whole server delivered at this level?"""
    per_user, total = metric(level, "per_user_tok_s"), metric(level, "output_tok_s")
    return per_user is not None and total is not None and per_user > total


def per_user_note(levels: Sequence[tuple[str, Mapping[str, object]]]) -> str | None:
    """Why a per-user rate is above the aggregate, for every level where it is, in one sentence: it leaves
    TTFT out, and TTFT is that much of each request."""
    parts = []
    for where, level in levels:
        if not above_aggregate(level):
            continue
        share = metric(sub(level.get("delivery")), "ttft_share")
        ttft, e2e = metric(level, "ttft_ms", "mean"), metric(level, "e2e_ms", "mean")
        if share is None and ttft is not None and e2e:
            share = ttft / e2e
        why = f" (TTFT is {share * 100:.0f}% of each request)" if share is not None else ""
        parts.append(
            f"{where} {metric(level, 'per_user_tok_s') or 0:,.0f} against {metric(level, 'output_tok_s') or 0:,.0f}"
            f" tok/s for the whole server{why}"
        )
    if not parts:
        return None
    return f"tok/s/user{ABOVE_AGGREGATE} is each stream's rate after its first token, so it leaves TTFT out: " + (
        "; ".join(parts)
    )


def level_notes(levels: Sequence[tuple[str, Mapping[str, object]]]) -> list[str]:
    """Every note of the table, in order: per-level ones (server gaps), then run-wide ones."""
    notes: list[str] = []
    for where, lv in levels:
        notes.extend(gap_notes(where, lv))
    for note in (per_user_note(levels), bursty_note(levels), shared_cores_note(levels)):
        if note:
            notes.append(note)
    return notes


def server_cells(level: Mapping[str, object], fmt: Callable[[float | None], str]) -> list[str]:
    """``client/server`` means of TTFT and E2E for the table (``fmt`` formats ms; ``-`` where unknown)."""
    view = sub(level.get("server_view"))
    return [f"{fmt(metric(level, f'{k}_ms', 'mean'))}/{fmt(metric(view, f'{k}_ms'))}" for k in ("ttft", "e2e")]
