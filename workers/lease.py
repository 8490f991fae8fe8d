"""The exclusive lease on a GPU host: one job touches a host at a time, in enqueue order.

Shape (all keys under ``benchbot:``):

* ``lease:<host>``: JSON holder ``{user, job, worker, since, fence, seq, ttl_ms}`` with a PX TTL. The TTL
  is the crash detector: a SIGKILLed horse skips every ``finally``, and RQ notices an abandoned job only
  after 90-690 s, so the lease expires by itself one TTL after the last heartbeat.
* ``fence:<host>``: a counter incremented in the same Lua step that grants the lease. Every write of
  host state goes through :func:`fenced_set`, which refuses a fence that is not the current lease's,
  so a holder that paused past its TTL cannot clobber what the next holder wrote.
* ``lease:<host>:waiters``: the line, a ZSET of job ids scored by their sequence number, plus one
  liveness key per waiter (``lease:<host>:waiter:<job>``): "queued" (no TTL) from enqueue until a
  worker dequeues the job, then the worker's name with a short TTL that the waiting job refreshes.
  Only the first live waiter may take a free lease, so with several workers on one host jobs still
  run in enqueue order; a waiter whose liveness key expired (its worker died) is skipped.
* ``lease:<host>:last``: the holder record, kept without TTL until a clean release. If a lease expires
  while it is still there, its job's worker died; whoever notices first (the next acquirer or
  :func:`reap_dead_jobs`) publishes ``failed`` for that job.

Renewal runs on a daemon thread with its own Redis client and no thread-local token (the token is
the job id plus the fence), so a busy event loop in the job cannot starve it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from workers import events
from workers.errors import BenchbotError, LeaseLostError

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 30.0
HOSTS_KEY = "benchbot:lease:hosts"
# Must match workers.queue.queue_name(); spelled out here because queue.py imports this module.
RQ_QUEUE_KEY_PREFIX = "rq:queue:benchbot-"
QUEUED_MARK = "queued"


def lease_key(host: str) -> str:
    """Key holding the current holder of ``host``."""
    return f"benchbot:lease:{host}"


def fence_key(host: str) -> str:
    """Counter of grants for ``host``: the fencing token source."""
    return f"benchbot:fence:{host}"


def state_key(host: str) -> str:
    """Hash of host state written under the lease (e.g. the server we launched)."""
    return f"benchbot:host:{host}:state"


def _last_key(host: str) -> str:
    return f"benchbot:lease:{host}:last"


def _waiters_key(host: str) -> str:
    return f"benchbot:lease:{host}:waiters"


def _waiter_prefix(host: str) -> str:
    return f"benchbot:lease:{host}:waiter:"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# KEYS: lease, fence, last, waiters, rq queue list, hosts set.
# ARGV: job, holder json (without fence), ttl_ms, waiter key prefix, host.
# Returns {1, holder, previous last or false} on success, {0, blocker} otherwise.
_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then return {0, 'lease', cur} end
local members = redis.call('ZRANGE', KEYS[4], 0, -1)
for _, m in ipairs(members) do
  if m == ARGV[1] then break end
  local state = redis.call('GET', ARGV[4] .. m)
  if state then
    if state ~= 'queued' then return {0, 'waiter', m} end
    -- 'queued' and gone from RQ's list: a worker just dequeued it and is about to start it.
    -- Still in RQ's list although ahead of us (requeued out of order): skip it, or a single
    -- worker would wait forever for a job it can only start after this one.
    if not redis.call('LPOS', KEYS[5], m) then return {0, 'waiter', m} end
  end
end
local fence = redis.call('INCR', KEYS[2])
local holder = cjson.decode(ARGV[2])
holder['fence'] = fence
local value = cjson.encode(holder)
redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
local prev = redis.call('GET', KEYS[3])
redis.call('SET', KEYS[3], value)
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('DEL', ARGV[4] .. ARGV[1])
redis.call('SADD', KEYS[6], ARGV[5])
return {1, value, prev}
"""

# KEYS: lease.  ARGV: job, fence, ttl_ms.
_RENEW = """
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local h = cjson.decode(cur)
if tostring(h['job']) ~= ARGV[1] or tostring(h['fence']) ~= ARGV[2] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS: lease, last.  ARGV: job, fence ('' = any fence: release by job id).
_RELEASE = """
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local h = cjson.decode(cur)
if tostring(h['job']) ~= ARGV[1] then return 0 end
if ARGV[2] ~= '' and tostring(h['fence']) ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('GET', KEYS[2]) == cur then redis.call('DEL', KEYS[2]) end
return 1
"""

# KEYS: lease, state hash.  ARGV: fence, field, value, delete flag.
_FENCED_SET = """
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local h = cjson.decode(cur)
if tostring(h['fence']) ~= ARGV[1] then return 0 end
if ARGV[4] == '1' then redis.call('HDEL', KEYS[2], ARGV[2]) else redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
return 1
"""

# KEYS: lease, last.  The record of a holder whose lease expired without a release, taken once.
_TAKE_ORPHAN = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local v = redis.call('GET', KEYS[2])
if v then redis.call('DEL', KEYS[2]) end
return v
"""

# KEYS: waiters.  ARGV: job, waiter key.  Removes a waiter whose liveness key is gone.
_DROP_DEAD_WAITER = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
if redis.call('EXISTS', ARGV[2]) == 1 then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
"""


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a host: shown by ``status`` and used to report a dead holder's job."""

    user: str
    job: str
    worker: str
    since: float
    fence: int
    seq: int | None = None
    ttl_ms: int = int(DEFAULT_TTL_S * 1000)

    @classmethod
    def from_json(cls, raw: Any) -> LeaseHolder:
        """Parse the JSON stored in the lease key."""
        body = json.loads(_text(raw))
        seq = body.get("seq")
        return cls(
            user=str(body.get("user", "")),
            job=str(body.get("job", "")),
            worker=str(body.get("worker", "")),
            since=float(body.get("since", 0.0)),
            fence=int(body.get("fence", 0)),
            seq=int(seq) if isinstance(seq, int | float) else None,
            ttl_ms=int(body.get("ttl_ms", DEFAULT_TTL_S * 1000)),
        )


def default_worker_name() -> str:
    """The RQ worker's name inside a horse, else host:pid."""
    return os.environ.get("RQ_WORKER_ID") or f"{socket.gethostname()}:{os.getpid()}"


def own_client(r: redis.Redis) -> redis.Redis:
    """A client with its own connection pool on the same server (for threads that must not share)."""
    pool = r.connection_pool
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class,
                                                            **pool.connection_kwargs))


# ---- the line of waiters ----------------------------------------------------------------------


def add_waiter(r: redis.Redis | redis.client.Pipeline, host: str, job_id: str, seq: int) -> None:
    """Put a just-enqueued job in the host's line (liveness "queued", no TTL until dequeued)."""
    r.zadd(_waiters_key(host), {job_id: seq}, nx=True)
    r.set(_waiter_prefix(host) + job_id, QUEUED_MARK)
    r.sadd(HOSTS_KEY, host)


def mark_dequeued(r: redis.Redis, host: str, job_id: str, worker: str, ttl_s: float) -> bool:
    """A worker took the job: from now on its liveness expires unless the job refreshes it."""
    return bool(r.set(_waiter_prefix(host) + job_id, worker, px=int(ttl_s * 1000), xx=True))


def remove_waiter(r: redis.Redis, host: str, job_id: str) -> None:
    """Leave the line (the job ended or was cancelled before it got the host)."""
    pipe = r.pipeline()
    pipe.zrem(_waiters_key(host), job_id)
    pipe.delete(_waiter_prefix(host) + job_id)
    pipe.execute()


def waiting_jobs(r: redis.Redis, host: str) -> list[str]:
    """Job ids in the host's line, in order (live or not yet reaped)."""
    return [_text(m) for m in r.zrange(_waiters_key(host), 0, -1)]


# ---- the lease --------------------------------------------------------------------------------


class Lease:
    """A granted lease: renew it from a heartbeat thread, check it before touching the host, release it."""

    def __init__(self, r: redis.Redis, host: str, holder: LeaseHolder) -> None:
        self.redis = r
        self.host = host
        self.holder = holder
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_lost: Callable[[], None] | None = None

    @property
    def job(self) -> str:
        return self.holder.job

    @property
    def fence(self) -> int:
        return self.holder.fence

    @property
    def ttl_s(self) -> float:
        return self.holder.ttl_ms / 1000

    @property
    def lost(self) -> bool:
        """True once a renewal failed: someone else may hold the host now."""
        return self._lost.is_set()

    def check(self) -> None:
        """Raise :class:`LeaseLostError` if the lease was lost."""
        if self.lost:
            raise LeaseLostError(f"lost the lease on {self.host}: another worker may hold it; stopped touching it")

    def renew(self, client: redis.Redis | None = None) -> bool:
        """Push the expiry one TTL ahead if we still hold it (job id and fence must match)."""
        ok = (client or self.redis).eval(
            _RENEW, 1, lease_key(self.host), self.job, str(self.fence), self.holder.ttl_ms
        )
        return bool(ok)

    def release(self) -> bool:
        """Stop the heartbeat and give the host back; False if we no longer held it."""
        self.stop_heartbeat()
        return bool(
            self.redis.eval(_RELEASE, 2, lease_key(self.host), _last_key(self.host), self.job, str(self.fence))
        )

    def fenced_set(self, key: str, value: str | dict[str, Any] | None) -> None:
        """Write host state under this lease's fence."""
        fenced_set(self.redis, self.host, key, value, self.fence)

    def _mark_lost(self, why: str) -> None:
        if self._lost.is_set():
            return
        self._lost.set()
        log.warning("lease on %s for job %s lost: %s", self.host, self.job, why)
        if self._on_lost is not None:
            try:
                self._on_lost()
            except Exception:
                log.exception("on_lost callback failed")

    def start_heartbeat(self, on_lost: Callable[[], None] | None = None, interval_s: float | None = None) -> None:
        """Renew every TTL/3 from a daemon thread with its own client until released."""
        if self._thread is not None:
            return
        self._on_lost = on_lost
        interval = interval_s if interval_s is not None else self.ttl_s / 3
        self._thread = threading.Thread(
            target=self._beat, args=(interval,), name=f"lease-{self.host}-{self.job}", daemon=True
        )
        self._thread.start()

    def _beat(self, interval: float) -> None:
        client = own_client(self.redis)
        last_ok = time.monotonic()
        try:
            while not self._stop.wait(interval):
                try:
                    if self.renew(client):
                        last_ok = time.monotonic()
                        continue
                    self._mark_lost("renewal refused (expired or taken over)")
                    return
                except redis.RedisError as exc:
                    # We cannot prove we still hold it once a full TTL passed without a renewal.
                    if time.monotonic() - last_ok >= self.ttl_s:
                        self._mark_lost(f"no successful renewal for a whole TTL ({exc.__class__.__name__})")
                        return
        finally:
            client.close()

    def stop_heartbeat(self) -> None:
        """Stop renewing (the lease then expires within one TTL unless released)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def __enter__(self) -> Lease:
        self.start_heartbeat()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder_json(job: str, user: str, worker: str, seq: int | None, ttl_ms: int) -> str:
    return json.dumps({"user": user, "job": job, "worker": worker, "since": time.time(), "seq": seq,
                       "ttl_ms": ttl_ms})


def try_acquire(
    r: redis.Redis,
    host: str,
    *,
    job: str,
    user: str,
    worker: str | None = None,
    seq: int | None = None,
    ttl_s: float = DEFAULT_TTL_S,
) -> Lease | tuple[str, str]:
    """One attempt: a :class:`Lease`, or ``(kind, blocker)`` saying what is in the way.

    kind is "lease" (blocker = the holder's JSON) or "waiter" (blocker = the job id ahead in line).
    A job that is not in the line counts as behind everyone in it.
    """
    ttl_ms = max(1, int(ttl_s * 1000))
    reply = r.eval(
        _ACQUIRE,
        6,
        lease_key(host),
        fence_key(host),
        _last_key(host),
        _waiters_key(host),
        RQ_QUEUE_KEY_PREFIX + host,
        HOSTS_KEY,
        str(job),
        _holder_json(str(job), user, worker or default_worker_name(), seq, ttl_ms),
        ttl_ms,
        _waiter_prefix(host),
        host,
    )
    if int(reply[0]) != 1:
        return _text(reply[1]), _text(reply[2])
    lease = Lease(r, host, LeaseHolder.from_json(reply[1]))
    previous = reply[2] if len(reply) > 2 else None
    if previous:
        _report_dead_holder(r, host, LeaseHolder.from_json(previous))
    return lease


def acquire(
    r: redis.Redis,
    host: str,
    *,
    job: str,
    user: str,
    worker: str | None = None,
    seq: int | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    poll_s: float = 0.1,
    timeout_s: float | None = None,
    abort: Callable[[], None] | None = None,
    on_wait: Callable[[str, str], None] | None = None,
) -> Lease:
    """Wait in line for the host and take the lease; the caller then starts its heartbeat.

    With ``seq`` the job waits in the FIFO (registered if enqueue did not); while waiting it keeps
    its liveness key fresh so others do not skip it. ``abort`` is called every poll and may raise
    (e.g. on cancel); ``on_wait(kind, blocker)`` is called whenever what blocks us changes.
    On any exit without a lease the job leaves the line.
    """
    worker = worker or default_worker_name()
    waiter_key = _waiter_prefix(host) + str(job)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    refresh_every = max(0.05, ttl_s / 4)
    last_refresh = 0.0
    last_blocker: tuple[str, str] | None = None
    try:
        while True:
            now = time.monotonic()
            if seq is not None and now - last_refresh >= refresh_every:
                pipe = r.pipeline()
                pipe.zadd(_waiters_key(host), {str(job): seq}, nx=True)
                pipe.set(waiter_key, worker, px=max(1, int(ttl_s * 1000)))
                pipe.sadd(HOSTS_KEY, host)
                pipe.execute()
                last_refresh = now
            got = try_acquire(r, host, job=str(job), user=user, worker=worker, seq=seq, ttl_s=ttl_s)
            if isinstance(got, Lease):
                return got
            if got != last_blocker:
                last_blocker = got
                if on_wait is not None:
                    on_wait(*got)
            if abort is not None:
                abort()
            if deadline is not None and time.monotonic() > deadline:
                raise BenchbotError(f"gave up waiting for host {host} after {timeout_s:g} s")
            time.sleep(poll_s)
    except BaseException:
        remove_waiter(r, host, str(job))
        raise


def release_job(r: redis.Redis, host: str, job_id: str) -> bool:
    """Release the host if ``job_id`` holds it, whatever its fence (used after a hard stop)."""
    return bool(r.eval(_RELEASE, 2, lease_key(host), _last_key(host), str(job_id), ""))


def current_holder(r: redis.Redis, host: str) -> tuple[LeaseHolder, int] | None:
    """Who holds ``host`` and for how many more milliseconds, or None if it is free."""
    pipe = r.pipeline()
    pipe.get(lease_key(host))
    pipe.pttl(lease_key(host))
    raw, ttl_ms = pipe.execute()
    if raw is None or ttl_ms == -2:
        return None
    return LeaseHolder.from_json(raw), int(ttl_ms)


def fenced_set(r: redis.Redis, host: str, key: str, value: str | dict[str, Any] | None, fence: int) -> None:
    """Write (or with ``value=None`` delete) one field of the host state, only under the current fence.

    Raises :class:`LeaseLostError` when ``fence`` is not the current lease's: the caller's lease
    expired and someone else may be driving the host.
    """
    text = json.dumps(value) if isinstance(value, dict) else ("" if value is None else str(value))
    ok = r.eval(
        _FENCED_SET, 2, lease_key(host), state_key(host), str(int(fence)), key, text, "1" if value is None else "0"
    )
    if not ok:
        raise LeaseLostError(
            f"refused to record {key!r} for {host}: fence {fence} is stale (the lease expired or moved on)"
        )


def host_state(r: redis.Redis, host: str) -> dict[str, str]:
    """All host state fields written through :func:`fenced_set`."""
    return {_text(k): _text(v) for k, v in r.hgetall(state_key(host)).items()}


# ---- noticing dead jobs -----------------------------------------------------------------------


def _report_dead_holder(r: redis.Redis, host: str, holder: LeaseHolder) -> None:
    ttl_s = holder.ttl_ms / 1000
    message = f"worker died: lease expired after {ttl_s:g} s without renewal"
    published = events.publish(
        r,
        holder.job,
        events.FAILED,
        {"message": message,
         "diagnosis": {"category": "worker_died", "summary": message, "host": host, "worker": holder.worker}},
    )
    if published is not None:
        log.warning("job %s on %s: %s (worker %s)", holder.job, host, message, holder.worker)


def _rq_job_gone(r: redis.Redis, job_id: str) -> bool:
    """True if RQ no longer has the job, or has it in a final state (deleted, cancelled, failed...)."""
    raw = r.hget(f"rq:job:{job_id}", "status")
    if raw is None:
        return True
    return _text(raw) in {"finished", "failed", "stopped", "canceled"}


def reap_dead_jobs(r: redis.Redis) -> list[str]:
    """Report jobs whose worker died, on every known host; returns the job ids reported.

    Called from each worker's maintenance loop every few seconds so a dead job gets its ``failed``
    event even when no next job comes to take the host.
    """
    reported: list[str] = []
    for raw_host in r.smembers(HOSTS_KEY):
        host = _text(raw_host)
        orphan = r.eval(_TAKE_ORPHAN, 2, lease_key(host), _last_key(host))
        if orphan:
            holder = LeaseHolder.from_json(orphan)
            if not events.is_terminal(r, holder.job):
                _report_dead_holder(r, host, holder)
                reported.append(holder.job)
        for job_id in waiting_jobs(r, host):
            waiter = _waiter_prefix(host) + job_id
            if r.eval(_DROP_DEAD_WAITER, 1, _waiters_key(host), job_id, waiter):
                published = events.publish(
                    r,
                    job_id,
                    events.FAILED,
                    {"message": f"worker died while job {job_id} was waiting for {host}",
                     "diagnosis": {"category": "worker_died", "host": host,
                                   "summary": "the worker running this job died"}},
                )
                if published is not None:
                    reported.append(job_id)
                continue
            if _text(r.get(waiter) or b"") == QUEUED_MARK and _rq_job_gone(r, job_id):
                # Deleted or failed outside benchbot (rq empty, stuck in RQ's intermediate queue...).
                remove_waiter(r, host, job_id)
                published = events.publish(
                    r, job_id, events.FAILED, {"message": f"job {job_id} left the queue without running"}
                )
                if published is not None:
                    reported.append(job_id)
    return reported


def waiters(r: redis.Redis, host: str) -> list[tuple[str, str | None]]:
    """The host's line in order: (job id, liveness) with liveness "queued", a worker name, or None (dead)."""
    ids = waiting_jobs(r, host)
    if not ids:
        return []
    values = r.mget([_waiter_prefix(host) + job_id for job_id in ids])
    return [(job_id, None if v is None else _text(v)) for job_id, v in zip(ids, values, strict=True)]


def liveness(r: redis.Redis, entries: list[tuple[str, str]]) -> list[str | None]:
    """Liveness of (host, job id) entries of any lines, in one round trip: "queued", a worker, or None."""
    if not entries:
        return []
    values = r.mget([_waiter_prefix(host) + job_id for host, job_id in entries])
    return [None if v is None else _text(v) for v in values]


def known_hosts(r: redis.Redis) -> list[str]:
    """Every host that ever had a job enqueued or a lease granted."""
    return sorted(_text(h) for h in r.smembers(HOSTS_KEY))
