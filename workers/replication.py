"""Writes that must outlive a failover: ``WAIT`` for a replica's acknowledgement when there is one.

Redis replicates asynchronously: a write the primary acknowledged can be gone after Sentinel promotes
a replica that had not received it yet. Two of benchbot's writes must not vanish that way:

* **a lease grant** (and with it the fence ``INCR``, the waiter's removal and, earlier in the same
  replication stream, RQ's dequeue): a new primary without it would grant the host, with the *same*
  fence number, to the next job while this one works on it. The host's fence file accepts a token
  equal to the one it holds, so it could not tell the two apart.
* **an enqueue the bot answered "queued" for**: else the user is told of a job that no longer exists.

Hence :func:`confirm_write`: after such a write, the caller's connection sends ``WAIT 1 <timeout>``,
which returns once a replica has everything that connection wrote. Sentinel promotes the replica with
the largest replication offset, so one acknowledgement is enough for the promoted one to hold the
write (unless that replica is itself excluded from promotion: ``replica-priority 0``, or disconnected
for longer than ``down-after-milliseconds * 10``; see docs/reliability.md). A primary without replicas
answers at once without a ``WAIT`` (nothing to fail over to): a standalone Redis pays one cached
``ROLE`` a second.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable

import redis

from workers.errors import BenchbotError

ACK_TIMEOUT_ENV = "BENCHBOT_REDIS_REPLICA_ACK_MS"
DEFAULT_ACK_TIMEOUT_MS = 2000
#: How long a ``ROLE`` answer ("this primary has N replicas") is reused.
ROLE_CACHE_S = 1.0


class NotReplicated(redis.ConnectionError):
    """The primary took a write but no replica confirmed it in time: treated like Redis being away.

    A ``ConnectionError`` on purpose: every place that waits out a Redis restart (the lease wait, the
    worker's loop) then waits this out too, and retries once the replicas keep up again.
    """


def ack_timeout_ms() -> int:
    """How long a write waits for a replica: ``BENCHBOT_REDIS_REPLICA_ACK_MS`` (default 2000 ms)."""
    raw = os.environ.get(ACK_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_ACK_TIMEOUT_MS
    if not raw.isdigit() or not 10 <= int(raw) <= 60_000:
        raise BenchbotError(f"{ACK_TIMEOUT_ENV} must be a number of milliseconds from 10 to 60000, not {raw!r}")
    return int(raw)


log = logging.getLogger(__name__)
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


_role_lock = threading.Lock()
_role_cache: weakref.WeakKeyDictionary[redis.ConnectionPool, tuple[float, int]] = weakref.WeakKeyDictionary()


def replica_count(r: redis.Redis, *, fresh: bool = False) -> int:
    """How many replicas the primary behind ``r`` has connected (``ROLE``), cached for a second."""
    pool = r.connection_pool
    now = time.monotonic()
    if not fresh:
        with _role_lock:
            cached = _role_cache.get(pool)
        if cached is not None and now - cached[0] < ROLE_CACHE_S:
            return cached[1]
    try:
        role = r.execute_command("ROLE")
    except redis.ResponseError as exc:  # an ACL or a managed Redis that refuses ROLE: cannot tell, do not block
        _warn_once(f"cannot ask Redis for its replicas (ROLE: {exc}); grants and enqueues are not confirmed")
        role = ["unknown"]
    kind = role[0].decode() if isinstance(role[0], bytes) else str(role[0])
    count = len(role[2]) if kind == "master" and len(role) > 2 else 0
    with _role_lock:
        _role_cache[pool] = (now, count)
    return count


def confirm_write(
    r: redis.Redis, write: Callable[[redis.client.Pipeline], object], *, timeout_ms: int | None = None
) -> tuple[object, bool]:
    """Run ``write`` (queued on a pipeline) and, where the primary has replicas, wait for one to have it.

    Returns ``(reply of write, confirmed)``; ``confirmed`` is True when a replica acknowledged it or
    the primary has none. The ``WAIT`` goes down the same connection as the write (one pipeline), as
    it must: ``WAIT`` counts the bytes *that connection* wrote.
    """
    replicas = replica_count(r)
    pipe = r.pipeline(transaction=False)
    write(pipe)
    if replicas:
        pipe.execute_command("WAIT", 1, timeout_ms or ack_timeout_ms())
    replies = pipe.execute(raise_on_error=False)
    if isinstance(replies[0], Exception):
        raise replies[0]
    if not replicas:
        return replies[0], True
    if isinstance(replies[-1], redis.ResponseError):  # WAIT refused (renamed or disabled): say so once, go on
        _warn_once(f"Redis refused WAIT ({replies[-1]}); grants and enqueues are not confirmed by a replica")
        return replies[0], True
    if isinstance(replies[-1], Exception):
        raise replies[-1]
    if int(replies[-1]) >= 1:
        return replies[0], True
    # No acknowledgement: maybe the replica just went (then there is nothing to fail over to).
    return replies[0], replica_count(r, fresh=True) == 0
