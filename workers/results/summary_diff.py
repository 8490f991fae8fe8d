"""What differs between two runs' config summaries, part by part, for ``/compare`` and a run's label.

A summary is comma-separated parts: words for what matters most (``no spec``, ``TP8``, ``eager``), then each
flag that differs from the engine's defaults (``--max-running-requests 8``). ``/compare``'s legend shows each
run's label or summary, so the words are there; but two runs whose labels are their preset words (``seqs8``,
``seqs4``) say nothing about the flag those words set, so ``/compare`` names each changed flag from the
summaries: ``--max-running-requests 8 -> 4``.
"""

from __future__ import annotations


def summary_parts(summary: str) -> list[str]:
    """``"vLLM no spec, TP1, --max-num-seqs 8"`` -> ``["vLLM no spec", "TP1", "--max-num-seqs 8"]``."""
    return [part.strip() for part in summary.split(",") if part.strip()]


def _flags(parts: list[str]) -> dict[str, str]:
    """The flag parts by flag name: ``{"--max-num-seqs": "--max-num-seqs 8"}``."""
    return {part.split(" ", 1)[0]: part for part in parts if part.startswith("--")}


def flag_changes(base: str, other: str) -> list[str]:
    """Each flag changed from summary ``base`` to ``other``: ``--max-num-seqs 8 -> 4``, ``default ->
    --enforce-eager``; [] when the two name the same flags."""
    fa, fb = _flags(summary_parts(base)), _flags(summary_parts(other))
    changes = []
    for name in [*fa, *(n for n in fb if n not in fa)]:
        was, now = fa.get(name), fb.get(name)
        if was == now:
            continue
        if was is not None and now is not None:
            changes.append(f"{was} -> {now.removeprefix(name).strip()}")
        else:
            changes.append(f"{was or 'default'} -> {now or 'default'}")
    return changes


def config_lines(runs: list[tuple[str, str, str]]) -> list[str]:
    """``/compare``'s config lines: the flags each run's config summary changes against the first run's.

    ``runs`` are ``(run id, config summary, engine kind or "")``, first run first; runs of another engine
    than the first's, or without a summary, are left out (their summaries do not share words).
    """
    if not runs or not runs[0][1]:
        return []
    base_id, base, base_kind = runs[0]
    lines = []
    for rid, summary, kind in runs[1:]:
        if summary and kind == base_kind and (changes := flag_changes(base, summary)):
            lines.append(f"config of {rid} vs {base_id}: " + "; ".join(changes))
    return lines
