"""Durations as people type them in a command: ``500ms``, ``0.5s``, ``2m``, ``800us``.

One parser for the SLO limits (``ttft=500ms``) and the run length of an open-loop level
(``duration=60s``), so both accept the same spellings and fail with the same kind of message.
"""

from __future__ import annotations

import math
import re

from workers.errors import BenchbotError

#: Seconds per unit; ``µs`` is accepted too because phones and macOS type it.
UNITS_S = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>[a-zµ]*)")


def parse_duration_s(text: str, what: str, *, default_unit: str = "s") -> float:
    """``"500ms"`` -> 0.5 (seconds). A bare number is in ``default_unit``; the result is > 0 and finite.

    ``what`` names the option in the error (``"ttft="``), so the message says which word was wrong.
    """
    value = text.strip()
    match = _DURATION_RE.fullmatch(value)
    if not match:
        raise BenchbotError(f"{what}{text} is not a duration: write it like {what}500ms, {what}0.5s or {what}2m")
    unit = match["unit"] or default_unit
    if unit not in UNITS_S:
        raise BenchbotError(f'{what}{text}: unknown unit "{match["unit"]}" (use one of: us, ms, s, m, h)')
    seconds = float(match["number"]) * UNITS_S[unit]
    if not math.isfinite(seconds) or seconds <= 0:
        raise BenchbotError(f"{what}{text}: the duration must be more than zero")
    return seconds


def format_duration_ms(ms: float) -> str:
    """Milliseconds in the shortest honest form: ``500 ms``, ``1.5 s``, ``0.8 ms``."""
    if ms >= 1000:
        return f"{ms / 1000:g} s"
    return f"{ms:g} ms"
