"""Job events -> Slack threads: one header per job, edited in place, details as thread replies.

The notifier reads ``benchbot:events`` through a Redis consumer group, so every event stays
*pending* until Slack has accepted what it produced; only then is it acknowledged. A notifier that
restarts (same consumer name) re-reads its own pending entries first, and one that replaces a dead
consumer claims that consumer's stale entries, so what was missed is delivered once.

Each event becomes a short list of Slack calls ("steps": edit the header, post the config, upload
the plots ...). The number of steps already accepted is kept in Redis per entry, so a redelivered
event resumes after the last accepted step instead of posting a reply twice.

Ordering and back-pressure are per job: every job has its own queue and its own "not before" time.
A 429 (after ``Retry-After``) or a 5xx (exponential backoff) only delays that job's queue; no thread
sleeps, and the other jobs' threads keep flowing. Progress edits are throttled per job and
coalesced: a progress event followed by a newer event of the same job is folded into that newer
event's header edit.

Where a job's thread lives is recorded by the Slack front end with :func:`record_thread`
(``benchbot:slack:thread:<job_id>``). Jobs started from the console or ``say`` have none: after a
short grace period they are skipped, or given a header in ``BENCHBOT_SLACK_CHANNEL`` when set.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import urllib.error
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis as redis_lib
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError, SlackRequestError

from bot import blocks
from workers.errors import BenchbotError
from workers.jobs import events
from workers.jobs.events import Event
from workers.results import store, tables
from workers.secrets import scrub_secrets

log = logging.getLogger(__name__)

THREAD_KEY_PREFIX = "benchbot:slack:thread:"
STEPS_KEY = "benchbot:slack:steps"
THREAD_TTL_S = 30 * 24 * 3600
DEFAULT_CHANNEL_ENV = "BENCHBOT_SLACK_CHANNEL"
#: Slack error codes worth retrying; any other ``ok: false`` is final for that step.
TRANSIENT_ERRORS = frozenset(
    {"internal_error", "fatal_error", "service_unavailable", "request_timeout", "ratelimited", "rate_limited"}
)
HEADER_FIELDS = ("job_id", "user", "channel", "host", "kind", "summary", "position", "ahead")
MAX_BACKOFF_S = 30.0


# --------------------------------------------------------------------------- thread records


def thread_key(job_id: str) -> str:
    """Redis key of the record of the Slack message that owns a job."""
    return f"{THREAD_KEY_PREFIX}{job_id}"


def record_thread(
    r: redis_lib.Redis, job_id: str, channel: str, ts: str | None, header: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Remember that the message (channel, ts) is job ``job_id``'s header (its thread's parent).

    ``header`` is what the header shows before any event arrived (the queued Reply's data).
    """
    state: dict[str, Any] = {"phase": "queued"}
    state.update({k: v for k, v in (header or {}).items() if k in HEADER_FIELDS})
    state["job_id"] = str(job_id)
    thread = {"schema": 1, "channel": channel, "ts": ts, "state": state}
    save_thread(r, str(job_id), thread)
    return thread


def get_thread(r: redis_lib.Redis, job_id: str) -> dict[str, Any] | None:
    """The thread record of a job, or None for jobs no Slack message owns."""
    raw = r.get(thread_key(job_id))
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        log.warning("job %s: unreadable thread record ignored", job_id)
        return None
    return data if isinstance(data, dict) and data.get("channel") else None


def save_thread(r: redis_lib.Redis, job_id: str, thread: Mapping[str, Any]) -> None:
    """Store a thread record (header state included) for a month."""
    r.set(thread_key(job_id), json.dumps(thread, default=str, separators=(",", ":")), ex=THREAD_TTL_S)


# --------------------------------------------------------------------------- header state


def fold(state: Mapping[str, Any], event: Event) -> dict[str, Any]:
    """The header state after ``event``: a pure function, so a redelivered event folds the same way."""
    out = dict(state)
    out.setdefault("job_id", event.job)
    data = event.data
    kind = event.type
    if kind == events.QUEUED:
        for key in HEADER_FIELDS:
            if key in data and key != "job_id":
                out.setdefault(key, data[key])
        out.update(
            phase="queued",
            position=data.get("position", out.get("position")),
            ahead=data.get("ahead", out.get("ahead")),
        )
    elif kind == events.STARTED:
        out.update(phase="running", worker=data.get("worker"), progress=None)
    elif kind == events.PROGRESS:
        if out.get("phase") in (None, "queued"):
            out["phase"] = "running"
        phase, msg = data.get("phase"), data.get("message")
        out["progress"] = f"{phase}: {msg}" if phase and msg else (msg or phase)
    elif kind == events.READY:
        config = data.get("config") or {}
        out.update(
            phase="ready", ready_summary=config.get("summary"), progress=None, diff_count=len(data.get("diff") or [])
        )
    elif kind == events.SUCCEEDED:
        out.update(phase="done", result_kind=data.get("kind"), progress=None)
        for key in ("run_id", "run_ids", "sweep_id", "stopped"):
            if key in data:
                out[key] = data[key]
        if data.get("config") and not out.get("ready_summary"):
            out["ready_summary"] = (data.get("config") or {}).get("summary")
    elif kind == events.FAILED:
        diagnosis = data.get("diagnosis") or {}
        out.update(
            phase="failed",
            progress=None,
            category=diagnosis.get("category"),
            error=diagnosis.get("summary") or data.get("message"),
        )
    elif kind == events.CANCELLED:
        out.update(phase="cancelled", progress=None, cancelled_by=data.get("by"))
    return out


# --------------------------------------------------------------------------- failures


@dataclass(frozen=True)
class _Failure:
    retry: bool
    delay_s: float
    reason: str


def _retry_after(headers: Any) -> float:
    value = None
    if headers is not None:
        value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        seconds = float(value) if value is not None else 1.0
    except (TypeError, ValueError):
        seconds = 1.0
    return seconds if math.isfinite(seconds) and seconds >= 0 else 1.0


def classify(exc: BaseException, attempts: int) -> _Failure:
    """Whether a failed Slack call is worth retrying, and when."""
    backoff = min(MAX_BACKOFF_S, 0.5 * 2 ** max(0, attempts - 1))
    if isinstance(exc, SlackApiError):
        status = getattr(exc.response, "status_code", 200)
        error = str(exc.response.get("error", "")) if exc.response is not None else ""
        if status == 429 or error in ("ratelimited", "rate_limited"):
            return _Failure(True, _retry_after(exc.response.headers), f"rate limited ({status})")
        if status >= 500 or error in TRANSIENT_ERRORS:
            return _Failure(True, backoff, f"slack {status} {error}".strip())
        return _Failure(False, 0.0, error or f"HTTP {status}")
    if isinstance(exc, urllib.error.HTTPError):  # files_upload_v2 step 2 posts with urllib directly
        if exc.code == 429:
            return _Failure(True, _retry_after(exc.headers), "upload rate limited")
        if exc.code >= 500:
            return _Failure(True, backoff, f"upload HTTP {exc.code}")
        return _Failure(False, 0.0, f"upload HTTP {exc.code}")
    if isinstance(exc, SlackRequestError):
        return _Failure(False, 0.0, f"bad request: {type(exc).__name__}")
    if isinstance(exc, OSError | SlackClientError | TimeoutError):
        return _Failure(True, backoff, f"connection: {type(exc).__name__}")
    return _Failure(False, 0.0, f"{type(exc).__name__}")


# --------------------------------------------------------------------------- the notifier


@dataclass
class _JobQueue:
    """The undelivered events of one job, oldest first, and when it may try again."""

    events: deque[Event] = field(default_factory=deque)
    first_seen: float = field(default_factory=time.monotonic)
    not_before: float = 0.0
    attempts: int = 0


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms or 0), int(seq or 0)


class Notifier:
    """Consumes the event stream and keeps each job's Slack thread up to date."""

    def __init__(
        self,
        redis_client: redis_lib.Redis,
        client: WebClient,
        *,
        consumer: str | None = None,
        group: str = events.DEFAULT_GROUP,
        default_channel: str | None = None,
        plots_dir: Path | None = None,
        progress_interval_s: float = 2.0,
        thread_wait_s: float = 10.0,
        claim_idle_ms: int = 60_000,
        claim_every_s: float = 15.0,
        block_ms: int = 1000,
    ) -> None:
        self.redis = redis_client
        self.client = client
        self.consumer = consumer or f"slack-{socket.gethostname()}"
        self.group = group
        self.default_channel = default_channel
        self.plots_dir = plots_dir or Path(os.environ.get("BENCHBOT_STATE_DIR", ".")) / "plots"
        self.progress_interval_s = progress_interval_s
        self.thread_wait_s = thread_wait_s
        self.claim_idle_ms = claim_idle_ms
        self.claim_every_s = claim_every_s
        self.block_ms = block_ms
        self._jobs: dict[str, _JobQueue] = {}
        self._known: set[str] = set()
        self._skipped: set[str] = set()
        self._last_header: dict[str, float] = {}
        self._drawn: dict[tuple[str, ...], list[Any]] = {}  # plots kept until their upload is accepted
        self._last_claim = -math.inf
        self._recovered = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        events.ensure_group(self.redis, self.group)

    # ------------------------------------------------------------------ running

    def start(self) -> threading.Thread:
        """Run in a background thread until :meth:`stop`."""
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="benchbot-notifier", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 10.0) -> None:
        """Stop between two Slack calls; what is not acknowledged is redelivered next time."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        """The loop: read, deliver what is due, repeat. Errors are logged, never fatal."""
        while not self._stop.is_set():
            try:
                self.run_once()
            except redis_lib.RedisError as exc:
                log.warning("notifier: redis unavailable (%s); retrying", type(exc).__name__)
                self._stop.wait(1.0)
            except Exception:
                log.exception("notifier: unexpected error; continuing")
                self._stop.wait(1.0)

    def run_once(self, block_ms: int | None = None) -> int:
        """One round: recover/claim, read new events, deliver every due job. Returns events acked."""
        if not self._recovered:
            self._add(events.read_pending(self.redis, self.consumer, self.group, count=10_000))
            self._recovered = True
        now = time.monotonic()
        if now - self._last_claim >= self.claim_every_s:
            self._last_claim = now
            self._add(
                events.claim_stale(self.redis, self.consumer, self.group, min_idle_ms=self.claim_idle_ms, count=1000)
            )
        wait_ms = self._wait_ms(self.block_ms if block_ms is None else block_ms)
        self._add(events.read_group(self.redis, self.consumer, self.group, block_ms=wait_ms, count=200))
        return self._deliver_due()

    @property
    def backlog(self) -> int:
        """Events read but not yet acknowledged."""
        return sum(len(q.events) for q in self._jobs.values())

    def _wait_ms(self, block_ms: int) -> int:
        if not self._jobs:
            return max(1, block_ms)
        soonest = min(q.not_before for q in self._jobs.values())
        return max(1, min(block_ms, int((soonest - time.monotonic()) * 1000)))

    def _add(self, new: list[Event]) -> None:
        for event in new:
            if event.id in self._known:
                continue
            self._known.add(event.id)
            queue = self._jobs.setdefault(event.job, _JobQueue())
            out_of_order = bool(queue.events) and _id_key(queue.events[-1].id) > _id_key(event.id)
            queue.events.append(event)
            if out_of_order:
                queue.events = deque(sorted(queue.events, key=lambda e: _id_key(e.id)))

    def _deliver_due(self) -> int:
        acked = 0
        order = sorted(self._jobs.items(), key=lambda item: _id_key(item[1].events[0].id))
        for job_id, queue in order:
            for _ in range(50):  # bounded, so reading new events is never starved
                if self._stop.is_set() or not queue.events or queue.not_before > time.monotonic():
                    break
                if not self._deliver_head(job_id, queue):
                    break
                acked += 1
            if not queue.events:
                del self._jobs[job_id]
        return acked

    def _ack(self, queue: _JobQueue, event: Event) -> None:
        events.ack(self.redis, [event.id], self.group)
        self.redis.hdel(STEPS_KEY, event.id)
        queue.events.popleft()
        queue.attempts = 0
        self._known.discard(event.id)

    # ------------------------------------------------------------------ one event

    def _deliver_head(self, job_id: str, queue: _JobQueue) -> bool:
        """Deliver the oldest event of a job; True when it was acknowledged."""
        event = queue.events[0]
        now = time.monotonic()
        thread = get_thread(self.redis, job_id)
        if thread is None:
            if job_id in self._skipped:
                self._ack(queue, event)
                return True
            if now - queue.first_seen < self.thread_wait_s:
                queue.not_before = now + min(0.25, self.thread_wait_s)
                return False
            if not self.default_channel:
                log.info("job %s has no Slack thread (console job?); its events are not posted", job_id)
                self._skipped.add(job_id)
                self._ack(queue, event)
                return True
            thread = {"schema": 1, "channel": self.default_channel, "ts": None, "state": {"job_id": job_id}}
        state = fold(thread.get("state") or {}, event)
        if event.type == events.PROGRESS:
            if len(queue.events) > 1:  # a newer event redraws the header: coalesce into it
                thread["state"] = state
                save_thread(self.redis, job_id, thread)
                self._ack(queue, event)
                return True
            wait = self._last_header.get(job_id, -math.inf) + self.progress_interval_s - now
            if wait > 0:
                queue.not_before = now + wait
                return False
        steps = self._steps(event, thread, state)
        done = int(self.redis.hget(STEPS_KEY, event.id) or 0)
        for index in range(done, len(steps)):
            if self._stop.is_set():
                return False
            name, call = steps[index]
            try:
                call()
            except Exception as exc:
                failure = classify(exc, queue.attempts + 1)
                if failure.retry:
                    queue.attempts += 1
                    queue.not_before = time.monotonic() + failure.delay_s
                    log.info(
                        "job %s: %s for %s %s; retry in %.1fs",
                        job_id,
                        failure.reason,
                        event.type,
                        name,
                        failure.delay_s,
                    )
                    return False
                log.warning("job %s: Slack refused %s of %s (%s); skipped", job_id, name, event.type, failure.reason)
            queue.attempts = 0  # backoff grows with consecutive failures, not with the steps of an event
            self.redis.hset(STEPS_KEY, event.id, index + 1)
        thread["state"] = state
        save_thread(self.redis, job_id, thread)
        self._ack(queue, event)
        return True

    def _steps(
        self, event: Event, thread: dict[str, Any], state: dict[str, Any]
    ) -> list[tuple[str, Callable[[], None]]]:
        """The Slack calls that deliver ``event``, in order; each may be retried on its own."""
        job_id = event.job
        data = event.data
        steps: list[tuple[str, Callable[[], None]]] = [("header", lambda: self._header(job_id, thread, state))]
        if event.type == events.READY and data.get("config"):
            state["config_posted"] = True
            steps.append(
                (
                    "config",
                    lambda: self._post(
                        thread,
                        blocks.config_message(
                            scrub_secrets(data["config"]),
                            data.get("diff") or [],
                            data.get("replaced"),
                            job_id=job_id,
                            offer_bench=False,
                        ),
                    ),
                )
            )
        elif event.type == events.SUCCEEDED:
            if data.get("config") and not state.get("config_posted"):
                state["config_posted"] = True
                steps.append(
                    (
                        "config",
                        lambda: self._post(
                            thread,
                            blocks.config_message(
                                scrub_secrets(data["config"]),
                                data.get("diff") or [],
                                data.get("replaced"),
                                job_id=job_id,
                                offer_bench=False,
                            ),
                        ),
                    )
                )
            if data.get("run_id"):
                run_id = str(data["run_id"])
                steps.append(("results", lambda: self._bench_results(thread, run_id)))
                steps.append(("plots", lambda: self._bench_plots(thread, job_id, run_id)))
            if data.get("run_ids"):
                run_ids = [str(r) for r in data["run_ids"]]
                steps.append(("results", lambda: self._sweep_results(thread, run_ids, data.get("sweep_id"))))
                steps.append(("plots", lambda: self._sweep_plots(thread, job_id, run_ids)))
        elif event.type == events.FAILED:
            diagnosis = scrub_secrets(data.get("diagnosis") or None)
            message = str(scrub_secrets(data.get("message") or ""))
            steps.append(("diagnosis", lambda: self._post(thread, blocks.diagnosis_message(message, diagnosis))))
            tail = (diagnosis or {}).get("log_tail") or []
            if tail:
                steps.append(
                    (
                        "log",
                        lambda: self._upload_text(
                            thread,
                            "\n".join(str(line) for line in tail),
                            f"job-{job_id}-log-tail.txt",
                            f"log tail of job {job_id}",
                        ),
                    )
                )
        return steps

    # ------------------------------------------------------------------ Slack calls

    def _header(self, job_id: str, thread: dict[str, Any], state: Mapping[str, Any]) -> None:
        msg = blocks.header_message(state)
        if thread.get("ts"):
            self.client.chat_update(channel=thread["channel"], ts=thread["ts"], **msg)
        else:
            resp = self.client.chat_postMessage(channel=thread["channel"], **msg)
            thread["channel"] = resp.get("channel") or thread["channel"]
            thread["ts"] = resp["ts"]
            # saved at once (with the state from before this event) so a restart edits, not re-posts
            save_thread(self.redis, job_id, thread)
        self._last_header[job_id] = time.monotonic()

    def _post(self, thread: Mapping[str, Any], msg: Mapping[str, Any]) -> None:
        self.client.chat_postMessage(channel=thread["channel"], thread_ts=thread["ts"], **msg)

    def _upload(self, thread: Mapping[str, Any], uploads: list[dict[str, Any]]) -> None:
        if uploads:
            self.client.files_upload_v2(channel=thread["channel"], thread_ts=thread["ts"], file_uploads=uploads)

    def _upload_text(self, thread: Mapping[str, Any], content: str, filename: str, title: str) -> None:
        self._upload(thread, [{"content": str(scrub_secrets(content)), "filename": filename, "title": title}])

    def _bench_results(self, thread: Mapping[str, Any], run_id: str) -> None:
        try:
            record = store.get_run(self.redis, run_id)
        except BenchbotError as exc:
            self._post(thread, blocks.text_message(f"results of {run_id} could not be read: {exc}"))
            return
        baseline = store.baseline_for(self.redis, record.host)
        records = [baseline, record] if baseline is not None and baseline.id != record.id else [record]
        note = None
        if not record.valid:
            note = f"INVALID: {record.invalid_reason or 'the server changed during the run'}"
        elif len(records) == 2:
            note = f"compared with the baseline of {record.host}, {records[0].id}"
        buttons = [blocks.button("Compare with baseline", "compare_baseline", record.id)] if len(records) == 1 else []
        title = f"Bench {record.id}: {record.label or record.config_summary or record.host}"
        self._post(thread, blocks.table_message(title, tables.compare_table(records), note=note, buttons=buttons))

    def _bench_plots(self, thread: Mapping[str, Any], job_id: str, run_id: str) -> None:
        from bot import plots  # matplotlib loads only when there is something to draw

        try:
            record = store.get_run(self.redis, run_id)
        except BenchbotError:
            return
        baseline = store.baseline_for(self.redis, record.host)
        if baseline is not None and baseline.id == record.id:
            baseline = None
        key = ("bench", job_id, run_id)
        if key not in self._drawn:
            self._drawn[key] = plots.draw_bench(record, baseline, self.plots_dir / f"job-{job_id}")
        self._upload(thread, [_plot_upload(i) for i in self._drawn[key]])
        del self._drawn[key]

    def _sweep_results(self, thread: Mapping[str, Any], run_ids: list[str], sweep_id: Any) -> None:
        records = store.get_runs(self.redis, run_ids)
        title = f"Sweep {sweep_id}" if sweep_id else "Sweep"
        self._post(thread, blocks.table_message(title, tables.compare_table(records)))

    def _sweep_plots(self, thread: Mapping[str, Any], job_id: str, run_ids: list[str]) -> None:
        from bot import plots

        key = ("sweep", job_id, *run_ids)
        if key not in self._drawn:
            records = store.get_runs(self.redis, run_ids)
            self._drawn[key] = plots.draw_sweep(records, self.plots_dir / f"job-{job_id}")
        self._upload(thread, [_plot_upload(i) for i in self._drawn[key]])
        del self._drawn[key]


def _plot_upload(info: Any) -> dict[str, Any]:
    path = Path(info.path)
    return {
        "file": str(path),
        "filename": path.name,
        "title": info.title or path.stem,
        "alt_txt": blocks.truncate(info.alt_text or path.stem, 1000),
    }


def notifier_from_env(redis_client: redis_lib.Redis, client: WebClient, **kwargs: Any) -> Notifier:
    """A notifier whose default channel for console jobs comes from ``BENCHBOT_SLACK_CHANNEL``."""
    kwargs.setdefault("default_channel", os.environ.get(DEFAULT_CHANNEL_ENV) or None)
    return Notifier(redis_client, client, **kwargs)
