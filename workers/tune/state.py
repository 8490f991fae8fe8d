"""A tune's record in Redis: what was asked, where it stands, and every trial (the study's own log is apart).

One JSON value per tune (:func:`workers.keys.tune`) written only by the step that holds the host's lease
(one step runs at a time: the next is queued when one ends), so read-modify-write is safe. ``/tune
pause|resume`` and ``/cancel`` write only the control key (:func:`workers.keys.tune_control`), which the
step reads between trials: a cancel ends the tune after the current trial and keeps every result.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import redis

from workers import keys
from workers.errors import BenchbotError
from workers.json_value import JsonObject, JsonValue
from workers.redis_conn import text_client

#: Trial statuses, as the table shows them.
DONE, PRUNED, CRASHED, ACCURACY_DROP = "done", "pruned", "crashed", "accuracy drop"
#: Tune statuses.
RUNNING, QUEUED, PAUSED, CANCELLED, FINISHED, STOPPED = "running", "queued", "paused", "cancelled", "done", "stopped"
CONTROL_CANCEL, CONTROL_PAUSE = "cancel", "pause"


@dataclass(frozen=True)
class TrialRecord:
    """One trial as the table shows it: its config, what it measured, its status and why."""

    number: int
    config: str
    params: Mapping[str, str | int]
    status: str
    reason: str = ""
    run_id: str | None = None
    goodput_rps: float | None = None
    knee: float | None = None
    tokens_per_joule: float | None = None
    accuracy: float | None = None
    duration_s: float = 0.0
    optuna_number: int | None = None

    def to_dict(self) -> JsonObject:
        return {
            "number": self.number,
            "config": self.config,
            "params": dict(self.params),
            "status": self.status,
            "reason": self.reason,
            "run_id": self.run_id,
            "goodput_rps": self.goodput_rps,
            "knee": self.knee,
            "tokens_per_joule": self.tokens_per_joule,
            "accuracy": self.accuracy,
            "duration_s": self.duration_s,
            "optuna_number": self.optuna_number,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> TrialRecord:
        def num(key: str) -> float | None:
            value = data.get(key)
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

        params = data.get("params")
        return cls(
            number=int(str(data.get("number") or 0)),
            config=str(data.get("config") or ""),
            params={str(k): v if isinstance(v, int) else str(v) for k, v in (params or {}).items()}
            if isinstance(params, Mapping)
            else {},
            status=str(data.get("status") or ""),
            reason=str(data.get("reason") or ""),
            run_id=None if data.get("run_id") is None else str(data["run_id"]),
            goodput_rps=num("goodput_rps"),
            knee=num("knee"),
            tokens_per_joule=num("tokens_per_joule"),
            accuracy=num("accuracy"),
            duration_s=num("duration_s") or 0.0,
            optuna_number=None if data.get("optuna_number") is None else int(str(data["optuna_number"])),
        )


@dataclass(frozen=True)
class TuneRecord:
    """A tune: who asked what on which host, its status, its current step job and its trials."""

    id: str
    host: str
    user: str
    channel: str
    summary: str
    budget: int
    objective: str
    created_at: float
    deadline: float | None = None
    status: str = RUNNING
    current_job: str | None = None
    step: int = 1
    pruned: tuple[JsonObject, ...] = ()
    trials: tuple[TrialRecord, ...] = ()
    note: str = ""
    result: JsonObject = field(default_factory=dict)

    def to_dict(self) -> JsonObject:
        return {
            "schema": 1,
            "id": self.id,
            "host": self.host,
            "user": self.user,
            "channel": self.channel,
            "summary": self.summary,
            "budget": self.budget,
            "objective": self.objective,
            "created_at": self.created_at,
            "deadline": self.deadline,
            "status": self.status,
            "current_job": self.current_job,
            "step": self.step,
            "pruned": list(self.pruned),
            "trials": [t.to_dict() for t in self.trials],
            "note": self.note,
            "result": self.result,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> TuneRecord:
        trials = data.get("trials")
        pruned = data.get("pruned")
        deadline = data.get("deadline")
        result = data.get("result")
        return cls(
            id=str(data["id"]),
            host=str(data["host"]),
            user=str(data.get("user") or ""),
            channel=str(data.get("channel") or ""),
            summary=str(data.get("summary") or ""),
            budget=int(str(data.get("budget") or 0)),
            objective=str(data.get("objective") or "goodput"),
            created_at=float(str(data.get("created_at") or 0.0)),
            deadline=float(str(deadline)) if deadline is not None else None,
            status=str(data.get("status") or RUNNING),
            current_job=None if data.get("current_job") is None else str(data["current_job"]),
            step=int(str(data.get("step") or 1)),
            pruned=tuple(dict(p) for p in (pruned if isinstance(pruned, list) else ()) if isinstance(p, Mapping)),
            trials=tuple(
                TrialRecord.from_dict(t) for t in (trials if isinstance(trials, list) else ()) if isinstance(t, Mapping)
            ),
            note=str(data.get("note") or ""),
            result=dict(result) if isinstance(result, Mapping) else {},
        )

    @property
    def measured(self) -> tuple[TrialRecord, ...]:
        """Trials that cost a launch (every status but a skip)."""
        return self.trials

    def position_words(self) -> str:
        """``trial 3 of 6, queued (step job 41)``: for /queue and /status."""
        done = len(self.trials)
        return f"tune {self.id}: {done} of {self.budget} trials, {self.status}" + (
            f" (step job {self.current_job})" if self.current_job else ""
        )


def step_summary(tune_id: str, step: int, budget: int) -> str:
    """A step job's summary in /queue: ``tune 17: trial 3 of 6``."""
    return f"tune {tune_id}: trial {step} of {budget}"


def save(r: redis.Redis, record: TuneRecord) -> None:
    client = text_client(r)
    pipe = client.pipeline()
    pipe.set(keys.tune(record.id), json.dumps(record.to_dict(), default=str))
    pipe.zadd(keys.TUNES, {record.id: record.created_at}, nx=True)
    pipe.execute()


def load(r: redis.Redis, tune_id: str) -> TuneRecord | None:
    raw = text_client(r).get(keys.tune(tune_id))
    return TuneRecord.from_dict(json.loads(raw)) if raw else None


def require(r: redis.Redis, tune_id: str) -> TuneRecord:
    record = load(r, tune_id)
    if record is None:
        raise BenchbotError(f"there is no tune {tune_id}: /tune starts one")
    return record


def update(r: redis.Redis, record: TuneRecord, **changes: object) -> TuneRecord:
    new = replace(record, **changes)  # type: ignore[arg-type]
    save(r, new)
    return new


def set_control(r: redis.Redis, tune_id: str, what: str, by: str) -> None:
    text_client(r).set(keys.tune_control(tune_id), json.dumps({"what": what, "by": by, "at": time.time()}))


def clear_control(r: redis.Redis, tune_id: str) -> None:
    text_client(r).delete(keys.tune_control(tune_id))


def control(r: redis.Redis, tune_id: str) -> tuple[str, str] | None:
    """``(what, by)`` of a pending cancel or pause, or None."""
    raw = text_client(r).get(keys.tune_control(tune_id))
    if not raw:
        return None
    data: dict[str, JsonValue] = json.loads(raw)
    return str(data.get("what")), str(data.get("by") or "someone")


def recent(r: redis.Redis, n: int = 20) -> list[TuneRecord]:
    ids = text_client(r).zrevrange(keys.TUNES, 0, n - 1)
    return [rec for rec in (load(r, i) for i in ids) if rec is not None]
