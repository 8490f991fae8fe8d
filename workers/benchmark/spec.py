"""The typed shapes of what a person asked the workers to do, as carried in job payloads.

Made once at the edge (the grammar in ``bot/commands.py``), serialised into the RQ job as JSON
(schema 1), and read back by ``workers/jobs/runner.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 256


@dataclass(frozen=True)
class BenchSpec:
    """A benchmark request: concurrency levels and the shape of each request."""

    levels: tuple[int, ...]
    input_len: int = DEFAULT_INPUT_LEN
    output_len: int = DEFAULT_OUTPUT_LEN
    num_requests: int | None = None  # None: scales with the level (see workers/benchmark/client.py)
    warmup: int | None = None  # None: the load generator's default

    def to_dict(self) -> dict:
        """JSON shape (schema 1)."""
        data = asdict(self)
        data["levels"] = list(self.levels)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> BenchSpec:
        """Inverse of :meth:`to_dict`."""
        return cls(
            levels=tuple(int(x) for x in data["levels"]),
            input_len=int(data.get("input_len", DEFAULT_INPUT_LEN)),
            output_len=int(data.get("output_len", DEFAULT_OUTPUT_LEN)),
            num_requests=data.get("num_requests"),
            warmup=data.get("warmup"),
        )

    @property
    def label(self) -> str:
        """``1,8,32 in=1024 out=256``."""
        text = ",".join(str(x) for x in self.levels) + f" in={self.input_len} out={self.output_len}"
        if self.num_requests is not None:
            text += f" n={self.num_requests}"
        if self.warmup is not None:
            text += f" warmup={self.warmup}"
        return text
