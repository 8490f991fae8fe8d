"""A run record: one benchmark result (or one cell of a sweep) as stored, validated on load.

A run record is the unit of truth that Slack threads, ``/runs``, ``/compare``, plots and exports
are all drawn from, so it carries the configuration *observed* before and after the run (never the
one we assumed) and says whether the result is valid. Records are versioned (``"schema": 1``) and
validated on load, so a corrupt or future record fails with a clear message instead of a stack trace.
Where records live: :mod:`workers.results.store`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from workers.errors import BenchbotError

SCHEMA = 1
KINDS = ("bench", "sweep-cell", "eval")
STATUSES = ("ok", "failed")

RUN_ID_RE = re.compile(r"^r[1-9][0-9]*$")
TAG_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")


#: A JSON object of a stored record (an observation, a level's metrics, a diagnosis, an eval): kept as it was
#: stored, so history written by an older or newer benchbot still loads; read through the accessors below.
JsonObject = dict[str, object]
#: The same, as a record's field holds it: read-only, so any JSON object (``workers.json_value.JsonObject`` too) fits.
StoredObject = Mapping[str, object]


def number(value: object) -> float:
    """A stored number as a float (a numeric string too, as ``float()`` reads it); anything else is a TypeError."""
    if isinstance(value, int | float | str):
        return float(value)
    raise TypeError(f"{value!r} is not a number")


def whole(value: object) -> int:
    """A stored count as an int (a numeric string too, as ``int()`` reads it); anything else is a TypeError."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"{value!r} is not a count")


def sub(value: object) -> Mapping[str, object]:
    """A nested object of a stored record (``level["telemetry"]``...); empty when absent or not an object."""
    return value if isinstance(value, Mapping) else {}


def level_key(level: Mapping[str, object]) -> float:
    """A level's load: its request rate when it was an open loop, else its concurrency."""
    rate = level.get("rate")
    return number(rate) if rate is not None else number(level.get("concurrency") or 0)


def load_label(load: float, open_loop: bool) -> str:
    """``8`` for a concurrency, ``2.5/s`` for a rate."""
    return f"{load:g}/s" if open_loop else f"{load:g}"


@dataclass(frozen=True)
class RunRecord:
    """One benchmark run (or one cell of a sweep), as stored.

    ``config``/``config_after`` are ``RunningConfig.to_dict()`` observations and ``levels`` are
    ``LevelMetrics.to_dict()`` dicts; they stay plain dicts here so that history written by an
    older or newer metrics module still loads (unknown keys are kept, missing optional ones are
    tolerated by the accessors below).
    """

    id: str
    job_id: str | None
    user: str
    host: str
    created_at: float
    label: str = ""
    tags: tuple[str, ...] = ()
    kind: str = "bench"
    sweep_id: str | None = None
    config: StoredObject = field(default_factory=dict)
    config_after: StoredObject | None = None
    valid: bool = True
    invalid_reason: str | None = None
    params: StoredObject = field(default_factory=dict)
    levels: tuple[StoredObject, ...] = ()
    status: str = "ok"
    diagnosis: StoredObject | None = None
    extra: StoredObject = field(default_factory=dict)
    #: The accuracy check run on the same server (``/eval``, ``then eval``, a sweep's ``eval``): task,
    #: n, accuracy, CI, the baseline it was compared with and the verdict (see :class:`EvalSummary`).
    #: Optional and additive: a record without one is a speed-only run. Per-item results live apart
    #: (``workers.results.store.save_eval_items``) so listings stay small.
    eval: StoredObject | None = None
    schema: int = SCHEMA

    # -- serialisation ------------------------------------------------------------------------

    def to_dict(self) -> JsonObject:
        """The JSON-able schema-1 dict (unknown top-level keys read earlier are written back)."""
        out: JsonObject = dict(self.extra)
        out.update(
            {
                "schema": self.schema,
                "id": self.id,
                "job_id": self.job_id,
                "user": self.user,
                "host": self.host,
                "created_at": self.created_at,
                "label": self.label,
                "tags": list(self.tags),
                "kind": self.kind,
                "sweep_id": self.sweep_id,
                "config": self.config,
                "config_after": self.config_after,
                "valid": self.valid,
                "invalid_reason": self.invalid_reason,
                "params": self.params,
                "levels": list(self.levels),
                "status": self.status,
                "diagnosis": self.diagnosis,
            }
        )
        if self.eval is not None:
            out["eval"] = self.eval
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RunRecord:
        """Validate and build a record; a bad one raises a :class:`BenchbotError` naming the problem."""
        if not isinstance(data, Mapping):
            raise BenchbotError("a run record must be a JSON object")
        rid = data.get("id")
        name = f"run {rid}" if isinstance(rid, str) and rid else "a run record"

        def bad(why: str) -> BenchbotError:
            return BenchbotError(f"{name} is malformed: {why}")

        schema = data.get("schema")
        if schema != SCHEMA:
            raise BenchbotError(f"{name} has schema {schema!r}; this benchbot reads schema {SCHEMA}")
        if not isinstance(rid, str) or not RUN_ID_RE.match(rid):
            raise bad(f"id {rid!r} is not like r12")
        for key in ("user", "host"):
            if not isinstance(data.get(key), str) or not data.get(key):
                raise bad(f"{key} must be a non-empty string")
        created = data.get("created_at")
        if isinstance(created, bool) or not isinstance(created, int | float) or not math.isfinite(created):
            raise bad("created_at must be a unix timestamp")
        kind = data.get("kind", "bench")
        if kind not in KINDS:
            raise bad(f"kind {kind!r} is not one of {', '.join(KINDS)}")
        status = data.get("status", "ok")
        if status not in STATUSES:
            raise bad(f"status {status!r} is not one of {', '.join(STATUSES)}")
        tags = data.get("tags") or []
        if not isinstance(tags, list | tuple) or not all(isinstance(t, str) and TAG_RE.match(t) for t in tags):
            raise bad("tags must be a list of short lowercase words")
        levels = data.get("levels") or []
        if not isinstance(levels, list | tuple):
            raise bad("levels must be a list")
        for i, level in enumerate(levels):
            if not isinstance(level, Mapping):
                raise bad(f"level {i} is not an object")
            conc = level.get("concurrency")
            if isinstance(conc, bool) or not isinstance(conc, int) or conc < 1:
                raise bad(f"level {i} has no positive integer concurrency")
        for key in ("config", "params"):
            if not isinstance(data.get(key) or {}, Mapping):
                raise bad(f"{key} must be an object")
        for key in ("config_after", "diagnosis", "eval"):
            if data.get(key) is not None and not isinstance(data.get(key), Mapping):
                raise bad(f"{key} must be an object or null")
        for key in ("job_id", "sweep_id", "invalid_reason"):
            if data.get(key) is not None and not isinstance(data.get(key), str | int):
                raise bad(f"{key} must be a string or null")
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        job_id = data.get("job_id")
        return cls(
            schema=SCHEMA,
            id=rid,
            job_id=None if job_id is None else str(job_id),
            user=str(data["user"]),
            host=str(data["host"]),
            created_at=float(created),
            label=str(data.get("label") or ""),
            tags=tuple(dict.fromkeys(str(t) for t in tags)),
            kind=str(kind),
            sweep_id=None if data.get("sweep_id") is None else str(data["sweep_id"]),
            config=dict(sub(data.get("config"))),
            config_after=None if data.get("config_after") is None else dict(sub(data["config_after"])),
            valid=bool(data.get("valid", True)),
            invalid_reason=None if data.get("invalid_reason") is None else str(data["invalid_reason"]),
            params=dict(sub(data.get("params"))),
            levels=tuple(dict(sub(level)) for level in levels),
            status=str(status),
            diagnosis=None if data.get("diagnosis") is None else dict(sub(data["diagnosis"])),
            eval=None if data.get("eval") is None else dict(sub(data["eval"])),
            extra={k: v for k, v in data.items() if k not in known},
        )

    # -- convenient views (robust to missing optional keys) -------------------------------------

    @property
    def fingerprint(self) -> str:
        """The observed config fingerprint, or "" when the observation had none."""
        return str(self.config.get("fingerprint") or "")

    @property
    def engine_version(self) -> str:
        """The engine version the server reported about itself, or ""."""
        server = self.config.get("server") or {}
        return str(server.get("version") or "") if isinstance(server, Mapping) else ""

    @property
    def engine(self) -> str:
        """The engine that served the run (``sglang``, ``vllm``), from the observed process; "" when unknown."""
        kind = self.config.get("engine_kind")
        return str(kind).split("-", 1)[0] if kind else ""

    @property
    def config_summary(self) -> str:
        """The one-line human summary of the observed config, or ""."""
        return str(self.config.get("summary") or "")

    @property
    def display_label(self) -> str:
        """How plots and tables name this run: ``"r3 nextn cudnn"``, with ``(invalid)`` when so."""
        text = f"{self.id} {self.label}".strip()
        if self.status == "failed":
            text += " (failed)"
        elif not self.valid:
            text += " (invalid)"
        return text

    @property
    def legend_label(self) -> str:
        """How a plot's legend names this run: its :attr:`display_label`, with its accuracy when it has an eval
        (``r4 cutlass fp4-cutlass (acc 94.7 % DROP)``)."""
        evaluated = self.accuracy
        return self.display_label + (f" ({evaluated.short})" if evaluated is not None else "")

    @property
    def concurrencies(self) -> list[int]:
        """The concurrency levels measured, ascending (an open-loop level's: the peak it reached)."""
        return sorted(whole(level["concurrency"]) for level in self.levels)

    @property
    def open_loop(self) -> bool:
        """True when the levels were request rates (``rate=``), not concurrencies."""
        return any(level.get("rate") is not None for level in self.levels)

    @property
    def loads(self) -> list[float]:
        """What each level was asked for, ascending: its rate (open loop) or its concurrency."""
        return sorted(level_key(level) for level in self.levels)

    def level(self, load: float) -> StoredObject | None:
        """The metrics dict of the level asked for at ``load`` (a concurrency, or a rate), or None."""
        for level in self.levels:
            if level_key(level) == load:
                return level
        return None

    @property
    def best_output_tok_s(self) -> float | None:
        """Highest output tok/s over the levels (the run's headline number), or None."""
        values = [v for v in (metric(level, "output_tok_s") for level in self.levels) if v is not None]
        return max(values) if values else None

    @property
    def accuracy(self) -> EvalSummary | None:
        """The eval stored with this run, read through its typed view; None without one."""
        return EvalSummary.from_dict(self.eval) if self.eval else None

    @property
    def failure_category(self) -> str:
        """The diagnosis category of a failed run ("" if none)."""
        return str((self.diagnosis or {}).get("category") or "")


@dataclass(frozen=True)
class EvalSummary:
    """The ``eval`` object of a run record, typed for the readers (tables, plots, export, Slack).

    ``verdict`` is ``scoring.VERDICTS``' word (``drop`` is the red flag), or ``no_baseline``.
    """

    task: str
    n: int
    correct: int
    accuracy: float
    ci95: tuple[float, float]
    verdict: str
    summary: str
    baseline_run: str | None = None

    @property
    def flagged(self) -> bool:
        return self.verdict == "drop"

    @property
    def short(self) -> str:
        """``acc 94.7 % DROP`` / ``acc 100.0 %``: the words a legend or a sweep cell carries."""
        return f"acc {100 * self.accuracy:.1f} %" + (" DROP" if self.flagged else "")

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> EvalSummary | None:
        """None for an object that is not a readable eval (a future shape, a hand-edited record)."""
        try:
            ci = data.get("ci95") or (0.0, 1.0)
            if not isinstance(ci, list | tuple):
                return None
            return cls(
                task=str(data["task"]),
                n=whole(data["n"]),
                correct=whole(data["correct"]),
                accuracy=number(data["accuracy"]),
                ci95=(number(ci[0]), number(ci[1])),
                verdict=str(data.get("verdict") or "no_baseline"),
                summary=str(data.get("summary") or ""),
                baseline_run=None if data.get("baseline_run") is None else str(data["baseline_run"]),
            )
        except (KeyError, TypeError, ValueError, IndexError):
            return None


def metric(level: Mapping[str, object] | None, name: str, stat: str | None = None) -> float | None:
    """A number out of a LevelMetrics dict: ``metric(l, "ttft_ms", "p50")``; None when absent/NaN."""
    if level is None:
        return None
    value = level.get(name)
    if stat is not None:
        value = value.get(stat) if isinstance(value, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def error_count(level: Mapping[str, object]) -> int:
    """The number of failed requests of a level (``errors`` is an int; tolerate a list too)."""
    errors = level.get("errors")
    if isinstance(errors, list | tuple):
        return len(errors)
    if isinstance(errors, int) and not isinstance(errors, bool):
        return errors
    return 0


def mostly_failed(levels: Sequence[Mapping[str, object]]) -> str | None:
    """Why a run whose requests mostly failed is not a measurement of the server, or None.

    Latencies and throughput are computed from the requests that succeeded; when they are the minority
    (a prompt too long for the model, a server answering 4xx/5xx) the numbers describe the errors, and a
    run stored *valid* with 0/2 requests ok would be compared with real ones (issue 25 item 7).
    """
    total = sum(whole(level.get("num_requests") or 0) for level in levels)
    failed = sum(error_count(level) for level in levels)
    if total and failed * 2 > total:
        return f"{failed} of {total} requests failed: the numbers describe errors, not the server"
    return None


def validate_tag(tag: str) -> str:
    """The tag, lowercased, or a friendly error saying what a tag may look like."""
    text = str(tag).strip().lower()
    if not TAG_RE.match(text):
        raise BenchbotError(
            f"{tag!r} is not a valid tag: use 1-32 characters of a-z, 0-9, '.', '_' or '-', "
            "starting with a letter or digit (e.g. baseline, fp8-kv)"
        )
    return text
