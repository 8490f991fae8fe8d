"""The effect journal: every fenced action a job took on its host, with the fence it carried, on a Redis stream.

The job's events say what a job did in words; this says what it did *to the host*: each claim, spawn,
signal and unlink the host-side actuator answered (or refused), the fence token it carried, the process
it named or started, and when it began and ended on the worker's wall clock. A history checker
(``bench/history_check.py``) reads it beside the events to prove, per host, that no two jobs' actions
overlapped and that each carried the fence of the lease held then. Nothing reads it to decide anything.

A spawn is journaled twice: ``asked`` before the actuator runs, then its outcome. An engine outlives a job
killed between the two (its horse SIGKILLed while the actuator ran), and the ask is what accounts for it.
A record that cannot be written (Redis restarting) is kept and written with the next one, or when the
job's transport closes; one that still cannot be written is lost from the journal, never from the host.
"""

from __future__ import annotations

import json

import redis

from workers import keys
from workers.json_value import JsonObject
from workers.redis_conn import text_client

#: Enough for a host's last few thousand jobs (a job takes a handful of actions); ~ trimming keeps the newest.
MAXLEN = 50_000
TTL_S = 7 * 24 * 3600


class EffectJournal:
    """The ``Transport.on_effect`` of one job on one host: each record gets the job and host, then goes to Redis."""

    def __init__(self, r: redis.Redis, host: str, job: str) -> None:
        self._redis = text_client(r)
        self.host = host
        self.job = str(job)
        self._pending: list[str] = []

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
            return False
        return True


def host_effects(r: redis.Redis, host: str) -> list[dict[str, object]]:
    """The journal of ``host``, oldest first, each record with its stream ``id``."""
    out: list[dict[str, object]] = []
    for entry_id, fields in text_client(r).xrange(keys.host_effects(host)):
        record = json.loads(fields["effect"])
        if isinstance(record, dict):
            out.append({**record, "id": entry_id})
    return out
