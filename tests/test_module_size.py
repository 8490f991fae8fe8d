"""No module in bot/, workers/ or ops/ outside the simulator grows past 600 lines (CONTRIBUTING's style rule).

Small modules with one job each: a module over the ceiling is split along a real seam (one job per module),
never trimmed by squeezing lines. ``workers/sim`` stands in for whole engines and is exempt. Reads files only.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "workers", "ops")
EXEMPT = ("workers/sim/",)
MAX_LINES = 600


def _line_counts() -> dict[str, int]:
    counts: dict[str, int] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith(EXEMPT):
                counts[rel] = len(path.read_text(encoding="utf-8").splitlines())
    return counts


def test_no_module_outside_the_simulator_is_over_600_lines() -> None:
    counts = _line_counts()
    assert len(counts) > 50  # the packages were found (a wrong ROOT would pass vacuously)
    offenders = [f"{rel}: {n} lines" for rel, n in sorted(counts.items()) if n > MAX_LINES]
    assert offenders == [], f"over {MAX_LINES} lines, split along a real seam:\n" + "\n".join(offenders)
