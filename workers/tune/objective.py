"""What a trial is scored on: goodput at the SLO's knee, output tokens per joule there, or both."""

from __future__ import annotations

GOODPUT, TOKENS_PER_JOULE, BOTH = "goodput", "tokens_per_joule", "both"
OBJECTIVES = (GOODPUT, TOKENS_PER_JOULE, BOTH)


def directions(objective: str) -> list[str]:
    """Optuna's study directions: one objective is maximised, ``both`` is a two-objective study."""
    return ["maximize", "maximize"] if objective == BOTH else ["maximize"]


def values_for(objective: str, goodput: float, tokens_per_joule: float | None) -> list[float]:
    """The values told to the study for one completed trial (a missing J/token scores 0: no claim)."""
    tpj = tokens_per_joule or 0.0
    if objective == BOTH:
        return [goodput, tpj]
    return [tpj] if objective == TOKENS_PER_JOULE else [goodput]
