"""What a job produced: its result (one frozen type per shape) and the data of its ``ready`` event.

The worker builds these; they become JSON only where they leave the process (the ``succeeded`` /
``ready`` event data and RQ's return value, via :meth:`to_dict`), and every reader (Slack header and
thread, ``say --wait``, plots, the CLI) reads them back through :func:`parse_outcome` /
:meth:`ReadyData.from_dict` instead of indexing the dict. Their own module because the worker writes
them and the bot reads them: one definition of the shape for both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from workers.engines.args import ArgDiff
from workers.errors import BenchbotError
from workers.jobs.payloads import OutcomeKind
from workers.json_value import JsonValue
from workers.observation import RunningConfig
from workers.tune.outcome import TuneOutcome

Diagnosis = Mapping[str, JsonValue]


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _diagnosis(value: object) -> dict[str, JsonValue] | None:
    return dict(value) if isinstance(value, Mapping) else None


def _diff_to_dict(diff: ArgDiff) -> dict[str, JsonValue]:
    return {"arg": diff.arg, "requested": diff.requested, "observed": diff.observed, "note": diff.note}


def _diff_from_dict(data: object) -> ArgDiff | None:
    if not isinstance(data, Mapping):
        return None
    return ArgDiff(
        arg=str(data.get("arg", "?")),
        requested=data.get("requested"),
        observed=data.get("observed"),
        note=str(data.get("note") or ""),
    )


def diffs_from(value: object) -> tuple[ArgDiff, ...]:
    """The ``diff`` list of a ready/launch result, typed (unreadable items are left out)."""
    items = value if isinstance(value, Sequence) and not isinstance(value, str) else ()
    return tuple(d for d in (_diff_from_dict(item) for item in items) if d is not None)


def _observation(value: object) -> RunningConfig | None:
    if not isinstance(value, Mapping):
        return None
    try:
        return RunningConfig.from_dict(value)
    except BenchbotError:
        return None


@dataclass(frozen=True)
class Stopped:
    """A server a job stopped: what it was (observed just before) and how it went (``SIGTERM``...)."""

    config: RunningConfig
    how: str

    def to_dict(self) -> dict[str, JsonValue]:
        return {"config": self.config.to_dict(), "how": self.how}

    @classmethod
    def from_dict(cls, data: object) -> Stopped | None:
        if not isinstance(data, Mapping):
            return None
        config = _observation(data.get("config"))
        return cls(config, str(data.get("how") or "")) if config is not None else None


@dataclass(frozen=True)
class BenchOutcome:
    """One measured bench: the stored run, whether its label holds, and its table."""

    run_id: str
    valid: bool = True
    invalid_reason: str | None = None
    table: str = ""
    kind: ClassVar[OutcomeKind] = OutcomeKind.BENCH

    def measured_dict(self) -> dict[str, JsonValue]:
        """The bench's own fields (as nested under a ``launch+bench`` result)."""
        return {"run_id": self.run_id, "valid": self.valid, "invalid_reason": self.invalid_reason, "table": self.table}

    def to_dict(self) -> dict[str, JsonValue]:
        return {"kind": self.kind.value, **self.measured_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> BenchOutcome:
        return cls(
            run_id=str(data.get("run_id") or ""),
            valid=data.get("valid", True) is not False,
            invalid_reason=_opt_str(data.get("invalid_reason")),
            table=str(data.get("table") or ""),
        )


@dataclass(frozen=True)
class WrongAnswer:
    """One question an eval got wrong: its id, why it was judged wrong, and the reply (clipped)."""

    id: str
    reason: str
    reply: str = ""

    def to_dict(self) -> dict[str, JsonValue]:
        return {"id": self.id, "reason": self.reason, "reply": self.reply}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> WrongAnswer:
        return cls(str(data.get("id") or ""), str(data.get("reason") or ""), str(data.get("reply") or ""))


@dataclass(frozen=True)
class EvalOutcome:
    """One accuracy check: the run it is stored with, the verdict line, and what went wrong first.

    ``summary`` is the line a person reads (``accuracy 96.0 % (baseline 96.5 %, difference within noise)``
    or ``ACCURACY DROP: ...``); ``flagged`` is the red flag; ``detail`` says how the verdict was reached.
    """

    run_id: str
    summary: str
    flagged: bool = False
    accuracy: str = ""
    detail: str = ""
    baseline_run: str | None = None
    valid: bool = True
    invalid_reason: str | None = None
    wrong: tuple[WrongAnswer, ...] = ()
    kind: ClassVar[OutcomeKind] = OutcomeKind.EVAL

    def measured_dict(self) -> dict[str, JsonValue]:
        """The eval's own fields (as nested under a launch or a sweep cell)."""
        return {
            "run_id": self.run_id,
            "summary": self.summary,
            "flagged": self.flagged,
            "accuracy": self.accuracy,
            "detail": self.detail,
            "baseline_run": self.baseline_run,
            "valid": self.valid,
            "invalid_reason": self.invalid_reason,
            "wrong": [w.to_dict() for w in self.wrong],
        }

    def to_dict(self) -> dict[str, JsonValue]:
        return {"kind": self.kind.value, **self.measured_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> EvalOutcome:
        wrong = data.get("wrong")
        return cls(
            run_id=str(data.get("run_id") or ""),
            summary=str(data.get("summary") or ""),
            flagged=data.get("flagged") is True,
            accuracy=str(data.get("accuracy") or ""),
            detail=str(data.get("detail") or ""),
            baseline_run=_opt_str(data.get("baseline_run")),
            valid=data.get("valid", True) is not False,
            invalid_reason=_opt_str(data.get("invalid_reason")),
            wrong=tuple(
                WrongAnswer.from_dict(w) for w in (wrong if isinstance(wrong, list) else ()) if isinstance(w, Mapping)
            ),
        )


def _eval_from(value: object) -> EvalOutcome | None:
    return EvalOutcome.from_dict(value) if isinstance(value, Mapping) else None


@dataclass(frozen=True)
class LaunchOutcome:
    """A verified launch (the observed config and how it differs from the ask), with its bench for ``then bench``."""

    config: RunningConfig
    diff: tuple[ArgDiff, ...] = ()
    bench: BenchOutcome | None = None
    eval: EvalOutcome | None = None  # ``then eval``: stored with the bench's run when there was one

    @property
    def kind(self) -> OutcomeKind:
        return OutcomeKind.LAUNCH_BENCH if self.bench is not None else OutcomeKind.LAUNCH

    @property
    def run_id(self) -> str | None:
        if self.bench is not None:
            return self.bench.run_id
        return self.eval.run_id if self.eval is not None else None

    def to_dict(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {
            "kind": self.kind.value,
            "config": self.config.to_dict(),
            "diff": [_diff_to_dict(d) for d in self.diff],
        }
        if self.bench is not None:
            out["bench"] = self.bench.measured_dict()
        if self.eval is not None:
            out["eval"] = self.eval.measured_dict()
        if self.run_id:
            out["run_id"] = self.run_id
        return out


@dataclass(frozen=True)
class StopOutcome:
    """``/stop``: what was stopped (None: the port was free) and the sentence that says so."""

    stopped: Stopped | None
    message: str
    kind: ClassVar[OutcomeKind] = OutcomeKind.STOP

    def to_dict(self) -> dict[str, JsonValue]:
        return {
            "kind": self.kind.value,
            "stopped": self.stopped.to_dict() if self.stopped is not None else None,
            "message": self.message,
        }


@dataclass(frozen=True)
class SweepCell:
    """One config of a sweep: measured (``ok``) or failed, with the run recorded either way."""

    label: str
    status: str  # "ok" | "failed"
    run_id: str | None = None
    valid: bool = True
    invalid_reason: str | None = None
    table: str = ""
    diagnosis: dict[str, JsonValue] | None = None
    message: str = ""
    eval: EvalOutcome | None = None  # the sweep's ``eval``, stored with the cell's run
    eval_error: str = ""  # an eval that could not run: a note on the cell, not a failed cell

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, JsonValue]:
        if self.ok:
            out: dict[str, JsonValue] = {
                "label": self.label,
                "status": self.status,
                "run_id": self.run_id,
                "valid": self.valid,
                "invalid_reason": self.invalid_reason,
                "table": self.table,
            }
            if self.eval is not None:
                out["eval"] = self.eval.measured_dict()
            if self.eval_error:
                out["eval_error"] = self.eval_error
            return out
        return {
            "label": self.label,
            "status": self.status,
            "run_id": self.run_id,
            "diagnosis": self.diagnosis,
            "message": self.message,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> SweepCell:
        return cls(
            label=str(data.get("label") or ""),
            status=str(data.get("status") or "failed"),
            run_id=_opt_str(data.get("run_id")),
            valid=data.get("valid", True) is not False,
            invalid_reason=_opt_str(data.get("invalid_reason")),
            table=str(data.get("table") or ""),
            diagnosis=_diagnosis(data.get("diagnosis")),
            message=str(data.get("message") or ""),
            eval=_eval_from(data.get("eval")),
            eval_error=str(data.get("eval_error") or ""),
        )


@dataclass(frozen=True)
class SweepOutcome:
    """``/sweep``: every cell, the runs it stored and their compare table."""

    sweep_id: str
    cells: tuple[SweepCell, ...]
    run_ids: tuple[str, ...]
    table: str = ""
    kind: ClassVar[OutcomeKind] = OutcomeKind.SWEEP

    def to_dict(self) -> dict[str, JsonValue]:
        return {
            "kind": self.kind.value,
            "sweep_id": self.sweep_id,
            "cells": [c.to_dict() for c in self.cells],
            "run_ids": list(self.run_ids),
            "table": self.table,
        }


Outcome = LaunchOutcome | BenchOutcome | StopOutcome | SweepOutcome | EvalOutcome | TuneOutcome


def parse_outcome(data: Mapping[str, object] | None) -> Outcome | None:
    """The typed result of a finished job from its JSON; None for a result of no known kind (a test job's)."""
    if not isinstance(data, Mapping):
        return None
    try:
        kind = OutcomeKind(str(data.get("kind")))
    except ValueError:
        return None
    if kind is OutcomeKind.BENCH:
        return BenchOutcome.from_dict(data)
    if kind is OutcomeKind.EVAL:
        return EvalOutcome.from_dict(data)
    if kind in (OutcomeKind.LAUNCH, OutcomeKind.LAUNCH_BENCH):
        config = _observation(data.get("config"))
        if config is None:
            return None
        bench = data.get("bench")
        if isinstance(bench, Mapping):
            bench_outcome: BenchOutcome | None = BenchOutcome.from_dict(bench)
        elif kind is OutcomeKind.LAUNCH_BENCH and data.get("run_id"):
            bench_outcome = BenchOutcome(run_id=str(data["run_id"]))
        else:
            bench_outcome = None
        return LaunchOutcome(
            config=config, diff=diffs_from(data.get("diff")), bench=bench_outcome, eval=_eval_from(data.get("eval"))
        )
    if kind is OutcomeKind.TUNE:
        return TuneOutcome.from_dict(data)
    if kind is OutcomeKind.STOP:
        return StopOutcome(stopped=Stopped.from_dict(data.get("stopped")), message=str(data.get("message") or ""))
    cells = data.get("cells")
    run_ids = data.get("run_ids")
    return SweepOutcome(
        sweep_id=str(data.get("sweep_id") or ""),
        cells=tuple(
            SweepCell.from_dict(c) for c in (cells if isinstance(cells, list) else ()) if isinstance(c, Mapping)
        ),
        run_ids=tuple(str(r) for r in (run_ids if isinstance(run_ids, list) else ())),
        table=str(data.get("table") or ""),
    )


def run_ids_of(outcome: Outcome | None) -> tuple[str, ...]:
    """Every stored run a result names (a bench's, a launch+bench's, a sweep's cells)."""
    if isinstance(outcome, SweepOutcome | TuneOutcome):
        return outcome.run_ids
    if isinstance(outcome, BenchOutcome | EvalOutcome):
        return (outcome.run_id,) if outcome.run_id else ()
    if isinstance(outcome, LaunchOutcome) and outcome.run_id:
        return (outcome.run_id,)
    return ()


@dataclass(frozen=True)
class ReadyData:
    """The ``ready`` event of a launch: the verified config, its diff, what it replaced, how it was checked."""

    config: RunningConfig
    diff: tuple[ArgDiff, ...] = ()
    replaced: Stopped | None = None
    launch: Mapping[str, JsonValue] | None = None  # the compiled LaunchSpec's JSON (label, flags, argv)
    smoke_text: str | None = None
    smoke_completion_tokens: int | None = None
    engine_version: str | None = None
    checked_against: str = "none"

    def to_dict(self) -> dict[str, JsonValue]:
        return {
            "config": self.config.to_dict(),
            "diff": [_diff_to_dict(d) for d in self.diff],
            "replaced": self.replaced.to_dict() if self.replaced is not None else None,
            "launch": dict(self.launch) if self.launch is not None else None,
            "smoke": {"text": self.smoke_text, "completion_tokens": self.smoke_completion_tokens},
            "engine": {"version": self.engine_version, "checked_against": self.checked_against},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ReadyData | None:
        """None when the event carries no readable config (an event of a test job, say)."""
        config = _observation(data.get("config"))
        if config is None:
            return None
        smoke = data.get("smoke")
        smoke_map = smoke if isinstance(smoke, Mapping) else {}
        engine = data.get("engine")
        engine_map = engine if isinstance(engine, Mapping) else {}
        launch = data.get("launch")
        tokens = smoke_map.get("completion_tokens")
        return cls(
            config=config,
            diff=diffs_from(data.get("diff")),
            replaced=Stopped.from_dict(data.get("replaced")),
            launch=dict(launch) if isinstance(launch, Mapping) else None,
            smoke_text=_opt_str(smoke_map.get("text")),
            smoke_completion_tokens=tokens if isinstance(tokens, int) else None,
            engine_version=_opt_str(engine_map.get("version")),
            checked_against=str(engine_map.get("checked_against") or "none"),
        )
