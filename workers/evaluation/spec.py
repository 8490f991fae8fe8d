"""What a person asked an eval to be: the task's name, how many questions, the seed.

Made at the edge (``/eval``, ``then eval``, a sweep's ``eval``), carried in a job payload as JSON, read
back by the worker, which resolves the name against its own ``[eval.tasks]`` (a payload names a task,
never a path). ``n=None`` means the worker's configured default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workers.evaluation.tasks import BUILTIN


@dataclass(frozen=True)
class EvalSpec:
    """``/eval [TASK] [n=N] [seed=S]``."""

    task: str = BUILTIN
    n: int | None = None
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "n": self.n, "seed": self.seed}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalSpec:
        n = data.get("n")
        return cls(
            task=str(data.get("task") or BUILTIN),
            n=None if n is None else int(n),
            seed=int(data.get("seed") or 0),
        )

    @property
    def label(self) -> str:
        """``builtin n=60`` (the seed only when not the default)."""
        text = self.task
        if self.n is not None:
            text += f" n={self.n}"
        if self.seed:
            text += f" seed={self.seed}"
        return text
