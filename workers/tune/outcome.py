"""What a tune step produced: ``continuing`` (the next step's job), ``paused``, ``cancelled`` or ``done``.

A step's ``succeeded`` result; the last one carries the trials table, what was pruned, the confirmed
finalists and the winner with its ``/launch`` line. ``next_job`` lets a follower (``benchbot say --wait``)
go on to the next step, so one command is followed to the tune's end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, cast

from workers.jobs.payloads import OutcomeKind
from workers.json_value import JsonObject, JsonValue

#: What the last step adds beside its fields (``to_dict`` writes them at the top level): why the tune
#: stopped, and for ``objective=both`` the Pareto front (its trials).
EXTRA_KEYS = ("why_stopped", "pareto")


@dataclass(frozen=True)
class TuneOutcome:
    tune_id: str
    status: str
    message: str
    next_job: str | None = None
    trials: tuple[JsonObject, ...] = ()
    pruned: tuple[JsonObject, ...] = ()
    confirmed: tuple[JsonObject, ...] = ()
    winner: JsonObject | None = None
    table: str = ""
    run_ids: tuple[str, ...] = ()
    extra: JsonObject = field(default_factory=dict)
    kind: ClassVar[OutcomeKind] = OutcomeKind.TUNE

    def to_dict(self) -> dict[str, JsonValue]:
        return {
            "kind": self.kind.value,
            "tune_id": self.tune_id,
            "status": self.status,
            "message": self.message,
            "next_job": self.next_job,
            "trials": list(self.trials),
            "pruned": list(self.pruned),
            "confirmed": list(self.confirmed),
            "winner": self.winner,
            "table": self.table,
            "run_ids": list(self.run_ids),
            **self.extra,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> TuneOutcome:
        def objects(key: str) -> tuple[JsonObject, ...]:
            value = data.get(key)
            return tuple(dict(v) for v in (value if isinstance(value, list) else ()) if isinstance(v, Mapping))

        winner = data.get("winner")
        run_ids = data.get("run_ids")
        return cls(
            tune_id=str(data.get("tune_id") or ""),
            status=str(data.get("status") or ""),
            message=str(data.get("message") or ""),
            next_job=None if data.get("next_job") is None else str(data["next_job"]),
            trials=objects("trials"),
            pruned=objects("pruned"),
            confirmed=objects("confirmed"),
            winner=dict(winner) if isinstance(winner, Mapping) else None,
            table=str(data.get("table") or ""),
            run_ids=tuple(str(r) for r in (run_ids if isinstance(run_ids, list) else ())),
            extra={k: cast(JsonValue, data[k]) for k in EXTRA_KEYS if k in data},
        )
