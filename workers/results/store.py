"""Run history in Redis: every benchmark result benchbot ever measured, with its tags and baselines.

Redis layout (the keys are named in :mod:`workers.keys`):

- :data:`~workers.keys.RUN_SEQ`            INCR counter behind the ids ``r1``, ``r2``, ...
- :func:`~workers.keys.run`                the record as JSON
- :data:`~workers.keys.RUNS`               ZSET of ids scored by ``created_at`` (newest first listings)
- :func:`~workers.keys.host_runs`          the same, per host
- :func:`~workers.keys.run_tags`           HASH tag -> JSON ``{"by", "at"}`` (who tagged, when)
- :func:`~workers.keys.host_baselines`     ZSET of runs tagged ``baseline`` on that host, scored by tag time

Secrets never reach Redis: :func:`save_run` scrubs the record with :func:`workers.secrets.scrub_secrets`
(key-like fields, ``--api-key`` style argv values, token shapes and the values of secret-looking
environment variables wherever they appear).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import redis as redis_lib

from workers import keys
from workers.errors import BenchbotError
from workers.evaluation.runner import EvalError, EvalRun
from workers.redis_conn import text_client
from workers.results.record import RUN_ID_RE, SCHEMA, RunRecord, validate_tag
from workers.secrets import scrub_secrets

SEQ_KEY = keys.RUN_SEQ
INDEX_KEY = keys.RUNS
BASELINE_TAG = "baseline"
_SCAN_PAGE = 200

run_key = keys.run
host_index_key = keys.host_runs
tagged_key = keys.run_tags
baseline_key = keys.host_baselines
eval_key = keys.run_eval


def _json_safe(value: Any) -> Any:
    """NaN/inf become null (JSON has no NaN; a metric that could not be computed is "absent")."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def new_run_id(redis: redis_lib.Redis) -> str:
    """Allocate the next run id (``r1``, ``r2``, ...) atomically."""
    return f"r{int(redis.incr(SEQ_KEY))}"


def save_run(redis: redis_lib.Redis, record: RunRecord | Mapping[str, object]) -> str:
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
    old = text_client(redis).get(run_key(clean.id))
    pipe = redis.pipeline(transaction=True)
    if old is not None:
        old_host = json.loads(old).get("host")
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
    if not RUN_ID_RE.match(text):
        raise BenchbotError(f"{run_id!r} is not a run id (they look like r12); /runs lists them")
    return text


class TagInfo(TypedDict, total=False):
    """Who put a tag on a run and when; ``overrides``: the flags an admin's ``baseline`` tag overrode."""

    by: str
    at: float
    overrides: list[str]


def get_run(redis: redis_lib.Redis, run_id: str) -> RunRecord:
    """Load one record; an unknown id raises a friendly :class:`BenchbotError`."""
    rid = _normalise_id(run_id)
    raw = text_client(redis).get(run_key(rid))
    if raw is None:
        raise BenchbotError(f"no run {rid}; /runs lists them")
    return RunRecord.from_dict(json.loads(raw))


def get_runs(redis: redis_lib.Redis, run_ids: Iterable[str]) -> list[RunRecord]:
    """Load several records in the order given (for ``/compare r3 r4``); unknown ids raise."""
    return [get_run(redis, rid) for rid in run_ids]


@dataclass(frozen=True)
class ResultRuns:
    """The stored runs one finished job names, read once: what its thread's table and plots are drawn from.

    A sweep's cells in order, compared with each other; or one run with its host's baseline (None when
    there is none, or the run is that baseline) and its eval's per-question results. ``error`` says why the
    runs could not be read ("" when they were); then ``runs`` is empty.
    """

    run_ids: tuple[str, ...]
    sweep: bool = False
    runs: tuple[RunRecord, ...] = ()
    baseline: RunRecord | None = None
    eval_run: EvalRun | None = None
    error: str = ""

    @property
    def run(self) -> RunRecord | None:
        """The one run of a bench or an eval (None for a sweep, or when it could not be read)."""
        return self.runs[0] if self.runs and not self.sweep else None


def result_runs(redis: redis_lib.Redis, run_ids: Iterable[str], *, sweep: bool = False) -> ResultRuns:
    """Read the runs a finished job names, once, for everything its thread and ``follow`` show.

    ``sweep``: the runs are a sweep's cells; otherwise the first is a bench's (or an eval's) run and its
    host's baseline and eval items are read beside it. An unreadable run is an ``error``, never a raise.
    """
    ids = tuple(str(r) for r in run_ids)
    try:
        runs = tuple(get_runs(redis, ids if sweep else ids[:1]))
    except (BenchbotError, ValueError) as exc:  # unknown, malformed or unreadable
        return ResultRuns(ids, sweep, error=str(exc))
    if sweep or not runs:
        return ResultRuns(ids, sweep, runs)
    record = runs[0]
    try:
        baseline = baseline_for(redis, record.host)
    except (BenchbotError, ValueError):  # a malformed baseline: the run is shown alone
        baseline = None
    if baseline is not None and baseline.id == record.id:
        baseline = None
    eval_run = get_eval_run(redis, record.id) if record.accuracy is not None else None
    return ResultRuns(ids, sweep, runs, baseline, eval_run)


def _iter_newest(redis: redis_lib.Redis, index: str) -> Iterator[RunRecord]:
    """Records of an index, newest first, fetched a page at a time (skips dangling ids)."""
    redis = text_client(redis)
    start = 0
    while True:
        ids = redis.zrevrange(index, start, start + _SCAN_PAGE - 1)
        if not ids:
            return
        raws = redis.mget([run_key(i) for i in ids])
        for raw in raws:
            if raw is not None:
                yield RunRecord.from_dict(json.loads(raw))
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


def _update_tags(redis: redis_lib.Redis, run_id: str, change: str, tag: str) -> RunRecord:
    """Add or remove one tag atomically (WATCH/MULTI), so concurrent taggers never lose a tag."""
    rid = _normalise_id(run_id)
    key = run_key(rid)
    with text_client(redis).pipeline() as pipe:
        while True:
            try:
                pipe.watch(key)
                raw = pipe.get(key)
                if raw is None:
                    raise BenchbotError(f"no run {rid}; /runs lists them")
                record = RunRecord.from_dict(json.loads(raw))
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


def run_flags(record: RunRecord) -> list[str]:
    """What marks a run as not fit to hold others to: failed, invalid, an ACCURACY DROP ([] when none)."""
    flags = []
    if record.status != "ok":
        flags.append(f"{record.status.upper()}" + (f" ({record.failure_category})" if record.failure_category else ""))
    if not record.valid:
        flags.append(f"INVALID: {record.invalid_reason or 'the server changed during the run'}")
    accuracy = record.accuracy
    if accuracy is not None and accuracy.flagged:
        why = f": {accuracy.summary}" if accuracy.summary else ""
        flags.append(f"ACCURACY DROP ({accuracy.task} {100 * accuracy.accuracy:.1f} %{why})")
    return flags


def tag_run(redis: redis_lib.Redis, run_id: str, tag: str, by: str, *, admin: bool = False) -> RunRecord:
    """Add ``tag`` to a run (idempotent) and remember who did it; returns the updated record.

    Tagging ``baseline`` makes the run THE baseline of its host (whatever its config) from now on:
    :func:`baseline_for` returns the run most recently tagged ``baseline`` there. A flagged run
    (:func:`run_flags`) would then be what later runs are held to, so a later eval of the same bad
    config reads "within noise": only an ``admin`` may do that, and the flags it overrides are kept
    with the tag (:func:`tag_info`, ``overrides``).
    """
    clean = validate_tag(tag)
    overrides: list[str] = []
    if clean == BASELINE_TAG:
        overrides = run_flags(get_run(redis, run_id))
        if overrides and not admin:
            raise BenchbotError(
                f"{_normalise_id(run_id)} is flagged ({'; '.join(overrides)}): only an admin may make it the "
                "baseline, since later runs would be held to it. Nothing was tagged."
            )
    record = _update_tags(redis, run_id, "add", clean)
    now = time.time()
    pipe = redis.pipeline(transaction=True)
    info = TagInfo(by=by, at=now)
    if overrides:
        info["overrides"] = overrides
    pipe.hset(tagged_key(record.id), clean, json.dumps(info))
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


def tag_info(redis: redis_lib.Redis, run_id: str) -> dict[str, TagInfo]:
    """Who tagged each tag of a run, and when: ``{"baseline": {"by": "alice", "at": 1764...}}``."""
    raw = text_client(redis).hgetall(tagged_key(_normalise_id(run_id)))
    return {k: cast(TagInfo, json.loads(v)) for k, v in raw.items()}  # the Redis edge: what tag_run wrote


def baseline_for(redis: redis_lib.Redis, host: str) -> RunRecord | None:
    """The host's baseline: the run most recently tagged ``baseline`` there, or None."""
    redis = text_client(redis)
    for run_id in redis.zrevrange(baseline_key(host), 0, -1):
        raw = redis.get(run_key(run_id))
        if raw is None:
            continue
        record = RunRecord.from_dict(json.loads(raw))
        if BASELINE_TAG in record.tags and record.host == host:
            return record
    return None


def failed_run(
    redis: redis_lib.Redis,
    *,
    job_id: str,
    user: str,
    host: str,
    label: str,
    params: Mapping[str, object],
    diagnosis: Mapping[str, object],
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
        params=dict(params),
        status="failed",
        diagnosis=dict(diagnosis),
    )
    save_run(redis, record)
    return record


# ------------------------------------------------------------------ evals


def save_eval_items(redis: redis_lib.Redis, run_id: str, run: EvalRun) -> None:
    """Keep an eval's per-item results (what each question got) beside its run record."""
    data = scrub_secrets(run.to_dict())
    redis.set(eval_key(_normalise_id(run_id)), json.dumps(data, sort_keys=True, allow_nan=False, default=str))


def get_eval_run(redis: redis_lib.Redis, run_id: str) -> EvalRun | None:
    """The eval stored with a run, items included; None when the run has none (or it cannot be read)."""
    raw = text_client(redis).get(eval_key(_normalise_id(run_id)))
    if raw is None:
        return None
    try:
        return EvalRun.from_dict(json.loads(raw))
    except (EvalError, ValueError):
        return None


def _eval_matches(record: RunRecord, task: str, model: str) -> bool:
    data = record.eval or {}
    return record.status == "ok" and data.get("task") == task and (not model or data.get("model") == model)


def baseline_eval_for(
    redis: redis_lib.Redis, host: str, task: str, model: str = "", *, exclude: str | None = None
) -> tuple[RunRecord, EvalRun, str] | None:
    """The eval a new eval of ``task`` (on ``model``) on ``host`` is compared with: ``(record, run, why)``.

    1. The team's mark: the newest run tagged ``baseline`` on the host that carries an eval of the same
       task and model (``/runs tag rN baseline``).
    2. Else the host's first valid eval of that task and model that was not itself flagged: the first
       known-good answer sheet, so a host's later configs are held to what it answered first.

    A run is never its own baseline (``exclude``). None when the host has no such eval yet.
    """
    text = text_client(redis)
    tagged = [str(rid) for rid in text.zrevrange(baseline_key(host), 0, -1)]
    for rid, record in _eval_records(text, tagged):
        if rid != exclude and BASELINE_TAG in record.tags and _eval_matches(record, task, model):
            run = get_eval_run(redis, rid)
            if run is not None and run.items:
                return record, run, "the host's baseline"
    start = 0
    while True:  # oldest first, a page at a time: the first good eval is usually among the first runs
        page = [str(rid) for rid in text.zrange(host_index_key(host), start, start + _SCAN_PAGE - 1)]
        if not page:
            return None
        for rid, record in _eval_records(text, page):
            data = record.eval or {}
            good = record.valid and data.get("verdict") != "drop"
            if rid != exclude and good and _eval_matches(record, task, model):
                run = get_eval_run(redis, rid)
                if run is not None and run.items:
                    return record, run, f"the first eval of {task} on {host}"
        start += _SCAN_PAGE


def _eval_records(text: Any, run_ids: list[str]) -> Iterator[tuple[str, RunRecord]]:
    """``(id, record)`` of the runs among ``run_ids`` that carry an eval (others are not parsed)."""
    if not run_ids:
        return
    for rid, raw in zip(run_ids, text.mget([run_key(i) for i in run_ids]), strict=True):
        if raw is not None and '"eval"' in raw:
            yield rid, RunRecord.from_dict(json.loads(raw))
