"""Job events -> Slack threads: one header per job, edited in place, details as thread replies.

The notifier reads the global event stream (:data:`workers.keys.EVENTS`) through a Redis consumer
group, so every event stays *pending* until Slack has accepted what it produced; only then is it
acknowledged. A notifier that restarts (same consumer name) re-reads its own pending entries first,
and one that replaces a dead consumer claims that consumer's stale entries, so what was missed is delivered once.

Each event becomes a short list of Slack calls ("steps": edit the header, post the config, upload
the plots ...). The number of steps already accepted is kept in Redis per entry, so a redelivered
event resumes after the last accepted step instead of posting a reply twice.

Ordering and back-pressure are per job: every job has its own queue and its own "not before" time.
A 429 (after ``Retry-After``) or a 5xx (exponential backoff) only delays that job's queue; no thread
sleeps, and the other jobs' threads keep flowing. Progress edits are throttled per job and
coalesced: a progress event followed by a newer event of the same job is folded into that newer
event's header edit.

This module only delivers. What a thread gets is decided in :mod:`bot.job_threads`: each event is parsed
once, when it is read (:class:`~bot.job_threads.ThreadEvent`), folded into the header state there, and
:func:`~bot.job_threads.posts` decides the rest (config, table, plots, diagnosis, log tail); where the
thread lives is recorded there too (by the Slack front end). The runs a result names are read once here
(:func:`workers.results.store.result_runs`) and handed to ``posts``. Jobs started from the console or ``say`` have no
thread: after a short grace period they are skipped, or given a header in ``BENCHBOT_SLACK_CHANNEL`` when set.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import threading
import time
import urllib.error
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis as redis_lib
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError, SlackRequestError

from bot import blocks, job_threads, tune_thread
from bot.job_threads import HeaderState, ThreadEvent, ThreadRecord, fold, get_thread, record_thread, save_thread
from workers import keys
from workers.jobs import events
from workers.jobs.events import Event
from workers.results import store

log = logging.getLogger(__name__)

STEPS_KEY = keys.SLACK_STEPS
DEFAULT_CHANNEL_ENV = "BENCHBOT_SLACK_CHANNEL"
#: Slack error codes worth retrying; any other ``ok: false`` is final for that step.
TRANSIENT_ERRORS = frozenset(
    {"internal_error", "fatal_error", "service_unavailable", "request_timeout", "ratelimited", "rate_limited"}
)
MAX_BACKOFF_S = 30.0


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

    events: deque[ThreadEvent] = field(default_factory=deque)
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
        self._drawn: dict[tuple[str, ...], list[job_threads.FileUpload]] = {}  # kept until Slack took them
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
            queue.events.append(ThreadEvent.parse(event))  # the one parse of this event
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

    def _ack(self, queue: _JobQueue, event: ThreadEvent) -> None:
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
        if thread is None and job_id not in self._skipped:
            thread = self._tune_step_thread(job_id)
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
            thread = ThreadRecord(schema=1, channel=self.default_channel, ts=None, state=HeaderState(job_id=job_id))
        before = thread["state"]
        state = fold(before, event)
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
        steps = self._steps(event, thread, before, state)
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
        self, event: ThreadEvent, thread: ThreadRecord, before: HeaderState, state: HeaderState
    ) -> list[tuple[str, Callable[[], None]]]:
        """The Slack calls that deliver ``event``, in order; each may be retried on its own.

        The header edit, then what :func:`bot.job_threads.posts` decides the thread gets, from the event,
        the header state before it and the runs its result names (read here, once).
        """
        job_id = event.job
        runs = store.result_runs(self.redis, event.run_ids, sweep=event.sweep) if event.run_ids else None
        steps: list[tuple[str, Callable[[], None]]] = [("header", lambda: self._header(job_id, thread, state))]
        for post in job_threads.posts(event, before, runs):
            steps.append((post.name, functools.partial(self._send, thread, post)))
        return steps

    def _tune_step_thread(self, job_id: str) -> ThreadRecord | None:
        """A tune's later step (queued by a worker, so no Slack message owns it) replies in the tune's thread."""
        tune_id = tune_thread.tune_of_step(self.redis, job_id)
        parent = get_thread(self.redis, tune_id) if tune_id else None
        if parent is None or not parent.get("ts"):
            return None
        header = HeaderState(user=parent["state"].get("user", ""), channel=parent["channel"])
        return record_thread(
            self.redis, job_id, parent["channel"], None, header, thread_ts=job_threads.replies_ts(parent)
        )

    # ------------------------------------------------------------------ Slack calls

    def _header(self, job_id: str, thread: ThreadRecord, state: HeaderState) -> None:
        msg = blocks.header_message(state)
        if ts := thread.get("ts"):
            self.client.chat_update(channel=thread["channel"], ts=ts, **msg)
        else:
            # A job that belongs in another's thread (a tune's later step) posts its header there.
            resp = self.client.chat_postMessage(channel=thread["channel"], thread_ts=thread.get("thread_ts"), **msg)
            thread["channel"] = resp.get("channel") or thread["channel"]
            thread["ts"] = resp["ts"]
            # saved at once (with the state from before this event) so a restart edits, not re-posts
            save_thread(self.redis, job_id, thread)
        self._last_header[job_id] = time.monotonic()

    def _send(self, thread: ThreadRecord, post: job_threads.Post) -> None:
        if isinstance(post, job_threads.ThreadMessage):
            self.client.chat_postMessage(
                channel=thread["channel"], thread_ts=job_threads.replies_ts(thread), **post.message
            )
        elif isinstance(post, job_threads.ThreadFiles):
            self._upload(thread, list(post.uploads))
        else:
            # Drawn once per job and kept until Slack accepted the upload, so a retry re-sends the same files.
            if post.key not in self._drawn:
                self._drawn[post.key] = post.uploads(self.plots_dir / f"job-{post.job_id}")
            self._upload(thread, self._drawn[post.key])
            del self._drawn[post.key]

    def _upload(self, thread: ThreadRecord, uploads: list[job_threads.FileUpload]) -> None:
        if uploads:
            files = [dict(upload) for upload in uploads]
            self.client.files_upload_v2(
                channel=thread["channel"], thread_ts=job_threads.replies_ts(thread), file_uploads=files
            )


def notifier_from_env(redis_client: redis_lib.Redis, client: WebClient, **kwargs: Any) -> Notifier:
    """A notifier whose default channel for console jobs comes from ``BENCHBOT_SLACK_CHANNEL``."""
    kwargs.setdefault("default_channel", os.environ.get(DEFAULT_CHANNEL_ENV) or None)
    return Notifier(redis_client, client, **kwargs)
