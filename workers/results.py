"""Run history: every benchmark result benchbot ever measured, kept in Redis, exportable.

A run record is the unit of truth that Slack threads, ``/runs``, ``/compare``, plots and exports
are all drawn from, so it carries the configuration *observed* before and after the run (never the
one we assumed) and says whether the result is valid. Records are versioned (``"schema": 1``) and
validated on load, so a corrupt or future record fails with a clear message instead of a stack trace.

Redis layout (all keys under ``benchbot:``):

- ``benchbot:seq:run``              INCR counter behind the ids ``r1``, ``r2``, ...
- ``benchbot:run:<id>``             the record as JSON
- ``benchbot:runs``                 ZSET of ids scored by ``created_at`` (newest first listings)
- ``benchbot:runs:host:<host>``     the same, per host
- ``benchbot:run:<id>:tagged``      HASH tag -> JSON ``{"by", "at"}`` (who tagged, when)
- ``benchbot:baseline:<host>``      ZSET of runs tagged ``baseline`` on that host, scored by tag time

Secrets never reach Redis: :func:`save_run` scrubs the record with :func:`workers.secrets.scrub_secrets`
(key-like fields, ``--api-key`` style argv values, token shapes and the values of secret-looking
environment variables wherever they appear).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

import redis as redis_lib

from workers.errors import BenchbotError
from workers.secrets import scrub_secrets

SCHEMA = 1
KEY_PREFIX = "benchbot"
SEQ_KEY = f"{KEY_PREFIX}:seq:run"
INDEX_KEY = f"{KEY_PREFIX}:runs"
BASELINE_TAG = "baseline"
KINDS = ("bench", "sweep-cell")
STATUSES = ("ok", "failed")

_RUN_ID_RE = re.compile(r"^r[1-9][0-9]*$")
_TAG_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")
_SCAN_PAGE = 200


def run_key(run_id: str) -> str:
    """Redis key of one record."""
    return f"{KEY_PREFIX}:run:{run_id}"


def host_index_key(host: str) -> str:
    """Redis key of the per-host index."""
    return f"{KEY_PREFIX}:runs:host:{host}"


def tagged_key(run_id: str) -> str:
    """Redis key of the who-tagged-what hash of one run."""
    return f"{KEY_PREFIX}:run:{run_id}:tagged"


def baseline_key(host: str) -> str:
    """Redis key of the baseline index of one host."""
    return f"{KEY_PREFIX}:baseline:{host}"


# --------------------------------------------------------------------------------------------- record


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
    config: dict[str, Any] = field(default_factory=dict)
    config_after: dict[str, Any] | None = None
    valid: bool = True
    invalid_reason: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    levels: tuple[dict[str, Any], ...] = ()
    status: str = "ok"
    diagnosis: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    schema: int = SCHEMA

    # -- serialisation ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able schema-1 dict (unknown top-level keys read earlier are written back)."""
        out: dict[str, Any] = dict(self.extra)
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
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunRecord:
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
        if not isinstance(rid, str) or not _RUN_ID_RE.match(rid):
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
        tags_ok = isinstance(tags, list | tuple) and all(isinstance(t, str) and bool(_TAG_RE.match(t)) for t in tags)
        if not tags_ok:
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
        for key in ("config_after", "diagnosis"):
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
            user=data["user"],
            host=data["host"],
            created_at=float(created),
            label=str(data.get("label") or ""),
            tags=tuple(dict.fromkeys(tags)),
            kind=kind,
            sweep_id=None if data.get("sweep_id") is None else str(data["sweep_id"]),
            config=dict(data.get("config") or {}),
            config_after=None if data.get("config_after") is None else dict(data["config_after"]),
            valid=bool(data.get("valid", True)),
            invalid_reason=data.get("invalid_reason"),
            params=dict(data.get("params") or {}),
            levels=tuple(dict(level) for level in levels),
            status=status,
            diagnosis=None if data.get("diagnosis") is None else dict(data["diagnosis"]),
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
    def concurrencies(self) -> list[int]:
        """The concurrency levels measured, ascending."""
        return sorted(int(level["concurrency"]) for level in self.levels)

    def level(self, concurrency: int) -> dict[str, Any] | None:
        """The metrics dict for one concurrency level, or None."""
        for level in self.levels:
            if level.get("concurrency") == concurrency:
                return level
        return None

    @property
    def best_output_tok_s(self) -> float | None:
        """Highest output tok/s over the levels (the run's headline number), or None."""
        values = [v for v in (metric(level, "output_tok_s") for level in self.levels) if v is not None]
        return max(values) if values else None

    @property
    def failure_category(self) -> str:
        """The diagnosis category of a failed run ("" if none)."""
        return str((self.diagnosis or {}).get("category") or "")


def metric(level: Mapping[str, Any] | None, name: str, stat: str | None = None) -> float | None:
    """A number out of a LevelMetrics dict: ``metric(l, "ttft_ms", "p50")``; None when absent/NaN."""
    if level is None:
        return None
    value: Any = level.get(name)
    if stat is not None:
        value = value.get(stat) if isinstance(value, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def error_count(level: Mapping[str, Any]) -> int:
    """The number of failed requests of a level (``errors`` is an int; tolerate a list too)."""
    errors = level.get("errors")
    if isinstance(errors, list | tuple):
        return len(errors)
    if isinstance(errors, int) and not isinstance(errors, bool):
        return errors
    return 0


# ---------------------------------------------------------------------------------------------- redis


def _json_safe(value: Any) -> Any:
    """NaN/inf become null (JSON has no NaN; a metric that could not be computed is "absent")."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def new_run_id(redis: redis_lib.Redis) -> str:
    """Allocate the next run id (``r1``, ``r2``, ...) atomically."""
    return f"r{int(redis.incr(SEQ_KEY))}"


def save_run(redis: redis_lib.Redis, record: RunRecord | Mapping[str, Any]) -> str:
    """Store a record (scrubbed of secrets) and index it; returns its id.

    A record whose id is empty gets a fresh one from :func:`new_run_id`. Saving an existing id
    replaces that record (e.g. a sweep cell finished after being stored as pending).
    """
    data = dict(record.to_dict() if isinstance(record, RunRecord) else record)
    if not data.get("id"):
        data["id"] = new_run_id(redis)
    data.setdefault("schema", SCHEMA)
    clean = RunRecord.from_dict(_json_safe(scrub_secrets(data)))
    payload = json.dumps(clean.to_dict(), sort_keys=True, allow_nan=False, default=str)
    old = redis.get(run_key(clean.id))
    pipe = redis.pipeline(transaction=True)
    if old is not None:
        old_host = json.loads(_text(old)).get("host")
        if old_host and old_host != clean.host:
            pipe.zrem(host_index_key(old_host), clean.id)
    pipe.set(run_key(clean.id), payload)
    pipe.zadd(INDEX_KEY, {clean.id: clean.created_at})
    pipe.zadd(host_index_key(clean.host), {clean.id: clean.created_at})
    if BASELINE_TAG in clean.tags:
        pipe.zadd(baseline_key(clean.host), {clean.id: time.time()}, nx=True)
    pipe.execute()
    return clean.id


def _normalise_id(run_id: str) -> str:
    text = str(run_id).strip().lower()
    if text.isdigit():
        text = f"r{text}"
    if not _RUN_ID_RE.match(text):
        raise BenchbotError(f"{run_id!r} is not a run id (they look like r12); /runs lists them")
    return text


def get_run(redis: redis_lib.Redis, run_id: str) -> RunRecord:
    """Load one record; an unknown id raises a friendly :class:`BenchbotError`."""
    rid = _normalise_id(run_id)
    raw = redis.get(run_key(rid))
    if raw is None:
        raise BenchbotError(f"no run {rid}; /runs lists them")
    return RunRecord.from_dict(json.loads(_text(raw)))


def get_runs(redis: redis_lib.Redis, run_ids: Iterable[str]) -> list[RunRecord]:
    """Load several records in the order given (for ``/compare r3 r4``); unknown ids raise."""
    return [get_run(redis, rid) for rid in run_ids]


def _iter_newest(redis: redis_lib.Redis, index: str) -> Iterator[RunRecord]:
    """Records of an index, newest first, fetched a page at a time (skips dangling ids)."""
    start = 0
    while True:
        ids = redis.zrevrange(index, start, start + _SCAN_PAGE - 1)
        if not ids:
            return
        raws = redis.mget([run_key(_text(i)) for i in ids])
        for raw in raws:
            if raw is not None:
                yield RunRecord.from_dict(json.loads(_text(raw)))
        start += _SCAN_PAGE


def _words(text: str) -> set[str]:
    return {w for w in re.split(r"[\s,;/()=·|]+", text.lower()) if w}


def run_matches(record: RunRecord, filter_text: str) -> bool:
    """Does every word of ``filter_text`` name this run's host, user, a tag, a label or summary word?

    Words are case-insensitive; ``failed``/``invalid``/``valid`` match the run's state, ``r12`` its
    id, and a sweep id its sweep. All words must match (``gpu-1 baseline`` = baselines on gpu-1).
    """
    haystack = {record.host.lower(), record.user.lower(), record.id, record.kind}
    haystack |= set(record.tags)
    haystack |= _words(record.label)
    haystack |= _words(record.config_summary)
    if record.sweep_id:
        haystack.add(record.sweep_id.lower())
    if record.status == "failed":
        haystack.add("failed")
    haystack.add("valid" if record.valid else "invalid")
    return all(word in haystack for word in _words(filter_text))


def list_runs(redis: redis_lib.Redis, n: int = 10, filter: str | None = None) -> list[RunRecord]:
    """Up to ``n`` runs, newest first, optionally only those matching ``filter`` (see :func:`run_matches`)."""
    if n <= 0:
        return []
    out: list[RunRecord] = []
    for record in _iter_newest(redis, INDEX_KEY):
        if filter and not run_matches(record, filter):
            continue
        out.append(record)
        if len(out) >= n:
            break
    return out


def validate_tag(tag: str) -> str:
    """The tag, lowercased, or a friendly error saying what a tag may look like."""
    text = str(tag).strip().lower()
    if not _TAG_RE.match(text):
        raise BenchbotError(
            f"{tag!r} is not a valid tag: use 1-32 characters of a-z, 0-9, '.', '_' or '-', "
            "starting with a letter or digit (e.g. baseline, fp8-kv)"
        )
    return text


def _update_tags(redis: redis_lib.Redis, run_id: str, change: str, tag: str) -> RunRecord:
    """Add or remove one tag atomically (WATCH/MULTI), so concurrent taggers never lose a tag."""
    rid = _normalise_id(run_id)
    key = run_key(rid)
    with redis.pipeline() as pipe:
        while True:
            try:
                pipe.watch(key)
                raw = pipe.get(key)
                if raw is None:
                    raise BenchbotError(f"no run {rid}; /runs lists them")
                record = RunRecord.from_dict(json.loads(_text(raw)))
                tags = list(record.tags)
                if change == "add" and tag not in tags:
                    tags.append(tag)
                elif change == "remove" and tag in tags:
                    tags.remove(tag)
                updated = dataclasses.replace(record, tags=tuple(tags))
                pipe.multi()
                pipe.set(key, json.dumps(updated.to_dict(), sort_keys=True, allow_nan=False, default=str))
                pipe.execute()
                return updated
            except redis_lib.WatchError:
                continue


def tag_run(redis: redis_lib.Redis, run_id: str, tag: str, by: str) -> RunRecord:
    """Add ``tag`` to a run (idempotent) and remember who did it; returns the updated record.

    Tagging ``baseline`` makes the run THE baseline of its host (whatever its config) from now on:
    :func:`baseline_for` returns the run most recently tagged ``baseline`` there.
    """
    clean = validate_tag(tag)
    record = _update_tags(redis, run_id, "add", clean)
    now = time.time()
    pipe = redis.pipeline(transaction=True)
    pipe.hset(tagged_key(record.id), clean, json.dumps({"by": by, "at": now}))
    if clean == BASELINE_TAG:
        pipe.zadd(baseline_key(record.host), {record.id: now})
    pipe.execute()
    return record


def untag_run(redis: redis_lib.Redis, run_id: str, tag: str, by: str) -> RunRecord:
    """Remove ``tag`` from a run (no-op if absent); removing ``baseline`` un-baselines it."""
    clean = validate_tag(tag)
    record = _update_tags(redis, run_id, "remove", clean)
    pipe = redis.pipeline(transaction=True)
    pipe.hdel(tagged_key(record.id), clean)
    if clean == BASELINE_TAG:
        pipe.zrem(baseline_key(record.host), record.id)
    pipe.execute()
    return record


def tag_info(redis: redis_lib.Redis, run_id: str) -> dict[str, dict[str, Any]]:
    """Who tagged each tag of a run, and when: ``{"baseline": {"by": "alice", "at": 1764...}}``."""
    raw = redis.hgetall(tagged_key(_normalise_id(run_id)))
    return {_text(k): json.loads(_text(v)) for k, v in raw.items()}


def baseline_for(redis: redis_lib.Redis, host: str) -> RunRecord | None:
    """The host's baseline: the run most recently tagged ``baseline`` there, or None."""
    for raw_id in redis.zrevrange(baseline_key(host), 0, -1):
        raw = redis.get(run_key(_text(raw_id)))
        if raw is None:
            continue
        record = RunRecord.from_dict(json.loads(_text(raw)))
        if BASELINE_TAG in record.tags and record.host == host:
            return record
    return None


# --------------------------------------------------------------------------------------------- export

CSV_COLUMNS = (
    "run_id", "created_at", "user", "host", "label", "tags", "kind", "sweep_id", "status",
    "fingerprint", "engine_version", "valid", "invalid_reason", "concurrency", "output_tok_s",
    "per_user_tok_s", "total_tok_s", "request_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
    "itl_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "errors",
    "spec_accept_length", "client_bottleneck", "failure_category",
)  # fmt: skip


def iso_time(ts: float) -> str:
    """A unix time as ISO-8601 UTC (``2025-12-02T13:33:20Z``)."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def csv_rows(record: RunRecord) -> list[dict[str, str]]:
    """The flat CSV rows of one run: one per level (one level-less row for a run with none)."""
    base = {
        "run_id": record.id,
        "created_at": iso_time(record.created_at),
        "user": record.user,
        "host": record.host,
        "label": record.label,
        "tags": " ".join(record.tags),
        "kind": record.kind,
        "sweep_id": record.sweep_id or "",
        "status": record.status,
        "fingerprint": record.fingerprint,
        "engine_version": record.engine_version,
        "valid": "true" if record.valid else "false",
        "invalid_reason": record.invalid_reason or "",
        "failure_category": record.failure_category,
    }
    if not record.levels:
        return [{col: base.get(col, "") for col in CSV_COLUMNS}]
    rows = []
    for level in sorted(record.levels, key=lambda lv: lv["concurrency"]):
        client = level.get("client") if isinstance(level.get("client"), Mapping) else {}
        row = dict(base)
        row.update(
            {
                "concurrency": str(level["concurrency"]),
                "output_tok_s": _cell(metric(level, "output_tok_s")),
                "per_user_tok_s": _cell(metric(level, "per_user_tok_s")),
                "total_tok_s": _cell(metric(level, "total_tok_s")),
                "request_s": _cell(metric(level, "request_s")),
                "errors": str(error_count(level)),
                "spec_accept_length": _cell(metric(level, "spec_accept_length")),
                "client_bottleneck": str(client.get("bottleneck") or ""),
            }
        )
        for name in ("ttft", "itl", "tpot", "e2e"):
            for stat in ("p50", "p99"):
                row[f"{name}_{stat}_ms"] = _cell(metric(level, f"{name}_ms", stat))
        rows.append({col: row.get(col, "") for col in CSV_COLUMNS})
    return rows


def export_runs(
    redis: redis_lib.Redis,
    fmt: str,
    stream: TextIO,
    *,
    filter: str | None = None,
    n: int | None = None,
) -> int:
    """Write runs to ``stream`` (oldest first); returns how many runs were written.

    ``jsonl``: one full record per line, the same shape as stored. ``csv``: one row per (run, level)
    with the flat columns of :data:`CSV_COLUMNS`, ready for a spreadsheet or pandas.
    """
    if fmt not in ("jsonl", "csv"):
        raise BenchbotError(f"unknown export format {fmt!r}: use jsonl or csv")
    records = list_runs(redis, n=n if n is not None else 1 << 62, filter=filter)
    records.reverse()
    writer = csv.DictWriter(stream, fieldnames=CSV_COLUMNS, lineterminator="\n") if fmt == "csv" else None
    if writer is not None:
        writer.writeheader()
    for record in records:
        if writer is None:
            stream.write(json.dumps(record.to_dict(), sort_keys=True, allow_nan=False, default=str) + "\n")
        else:
            writer.writerows(csv_rows(record))
    return len(records)


# --------------------------------------------------------------------------------------------- tables


def _short_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M")


def _fmt_num(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value / 1000:.2f}s"
    if value >= 100:
        return f"{value:.0f}ms"
    return f"{value:.1f}ms"


def _align(rows: list[list[str]], right: set[int]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in pairs]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _state(record: RunRecord) -> str:
    if record.status == "failed":
        cat = record.failure_category
        return f"FAILED ({cat})" if cat else "FAILED"
    return "ok" if record.valid else "INVALID"


def format_runs_table(records: Iterable[RunRecord]) -> str:
    """The ``/runs`` table: id, when (UTC), user, host, label, best tok/s, state and tags."""
    records = list(records)
    if not records:
        return "no runs yet"
    rows = [["id", "when (UTC)", "user", "host", "label", "best tok/s", "state / tags"]]
    for r in records:
        label = r.label or r.config_summary or "-"
        if len(label) > 40:
            label = label[:39] + "…"
        state = _state(r)
        if r.tags:
            state += " " + ",".join(r.tags)
        best = _fmt_num(r.best_output_tok_s)
        rows.append([r.id, _short_time(r.created_at), r.user, r.host, label, best, state])
    return _align(rows, right={5})


def _pct(value: float | None, ref: float | None) -> str:
    if value is None or ref is None or ref == 0:
        return ""
    return f"{(value - ref) / ref * 100:+.1f}%"


def compare_table(records: Iterable[RunRecord]) -> str:
    """The ``/compare`` table: one row per concurrency, per run output tok/s, TTFT p50 and ITL p50.

    Runs other than the first show the % change of tok/s vs the first run; invalid and failed runs
    are marked with ``*`` and explained in the legend above the table.
    """
    records = list(records)
    if not records:
        return "nothing to compare"
    legend = []
    for r in records:
        bits = [r.host]
        if r.engine_version:
            bits.append(r.engine_version)
        if r.fingerprint:
            bits.append(f"fp {r.fingerprint[:8]}")
        note = ""
        if r.status == "failed":
            note = f"  * FAILED{': ' + r.failure_category if r.failure_category else ''}"
        elif not r.valid:
            note = f"  * INVALID{': ' + r.invalid_reason if r.invalid_reason else ''}"
        legend.append(f"{r.id}  {r.label or r.config_summary or '-'}  ({', '.join(bits)}){note}")
    concurrencies = sorted({c for r in records for c in r.concurrencies})
    mark = {r.id: ("*" if r.status == "failed" or not r.valid else "") for r in records}
    header = ["conc"]
    for r in records:
        header += [f"{r.id}{mark[r.id]} tok/s", "ttft p50", "itl p50"]
    rows = [header]
    first = records[0]
    for conc in concurrencies:
        row = [str(conc)]
        ref = metric(first.level(conc), "output_tok_s")
        for i, r in enumerate(records):
            level = r.level(conc)
            tok = metric(level, "output_tok_s")
            cell = _fmt_num(tok)
            if i > 0 and (pct := _pct(tok, ref)):
                cell += f" ({pct})"
            row += [cell, _fmt_ms(metric(level, "ttft_ms", "p50")), _fmt_ms(metric(level, "itl_ms", "p50"))]
        rows.append(row)
    if len(rows) == 1:
        rows.append(["-"] + ["-"] * (len(header) - 1))
    table = _align(rows, right=set(range(len(header))))
    return "\n".join(legend) + "\n\n" + table


def format_levels_table(record: RunRecord) -> str:
    """The bench table of one run: a row per concurrency level, the figures a serving engineer reports."""
    rows = [
        [
            "conc",
            "ok/err",
            "out tok/s",
            "tok/s/user",
            "TTFT p50",
            "TTFT p99",
            "ITL p50",
            "ITL p99",
            "TPOT p50",
            "accept",
        ]
    ]
    notes: list[str] = []
    for level in record.levels:
        conc = level.get("concurrency")
        accept = metric(level, "spec_accept_length")
        rows.append(
            [
                str(conc),
                f"{level.get('completed', 0)}/{error_count(level)}",
                _fmt_num(metric(level, "output_tok_s")),
                _fmt_num(metric(level, "per_user_tok_s")),
                _fmt_ms(metric(level, "ttft_ms", "p50")),
                _fmt_ms(metric(level, "ttft_ms", "p99")),
                _fmt_ms(metric(level, "itl_ms", "p50")),
                _fmt_ms(metric(level, "itl_ms", "p99")),
                _fmt_ms(metric(level, "tpot_ms", "p50")),
                f"{accept:.2f}" if accept else "-",
            ]
        )
        client = level.get("client") or {}
        if client.get("bottleneck"):
            notes.append(
                f"c={conc}: the CLIENT was the bottleneck ({client.get('reason')}); treat its figures as a lower bound"
            )
    table = _align(rows, right=set(range(len(rows[0]))))
    engine = f" (SGLang {record.engine_version})" if record.engine_version else ""
    header = f"{record.id} on {record.host}{engine}: {record.label or record.config_summary}"
    if not record.valid:
        header += f"  INVALID: {record.invalid_reason}"
    return "\n".join([header, table, *notes])


def failed_run(
    redis: redis_lib.Redis,
    *,
    job_id: str,
    user: str,
    host: str,
    label: str,
    params: dict[str, Any],
    diagnosis: dict[str, Any],
    sweep_id: str | None = None,
    kind: str = "sweep-cell",
) -> RunRecord:
    """Store a failed cell (a launch that never became ready) so sweeps and /runs show it with its diagnosis."""
    record = RunRecord(
        id=new_run_id(redis),
        job_id=job_id,
        user=user,
        host=host,
        created_at=time.time(),
        label=label,
        kind=kind,
        sweep_id=sweep_id,
        valid=False,
        invalid_reason="the launch failed",
        params=params,
        status="failed",
        diagnosis=diagnosis,
    )
    save_run(redis, record)
    return record
