"""``[tune]``'s typed shape (validated in :mod:`workers.config.tune_section`): the knobs ``/tune`` may search."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

KNOB_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
#: A space bigger than this (after pruning) is refused: a grid nobody could run, or a typo in a range.
DEFAULT_MAX_CONFIGS = 512
KNOB_TYPES = ("int",)


@dataclass(frozen=True)
class TuneKnob:
    """One numeric engine flag ``/tune`` may search: ``NAME=LO..HI`` within ``[low, high]`` on ``step``."""

    name: str
    flag: str
    low: int
    high: int
    step: int = 1
    type: str = "int"
    engine: str | None = None  # the engine kind it belongs to (None: any)
    description: str = ""

    def points(self, low: int, high: int) -> tuple[int, ...]:
        """The values from ``low`` to ``high`` on this knob's step grid (anchored at its ``low``)."""
        first = self.low + -(-(low - self.low) // self.step) * self.step
        return tuple(range(first, high + 1, self.step))


@dataclass(frozen=True)
class TuneConfig:
    """``[tune]``: declared knobs by word, and the most configs one space may hold."""

    knobs: Mapping[str, TuneKnob] = field(default_factory=dict)
    max_configs: int = DEFAULT_MAX_CONFIGS
