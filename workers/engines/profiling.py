"""A bounded engine profile: what to ask the server, and where its trace lands (issue 22.5).

Each engine exposes a torch-profiler capture over HTTP in its own words: SGLang's ``/start_profile`` takes
``num_steps`` and stops by itself; vLLM's exists only when the server was started with ``--profiler-config``
and takes ``max_iterations``. A driver turns "``steps`` forward steps, tagged ``profile_id``" into a
:class:`ProfileCall`; the bench job sends it around one level and then looks for the files. benchbot never
asks for an unbounded capture: a trace of a whole bench would be gigabytes on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

#: The most forward steps one profile may capture (a step's trace at TP8 is tens of MB).
MAX_PROFILE_STEPS = 100


@dataclass(frozen=True)
class ProfileCall:
    """The HTTP calls of one bounded capture and where the engine writes its trace files.

    ``stop_path`` is sent after the level, and on cancel: always (vLLM's session stays open until it), or,
    ``stops_itself``, to disarm a capture that stops by itself after ``steps`` but whose level ended first
    (SGLang: a capture left armed would profile the next teammate's bench and refuse their ``profile=``);
    there the engine's refusal means the steps were reached. ``trace_dir`` is the host directory the files
    appear in, ``file_prefix`` how their names start, None for either when the engine does not say (the
    reply then says where to look).
    """

    start_path: str
    start_body: dict[str, str | int | list[str]] = field(default_factory=dict)
    stop_path: str | None = None
    stops_itself: bool = False
    trace_dir: str | None = None
    file_prefix: str | None = None


@dataclass(frozen=True)
class TraceFile:
    """One trace file the capture left on the host."""

    path: str
    size_bytes: int


class TraceFileRecord(TypedDict):
    path: str
    size_bytes: int


class ProfileRecord(TypedDict):
    """``extra.profile`` of a stored run."""

    steps: int
    load: float
    trace_dir: str | None
    files: list[TraceFileRecord]
    total_bytes: int
    note: str


@dataclass(frozen=True)
class ProfileResult:
    """What one capture did: at which level, how many steps, which files (or why none)."""

    steps: int
    load: float
    trace_dir: str | None
    files: tuple[TraceFile, ...] = ()
    note: str = ""

    @property
    def total_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    def to_dict(self) -> ProfileRecord:
        """JSON shape stored with the run (``extra.profile``)."""
        return {
            "steps": self.steps,
            "load": self.load,
            "trace_dir": self.trace_dir,
            "files": [{"path": f.path, "size_bytes": f.size_bytes} for f in self.files],
            "total_bytes": self.total_bytes,
            "note": self.note,
        }
