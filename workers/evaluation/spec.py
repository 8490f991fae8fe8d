"""What a person asked an eval to be: the task's name, how many questions, the seed.

Made at the edge (``/eval``, ``then eval``, a sweep's ``eval``), carried in a job payload as JSON, read
back by the worker, which resolves the name against its own ``[eval.tasks]`` (a payload names a task,
never a path). ``n=None`` means the worker's configured default.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.evaluation.tasks import BUILTIN
from workers.json_value import JsonObject, RawJson


@dataclass(frozen=True)
class EvalSpec:
    """``/eval [TASK] [n=N] [seed=S]``."""

    task: str = BUILTIN
    n: int | None = None
    seed: int = 0

    def to_dict(self) -> JsonObject:
        return {"task": self.task, "n": self.n, "seed": self.seed}

    @classmethod
    def from_dict(cls, data: RawJson) -> EvalSpec:
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
