"""The typed requests the grammar makes, and a command's table row (name, syntax, help, parser).

Kept apart from the parsers so the dispatcher and tests can name a request without the grammar, and so
each command family's module can declare its own :class:`CommandSpec` beside its parser.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from workers.benchmark.spec import BenchSpec
from workers.config import Config, FlagValue
from workers.evaluation.spec import EvalSpec


@dataclass(frozen=True)
class EngineConfigWords:
    """One engine configuration as typed: preset words and raw ``--flag value`` pairs."""

    presets: tuple[str, ...] = ()
    flags: tuple[tuple[str, FlagValue], ...] = ()

    @property
    def label(self) -> str:
        """How the person wrote it, normalised."""
        parts = list(self.presets) + [f if v is True else f"{f} {v}" for f, v in self.flags]
        return " ".join(parts) or "base"


@dataclass(frozen=True)
class LaunchRequest:
    """``/launch <presets> [--flag value ...] [on HOST] [then bench LEVELS ...] [then eval [TASK] [n=N]]``."""

    host: str
    config: EngineConfigWords
    then_bench: BenchSpec | None = None
    then_eval: EvalSpec | None = None
    command: str = "launch"


@dataclass(frozen=True)
class BenchRequest:
    """``/bench LEVELS [in=] [out=] [n=] [warmup=] [on HOST] [any]``."""

    host: str
    spec: BenchSpec
    any_config: bool = False
    command: str = "bench"


@dataclass(frozen=True)
class EvalRequest:
    """``/eval [TASK] [n=N] [seed=S] [on HOST] [any]``."""

    host: str
    spec: EvalSpec
    any_config: bool = False
    command: str = "eval"


@dataclass(frozen=True)
class StatusRequest:
    """``/status [HOST | GROUP]``: None means every host; a group's name means its members."""

    host: str | None
    command: str = "status"


@dataclass(frozen=True)
class QueueRequest:
    """``/queue [HOST | GROUP]``: None means every host; a group's name means its members."""

    host: str | None
    command: str = "queue"


@dataclass(frozen=True)
class CancelRequest:
    """``/cancel JOB``."""

    job_id: str
    command: str = "cancel"


@dataclass(frozen=True)
class StopRequest:
    """``/stop [HOST] [force]``: ``force`` is an admin's word (stop what benchbot did not start, unproven)."""

    host: str
    force: bool = False
    command: str = "stop"


@dataclass(frozen=True)
class RunsRequest:
    """``/runs [N] [filter]`` or ``/runs tag RUN TAG``."""

    limit: int = 10
    filter: str | None = None
    tag_run: str | None = None
    tag: str | None = None
    command: str = "runs"


@dataclass(frozen=True)
class CompareRequest:
    """``/compare RUN RUN ...``."""

    run_ids: tuple[str, ...]
    command: str = "compare"


@dataclass(frozen=True)
class SweepRequest:
    """``/sweep CONFIG, CONFIG, ... bench LEVELS [opts] [eval [TASK] [n=N]] [on HOST]``."""

    host: str
    configs: tuple[EngineConfigWords, ...]
    spec: BenchSpec
    eval: EvalSpec | None = None
    command: str = "sweep"


@dataclass(frozen=True)
class TuneRequest:
    """``/tune SPACE slo ... [objective=] [budget=N | time=D] [eval ...] [on HOST] [dry-run]``, or
    ``/tune resume|pause ID`` (``action``)."""

    host: str
    space: tuple[tuple[str, str], ...] = ()
    spec: BenchSpec | None = None
    objective: str = "goodput"
    budget: int | None = None
    time_s: float | None = None
    eval: EvalSpec | None = None
    dry_run: bool = False
    seed: int = 0
    action: str = "start"  # start | resume | pause
    tune_id: str | None = None
    command: str = "tune"


@dataclass(frozen=True)
class HelpRequest:
    """``/help [command]``."""

    topic: str | None = None
    command: str = "help"


Request = (
    LaunchRequest
    | BenchRequest
    | EvalRequest
    | StatusRequest
    | QueueRequest
    | CancelRequest
    | StopRequest
    | RunsRequest
    | CompareRequest
    | SweepRequest
    | TuneRequest
    | HelpRequest
)


@dataclass(frozen=True)
class ParseError:
    """A refusal: the message tells the person what was wrong and how to write it."""

    message: str
    command: str | None = None


@dataclass(frozen=True)
class CommandSpec:
    """A command's name, syntax, help and parser, side by side."""

    name: str
    syntax: str
    summary: str
    details: str
    action: str  # what access control checks: launch, bench, stop, sweep, cancel, read
    parser: Callable[[list[str], Config], Request]
    examples: tuple[str, ...] = field(default=())
