"""Optuna's journal on the project's own Redis connection, so a Sentinel failover moves the study too.

Optuna's ``JournalRedisBackend`` builds its own client from a URL and knows nothing of Sentinel; this
backend appends to one Redis LIST through whatever client :mod:`workers.redis_conn` gave the worker
(standalone or the current primary behind Sentinel). One ``RPUSH`` of every log of a call is atomic on a
standalone Redis, which is what Optuna's journal needs (each log's number is its index in the list).
Optuna is imported lazily by :mod:`workers.tune.study` only; this module's base class comes from there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import redis
from optuna.storages.journal import BaseJournalBackend

from workers.json_value import JsonObject
from workers.redis_conn import text_client


class RedisListJournal(BaseJournalBackend):
    """``append_logs`` -> one RPUSH; ``read_logs(n)`` -> LRANGE n..-1 (the list index is the log number)."""

    def __init__(self, r: redis.Redis, key: str) -> None:
        self._r = text_client(r)
        self._key = key

    def read_logs(self, log_number_from: int) -> Iterable[JsonObject]:
        for raw in self._r.lrange(self._key, log_number_from, -1):
            yield json.loads(raw)

    def append_logs(self, logs: list[JsonObject]) -> None:
        if logs:
            self._r.rpush(self._key, *(json.dumps(log, separators=(",", ":")) for log in logs))
