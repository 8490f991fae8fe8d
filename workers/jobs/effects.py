"""The effect journal: every fenced action a job took on its host, with the fence it carried, on a Redis stream.

The job's events say what a job did in words; this says what it did *to the host*: each claim, spawn,
signal and unlink the host-side actuator answered (or refused), the fence token it carried, the process
it named or started, and when it began and ended on the worker's wall clock. A history checker
(``bench/history_check.py``) reads it beside the events to prove, per host, that no two jobs' actions
overlapped and that each carried the fence of the lease held then. Nothing reads it to decide anything.

A spawn is journaled twice: ``asked`` before the actuator runs, then its outcome. An engine outlives a job
killed between the two (its horse SIGKILLed while the actuator ran), and the ask is what accounts for it.
A record that cannot be written (Redis restarting, a Sentinel failover) is kept and written with the next
one, or when the job's transport closes: :meth:`EffectJournal.drain` then waits the outage out, up to
:data:`DRAIN_WAIT_S` (the long soak lost three spawns' records to a single try there: the job's ending,
written just after, had waited for Redis and reached it). One that still cannot be written is lost from the
journal, never from the host.
"""

from __future__ import annotations

import asyncio
import json
import time

import redis

from workers import keys
from workers.json_value import JsonObject
from workers.redis_conn import text_client

#: Enough for a host's last few thousand jobs (a job takes a handful of actions); ~ trimming keeps the newest.
MAXLEN = 50_000
TTL_S = 7 * 24 * 3600
#: How long a job's end waits for Redis to take its last records: a restart takes 1-2 s, a failover 5-6 s.
DRAIN_WAIT_S = 30.0


class EffectJournal:
    """The ``Transport.on_effect`` of one job on one host: each record gets the job and host, then goes to Redis."""

    def __init__(self, r: redis.Redis, host: str, job: str) -> None:
        self._redis = text_client(r)
        self.host = host
        self.job = str(job)
        self._pending: list[str] = []
        self.failed_flushes = 0

    def __call__(self, record: JsonObject) -> None:
        self._pending.append(json.dumps({"job": self.job, "host": self.host, **record}, separators=(",", ":")))
        self.flush()

    def flush(self) -> bool:
        """Write what is pending; False (kept for the next try) while Redis cannot be reached."""
        try:
            while self._pending:
                pipe = self._redis.pipeline()
                pipe.xadd(keys.host_effects(self.host), {"effect": self._pending[0]}, maxlen=MAXLEN, approximate=True)
                pipe.expire(keys.host_effects(self.host), TTL_S)
                pipe.execute()
                self._pending.pop(0)
        except redis.RedisError:
            self.failed_flushes += 1
            return False
        return True

    async def drain(self, wait_s: float = DRAIN_WAIT_S) -> bool:
        """At the job's end: write what is pending, waiting out a Redis outage up to ``wait_s``; False if lost."""
        deadline = time.monotonic() + wait_s
        delay = 0.1
        while not self.flush():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)
        return True


def host_effects(r: redis.Redis, host: str) -> list[dict[str, object]]:
    """The journal of ``host``, oldest first, each record with its stream ``id``."""
    out: list[dict[str, object]] = []
    for entry_id, fields in text_client(r).xrange(keys.host_effects(host)):
        record = json.loads(fields["effect"])
        if isinstance(record, dict):
            out.append({**record, "id": entry_id})
    return out
