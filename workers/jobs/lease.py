"""The exclusive lease on a GPU host: one job touches a host at a time, in enqueue order.

Shape (the keys are named in :mod:`workers.keys`):

* :func:`~workers.keys.lease`: JSON holder ``{user, job, worker, since, fence, seq, ttl_ms}`` with a PX TTL. The TTL
  is the crash detector: a SIGKILLed horse skips every ``finally``, and RQ notices an abandoned job only
  after 90-690 s, so the lease expires by itself one TTL after the last heartbeat.
* :func:`~workers.keys.lease_fence`: a counter incremented in the same Lua step that grants the lease. Every write of
  host state goes through :func:`workers.jobs.host_state.fenced_set`, which refuses a fence that is not
  the current lease's, so a holder that paused past its TTL cannot clobber what the next holder wrote.
* :func:`~workers.keys.lease_last`: the holder record, kept without TTL until a clean release. If a lease expires
  while it is still there, its job's worker died; whoever notices first (the next acquirer here, or
  :func:`workers.jobs.reaper.reap_dead_jobs`) publishes ``failed`` for that job
  (:func:`report_dead_holder`).

Who may take a free lease is decided by the line of waiters (:mod:`workers.jobs.waiting_line`): only
the first live waiter, so jobs run in enqueue order.

Renewal runs on a daemon thread with its own Redis client and no thread-local token (the token is
the job id plus the fence), so a busy event loop in the job cannot starve it.

Before every side effect on the host (spawn, signal, a bench request) the job calls
:meth:`FenceCheck.check`: one Lua round trip that passes only if the lease key still names this job
and fence *and* has at least ``margin`` left, so whatever the job does next lands before the lease
can expire. A pass (and every heartbeat renewal) leaves a local deadline on the monotonic clock,
``t0 + remaining - margin`` with ``t0`` read *before* the Redis call; until it passes a check is a
clock comparison, after it (a paused process wakes with it long gone) the check asks Redis again.
See docs/reliability.md, "Fenced side effects".
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

import redis

from workers import keys, replication
from workers.errors import BenchbotError, LeaseLostError
from workers.jobs import events, waiting_line
from workers.jobs.fence_check import FenceCheck, check_margin, default_margin_s
from workers.jobs.lease_holder import DEFAULT_TTL_S, LeaseHolder
from workers.redis_conn import REDIS_DOWN, RedisOutage, sibling_pool, text_client

log = logging.getLogger(__name__)


lease_key = keys.lease
fence_key = keys.lease_fence
last_key = keys.lease_last


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

# KEYS: lease, fence counter, last.  ARGV: job, fence, floor (what the host's fence file holds).
# A new fence above the floor for the lease we hold, only if no lease was granted after ours (the counter
# is still our fence): then the host's higher token came from a Redis that since forgot its counter.
# Returns the new fence, or 0 (not ours, or someone was granted after us: we are truly stale).
_REFENCE = """
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local h = cjson.decode(cur)
if tostring(h['job']) ~= ARGV[1] or tostring(h['fence']) ~= ARGV[2] then return 0 end
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[2]) then return 0 end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then return 0 end
local fence = tonumber(ARGV[3]) + 1
redis.call('SET', KEYS[2], fence)
h['fence'] = fence
local value = cjson.encode(h)
redis.call('SET', KEYS[1], value, 'PX', ttl)
if redis.call('GET', KEYS[3]) == cur then redis.call('SET', KEYS[3], value) end
return fence
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


def default_worker_name() -> str:
    """The RQ worker's name inside a horse, else host:pid."""
    return os.environ.get("RQ_WORKER_ID") or f"{socket.gethostname()}:{os.getpid()}"


def own_client(r: redis.Redis) -> redis.Redis:
    """A client with its own connection pool on the same server (for threads that must not share)."""
    return redis.Redis(connection_pool=sibling_pool(r.connection_pool))


# ---- the lease --------------------------------------------------------------------------------


class Lease:
    """A granted lease: renew it from a heartbeat thread, check it before touching the host, release it."""

    def __init__(
        self, r: redis.Redis, host: str, holder: LeaseHolder, *, margin_s: float | None = None, valid_until: float = 0.0
    ) -> None:
        self.redis = r
        self.host = host
        self.holder = holder
        margin = default_margin_s(holder.ttl_ms / 1000) if margin_s is None else margin_s
        self.checker = FenceCheck(
            r, host, holder.job, holder.fence, check_margin(holder.ttl_ms / 1000, margin), valid_until
        )
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
    def margin_s(self) -> float:
        return self.checker.margin_s

    @property
    def lost(self) -> bool:
        """True once a renewal or a check found the lease gone: someone else may hold the host now."""
        return self._lost.is_set() or self.checker.lost_reason is not None

    def check(self) -> None:
        """Raise :class:`LeaseLostError` unless the lease is ours with the margin left (see FenceCheck)."""
        self.checker.check()

    def renew(self, client: redis.Redis | None = None) -> bool:
        """Push the expiry one TTL ahead if we still hold it (job id and fence must match)."""
        t0 = time.monotonic()
        redis_client = client or self.redis
        fence = self.fence
        ok = bool(redis_client.eval(_RENEW, 1, lease_key(self.host), self.job, str(fence), self.holder.ttl_ms))
        if not ok and self.fence != fence:  # re-fenced (refence_above) while this renewal was on its way
            ok = bool(redis_client.eval(_RENEW, 1, lease_key(self.host), self.job, str(self.fence), self.holder.ttl_ms))
        if ok:
            self.checker.extend(t0 + self.ttl_s - self.checker.margin_s)
        return ok

    def refence_above(self, floor: int) -> int | None:
        """Take a fence above ``floor`` (the token a host's fence file holds) for this same lease.

        Only when Redis granted no lease after ours, which means the host's higher token was issued by a
        Redis that since lost its counter (restarted without persistence): then every job on the host
        would be refused as stale forever. Returns the new fence, or None when we are really stale.
        """
        fence = int(
            self.redis.eval(
                _REFENCE,
                3,
                lease_key(self.host),
                fence_key(self.host),
                last_key(self.host),
                self.job,
                str(self.fence),
                int(floor),
            )
        )
        if not fence:
            return None
        self.holder = dataclasses.replace(self.holder, fence=fence)
        self.checker.fence = fence
        log.warning(
            "lease on %s for job %s: fence counter was behind the host's (%d); now %d",
            self.host,
            self.job,
            floor,
            fence,
        )
        return fence

    def release(self) -> bool:
        """Stop the heartbeat and give the host back; False if we no longer held it."""
        self.stop_heartbeat()
        self.checker.lose("it was released")
        return bool(self.redis.eval(_RELEASE, 2, lease_key(self.host), last_key(self.host), self.job, str(self.fence)))

    def _mark_lost(self, why: str) -> None:
        if self._lost.is_set():
            return
        self.checker.lose(why)
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
                    t0 = time.monotonic()
                    if self.renew(client):  # also moves the fence deadline to t0 + TTL - margin
                        last_ok = t0
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


def _holder_json(job: str, user: str, worker: str, seq: int | None, ttl_ms: int, gang: tuple[str, ...] = ()) -> str:
    holder = {"user": user, "job": job, "worker": worker, "since": time.time(), "seq": seq, "ttl_ms": ttl_ms}
    return json.dumps({**holder, "gang": list(gang)} if gang else holder)


def try_acquire(
    r: redis.Redis,
    host: str,
    *,
    job: str,
    user: str,
    worker: str | None = None,
    seq: int | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    margin_s: float | None = None,
    gang: tuple[str, ...] = (),
) -> Lease | tuple[str, str]:
    """One attempt: a :class:`Lease`, or ``(kind, blocker)`` saying what is in the way.

    kind is "lease" (blocker = the holder's JSON) or "waiter" (blocker = the job id ahead in line).
    A job that is not in the line counts as behind everyone in it. ``margin_s`` is the lease's
    fence-check margin (default :func:`default_margin_s`); ``gang`` names every host of the gang this
    lease is one member of (:mod:`workers.jobs.gang_lease`), so ``/status`` can say so.
    """
    ttl_ms = max(1, int(ttl_s * 1000))
    worker_name = worker or default_worker_name()
    t0 = time.monotonic()  # the granted TTL runs from after this instant
    reply = text_client(r).eval(
        _ACQUIRE,
        6,
        lease_key(host),
        fence_key(host),
        last_key(host),
        waiting_line.waiters_key(host),
        keys.rq_queue(host),
        waiting_line.HOSTS_KEY,
        str(job),
        _holder_json(str(job), user, worker_name, seq, ttl_ms, gang),
        ttl_ms,
        waiting_line.waiter_prefix(host),
        host,
    )
    if int(reply[0]) != 1:
        if reply[1] == "lease" and _ours(reply[2], str(job), worker_name):
            # Granted to us on a primary that died before we heard back, and the grant reached the
            # replica that took over: it is ours, not a dead holder's (waiting would report ourselves dead).
            holder = LeaseHolder.from_json(reply[2])
            margin = default_margin_s(holder.ttl_ms / 1000) if margin_s is None else margin_s
            lease = Lease(r, host, holder, margin_s=margin)  # no proof yet: the first check asks Redis
            _confirm_replicated(lease)
            log.warning("lease on %s for job %s: granted before a failover, kept after it", host, job)
            return lease
        return reply[1], reply[2]
    holder = LeaseHolder.from_json(reply[1])
    margin = default_margin_s(holder.ttl_ms / 1000) if margin_s is None else margin_s
    lease = Lease(r, host, holder, margin_s=margin, valid_until=t0 + holder.ttl_ms / 1000 - margin)
    _confirm_replicated(lease)
    previous = reply[2] if len(reply) > 2 else None
    if previous:
        report_dead_holder(r, host, LeaseHolder.from_json(previous))
    return lease


def _ours(raw: str, job: str, worker: str) -> bool:
    """True when the lease JSON ``raw`` names this job on this worker (one horse per worker at a time)."""
    holder = LeaseHolder.from_json(raw)
    return holder.job == job and holder.worker == worker


def _confirm_replicated(lease: Lease) -> None:
    """Make the grant durable before the job touches the host: a renewal and ``WAIT`` for a replica.

    The renewal is a write later in the replication stream than the grant (and RQ's dequeue before
    it), so a replica that has it has them all. Unconfirmed (replicas lagging past the timeout), the
    lease is given back and :class:`~workers.replication.NotReplicated` raised: a failover now could
    hand the host and the same fence to another job. See :mod:`workers.replication`.
    """
    client = text_client(lease.redis)
    t0 = time.monotonic()
    renewed, confirmed = replication.confirm_write(
        client,
        lambda pipe: pipe.eval(_RENEW, 1, lease_key(lease.host), lease.job, str(lease.fence), lease.holder.ttl_ms),
    )
    if not renewed:
        lease.checker.lose("it expired before it could be confirmed")
        raise LeaseLostError(f"the lease on {lease.host} was gone before a replica confirmed it")
    if not confirmed:
        with contextlib.suppress(*REDIS_DOWN):
            lease.release()
        raise replication.NotReplicated(
            f"no replica confirmed the lease on {lease.host} within {replication.ack_timeout_ms()} ms; "
            "not touching the host until one does"
        )
    lease.checker.extend(t0 + lease.ttl_s - lease.margin_s)


def acquire(
    r: redis.Redis,
    host: str,
    *,
    job: str,
    user: str,
    worker: str | None = None,
    seq: int | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    margin_s: float | None = None,
    poll_s: float = 0.1,
    timeout_s: float | None = None,
    abort: Callable[[], None] | None = None,
    on_wait: Callable[[str, str], None] | None = None,
    outage: RedisOutage | None = None,
    gang: tuple[str, ...] = (),
) -> Lease:
    """Wait in line for the host and take the lease; the caller then starts its heartbeat.

    With ``seq`` the job waits in the FIFO (registered if enqueue did not); while waiting it keeps
    its liveness key fresh so others do not skip it. ``abort`` is called every poll and may raise
    (e.g. on cancel); ``on_wait(kind, blocker)`` is called whenever what blocks us changes.
    With ``outage``, a Redis that goes away while the job waits is waited for (its limit applies), and
    the job refreshes its place in line as soon as Redis is back: a restart does not cost a queued job
    its turn (workers do not reap for a TTL after an outage). Without it a Redis error is raised.
    On any exit without a lease the job leaves the line.
    """
    worker = worker or default_worker_name()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    refresh_every = max(0.05, ttl_s / 4)
    last_refresh = 0.0
    last_blocker: tuple[str, str] | None = None
    try:
        while True:
            try:
                now = time.monotonic()
                if seq is not None and now - last_refresh >= refresh_every:
                    waiting_line.keep_waiting(r, host, str(job), seq, worker, ttl_s)
                    last_refresh = now
                got = try_acquire(
                    r, host, job=str(job), user=user, worker=worker, seq=seq, ttl_s=ttl_s, margin_s=margin_s, gang=gang
                )
                if isinstance(got, Lease):
                    return got
                if got != last_blocker:
                    last_blocker = got
                    if on_wait is not None:
                        on_wait(*got)
                if abort is not None:
                    abort()
            except REDIS_DOWN as exc:
                if outage is None:
                    raise
                outage.wait(r, exc)  # RedisGoneTooLong past its limit
                last_refresh = 0.0  # back in line at once, before anyone could take our turn
                continue
            if deadline is not None and time.monotonic() > deadline:
                raise BenchbotError(f"gave up waiting for host {host} after {timeout_s:g} s")
            time.sleep(poll_s)
    except BaseException:
        with contextlib.suppress(*REDIS_DOWN):
            waiting_line.remove_waiter(r, host, str(job))
        raise


def release_job(r: redis.Redis, host: str, job_id: str) -> bool:
    """Release the host if ``job_id`` holds it, whatever its fence (used after a hard stop)."""
    return bool(r.eval(_RELEASE, 2, lease_key(host), last_key(host), str(job_id), ""))


def current_holder(r: redis.Redis, host: str) -> tuple[LeaseHolder, int] | None:
    """Who holds ``host`` and for how many more milliseconds, or None if it is free."""
    pipe = text_client(r).pipeline()
    pipe.get(lease_key(host))
    pipe.pttl(lease_key(host))
    raw, ttl_ms = pipe.execute()
    if raw is None or ttl_ms == -2:
        return None
    return LeaseHolder.from_json(raw), int(ttl_ms)


def report_dead_holder(r: redis.Redis, host: str, holder: LeaseHolder) -> None:
    """Publish ``failed`` for a job whose lease expired without a release: its worker died."""
    ttl_s = holder.ttl_ms / 1000
    message = f"worker died: lease expired after {ttl_s:g} s without renewal"
    published = events.publish(
        r,
        holder.job,
        events.FAILED,
        {
            "message": message,
            "diagnosis": {"category": "worker_died", "summary": message, "host": host, "worker": holder.worker},
        },
    )
    if published is not None:
        log.warning("job %s on %s: %s (worker %s)", holder.job, host, message, holder.worker)
