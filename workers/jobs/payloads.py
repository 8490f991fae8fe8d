"""What a job carries: one frozen type per job kind, and the expectation a bench is stamped with.

The bot builds these (``bot/dispatch.py``), RQ carries them as JSON (:meth:`to_dict`, the only place
their dict shape is written), and the worker reads them back once (:func:`parse_payload`) before a job
body sees them. Their own module, apart from the queue and the runner, because both ends share them and
neither should know the other's internals. The JSON shape is schema 1 (the launch inside is a
``LaunchIntent``, whose own schema 1 carried a whole argv; :meth:`LaunchIntent.from_dict` reads both).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from workers.benchmark.spec import BenchSpec
from workers.errors import BenchbotError
from workers.evaluation.spec import EvalSpec
from workers.json_value import JsonValue
from workers.presets import LaunchIntent
from workers.tune.space import TuneSpace

SCHEMA = 1


class JobKind(StrEnum):
    """The kinds of job a queue carries (the RQ job's ``kind`` meta and the payload's ``kind``)."""

    LAUNCH = "launch"
    BENCH = "bench"
    STOP = "stop"
    SWEEP = "sweep"
    EVAL = "eval"
    TUNE = "tune"


class OutcomeKind(StrEnum):
    """The shapes of a finished job's result (``workers.jobs.outcomes``): a launch with a bench is its own."""

    LAUNCH = "launch"
    LAUNCH_BENCH = "launch+bench"
    BENCH = "bench"
    STOP = "stop"
    SWEEP = "sweep"
    EVAL = "eval"
    TUNE = "tune"


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class Expectation:
    """Which server a bench means to measure, fixed when it is asked for.

    Exactly one of: ``after_job`` (the server the requester's own queued launch will start),
    ``nothing_running`` (nothing ran when asked, so whatever runs later is not what they meant),
    ``fingerprint`` (+ ``instance_id``: the config that ran when asked; with ``pinned``, that very
    instance, because someone else's launch or stop was queued ahead and may replace it), or
    ``unknown`` (why nobody could tell which server was meant: the job refuses to measure anything,
    issue 25 item 6; ``any`` is the way to measure whatever runs). ``label`` says it in words.
    """

    after_job: str | None = None
    nothing_running: bool = False
    fingerprint: str | None = None
    instance_id: str | None = None
    label: str | None = None
    fresh: bool = False  # observed now (True) or taken from the last stored observation
    pinned: bool = False
    unknown: str | None = None

    def to_dict(self) -> dict[str, JsonValue]:
        """The stored shape: only the keys that say something, as the dispatcher always wrote them."""
        out: dict[str, JsonValue] = {}
        if self.after_job is not None:
            out["after_job"] = self.after_job
        if self.nothing_running:
            out["nothing_running"] = True
        if self.fingerprint is not None:
            out["fingerprint"] = self.fingerprint
            out["instance_id"] = self.instance_id
        if self.label is not None:
            out["label"] = self.label
        if self.fresh or self.nothing_running or self.fingerprint is not None:
            out["fresh"] = self.fresh
        if self.pinned:
            out["pinned"] = True
        if self.unknown is not None:
            out["unknown"] = self.unknown
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> Expectation | None:
        """Inverse of :meth:`to_dict`; None for an absent or empty expectation (measure what runs)."""
        if not data:
            return None
        return cls(
            after_job=_opt_str(data.get("after_job")),
            nothing_running=bool(data.get("nothing_running")),
            fingerprint=_opt_str(data.get("fingerprint")),
            instance_id=_opt_str(data.get("instance_id")),
            label=_opt_str(data.get("label")),
            fresh=bool(data.get("fresh")),
            pinned=bool(data.get("pinned")),
            unknown=_opt_str(data.get("unknown")),
        )


@dataclass(frozen=True)
class _Common:
    host: str
    user: str
    channel: str

    kind: ClassVar[JobKind]

    def _head(self) -> dict[str, JsonValue]:
        return {
            "schema": SCHEMA,
            "kind": self.kind.value,
            "host": self.host,
            "user": self.user,
            "channel": self.channel,
        }


@dataclass(frozen=True)
class LaunchPayload(_Common):
    """``/launch``: the intent (the worker compiles the argv) and, for ``then bench`` / ``then eval``, those."""

    launch: LaunchIntent
    bench: BenchSpec | None = None
    eval: EvalSpec | None = None
    kind: ClassVar[JobKind] = JobKind.LAUNCH

    @property
    def outcome_kind(self) -> OutcomeKind:
        return OutcomeKind.LAUNCH_BENCH if self.bench is not None else OutcomeKind.LAUNCH

    def to_dict(self) -> dict[str, JsonValue]:
        out = {**self._head(), "launch": self.launch.to_dict()}
        if self.bench is not None:
            out["bench"] = self.bench.to_dict()
        if self.eval is not None:
            out["eval"] = self.eval.to_dict()
        return out


@dataclass(frozen=True)
class BenchPayload(_Common):
    """``/bench``: the bench, and the server it is meant for (``any_config``: whatever runs)."""

    bench: BenchSpec
    any_config: bool = False
    expect: Expectation | None = None
    kind: ClassVar[JobKind] = JobKind.BENCH

    @property
    def outcome_kind(self) -> OutcomeKind:
        return OutcomeKind.BENCH

    def to_dict(self) -> dict[str, JsonValue]:
        return {
            **self._head(),
            "bench": self.bench.to_dict(),
            "any": self.any_config,
            "expect": self.expect.to_dict() if self.expect is not None else None,
        }


@dataclass(frozen=True)
class StopPayload(_Common):
    """``/stop``: stop whatever engine owns the port. ``force`` (``/stop HOST force``, an admin's word):
    stop an unmanaged engine even when it is not shown to be one (the worker checks the admin again)."""

    force: bool = False
    kind: ClassVar[JobKind] = JobKind.STOP

    @property
    def outcome_kind(self) -> OutcomeKind:
        return OutcomeKind.STOP

    def to_dict(self) -> dict[str, JsonValue]:
        return {**self._head(), "force": True} if self.force else self._head()


@dataclass(frozen=True)
class SweepPayload(_Common):
    """``/sweep``: launch + bench (+ ``eval``, when asked) per config under one lease."""

    configs: tuple[LaunchIntent, ...]
    bench: BenchSpec
    eval: EvalSpec | None = None
    kind: ClassVar[JobKind] = JobKind.SWEEP

    @property
    def outcome_kind(self) -> OutcomeKind:
        return OutcomeKind.SWEEP

    def to_dict(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {
            **self._head(),
            "configs": [c.to_dict() for c in self.configs],
            "bench": self.bench.to_dict(),
        }
        if self.eval is not None:
            out["eval"] = self.eval.to_dict()
        return out


@dataclass(frozen=True)
class EvalPayload(_Common):
    """``/eval``: the accuracy check, and the server it is meant for (``any_config``: whatever runs)."""

    eval: EvalSpec
    any_config: bool = False
    expect: Expectation | None = None
    kind: ClassVar[JobKind] = JobKind.EVAL

    @property
    def outcome_kind(self) -> OutcomeKind:
        return OutcomeKind.EVAL

    def to_dict(self) -> dict[str, JsonValue]:
        return {
            **self._head(),
            "eval": self.eval.to_dict(),
            "any": self.any_config,
            "expect": self.expect.to_dict() if self.expect is not None else None,
        }


@dataclass(frozen=True)
class TunePayload(_Common):
    """``/tune``: the space, the SLO search, objective, budget and eval; one trial per job (``step``), the
    next step queued at the back of the host's line (``tune_id``: the first step's job id)."""

    space: TuneSpace
    bench: BenchSpec
    objective: str = "goodput"
    budget: int = 12
    time_s: float | None = None
    eval: EvalSpec | None = None
    tune_id: str | None = None
    step: int = 1
    seed: int = 0
    kind: ClassVar[JobKind] = JobKind.TUNE

    @property
    def outcome_kind(self) -> OutcomeKind:
        return OutcomeKind.TUNE

    def to_dict(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {
            **self._head(),
            "space": self.space.to_dict(),
            "bench": self.bench.to_dict(),
            "objective": self.objective,
            "budget": self.budget,
            "time_s": self.time_s,
            "tune_id": self.tune_id,
            "step": self.step,
            "seed": self.seed,
        }
        if self.eval is not None:
            out["eval"] = self.eval.to_dict()
        return out


JobPayload = LaunchPayload | BenchPayload | StopPayload | SweepPayload | EvalPayload | TunePayload


def parse_payload(data: Mapping[str, object]) -> JobPayload:
    """The typed payload of a job from its JSON; a friendly error for a shape this benchbot cannot run."""
    if not isinstance(data, Mapping):
        raise BenchbotError("a job payload is not a JSON object")
    schema = data.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise BenchbotError(f"a job payload has schema {schema!r}; this benchbot reads schema {SCHEMA}")
    try:
        kind = JobKind(str(data.get("kind")))
    except ValueError:
        raise BenchbotError(f"a job payload has an unknown kind {data.get('kind')!r}") from None
    try:
        common = {
            "host": str(data["host"]),
            "user": str(data.get("user") or ""),
            "channel": str(data.get("channel") or ""),
        }
        evaluation = data.get("eval")
        eval_spec = EvalSpec.from_dict(_mapping(evaluation)) if evaluation else None
        if kind is JobKind.LAUNCH:
            bench = data.get("bench")
            return LaunchPayload(
                **common,
                launch=LaunchIntent.from_dict(_mapping(data["launch"])),
                bench=BenchSpec.from_dict(_mapping(bench)) if bench else None,
                eval=eval_spec,
            )
        if kind is JobKind.EVAL:
            expect = data.get("expect")
            return EvalPayload(
                **common,
                eval=EvalSpec.from_dict(_mapping(data["eval"])),
                any_config=bool(data.get("any")),
                expect=Expectation.from_dict(expect) if isinstance(expect, Mapping) else None,
            )
        if kind is JobKind.BENCH:
            any_config = bool(data.get("any"))
            expect = data.get("expect")
            return BenchPayload(
                **common,
                bench=BenchSpec.from_dict(_mapping(data["bench"])),
                any_config=any_config,
                expect=Expectation.from_dict(expect) if isinstance(expect, Mapping) else None,
            )
        if kind is JobKind.STOP:
            return StopPayload(**common, force=data.get("force") is True)
        if kind is JobKind.TUNE:
            time_s = data.get("time_s")
            return TunePayload(
                **common,
                space=TuneSpace.from_dict(_mapping(data["space"])),
                bench=BenchSpec.from_dict(_mapping(data["bench"])),
                objective=str(data.get("objective") or "goodput"),
                budget=int(str(data.get("budget") or 12)),
                time_s=float(str(time_s)) if time_s is not None else None,
                eval=eval_spec,
                tune_id=_opt_str(data.get("tune_id")),
                step=int(str(data.get("step") or 1)),
                seed=int(str(data.get("seed") or 0)),
            )
        raw_configs = data.get("configs")
        configs = raw_configs if isinstance(raw_configs, list) else []
        return SweepPayload(
            **common,
            configs=tuple(LaunchIntent.from_dict(_mapping(c)) for c in configs if isinstance(c, Mapping)),
            bench=BenchSpec.from_dict(_mapping(data["bench"])),
            eval=eval_spec,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BenchbotError(f"a {kind} job payload is malformed ({type(exc).__name__}: {exc})") from exc


def _mapping(value: object) -> dict:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return dict(value)
