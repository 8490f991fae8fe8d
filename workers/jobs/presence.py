"""Is anyone serving a host, and can it reach the host? Answered from Redis, for the bot to say at once.

A job queued for a host no worker serves waits silently forever, and a worker that cannot reach its
host (an unknown SSH host key, a refused login) looks, from the bot, just like no worker at all. So:

* a host is *served* while a worker's observer says it is alive (its key expires a few seconds after
  the worker dies) or an RQ worker with a live heartbeat listens on the host's queue;
* a worker that fails to reach its host records what failed (:func:`record_connect_error`, with the
  time), and clears it once it reaches the host again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis
from rq import Worker

from workers import keys
from workers.jobs.queue import host_queue
from workers.json_value import JsonObject

#: The observer's liveness key (set every second, expiring after ``ALIVE_TTL_S``): see workers/observer.py.
CONNECT_ERROR_TTL_S = 24 * 3600


@dataclass(frozen=True)
class HostService:
    """Who serves a host now: ``served`` by a live worker, and the last error it met reaching the host."""

    host: str
    served: bool
    connect_error: str | None = None
    error_at: float | None = None

    def to_dict(self) -> JsonObject:
        return {"served": self.served, "connect_error": self.connect_error, "error_at": self.error_at}

    @classmethod
    def from_dict(cls, host: str, data: object) -> HostService | None:
        """Inverse of :meth:`to_dict` (a reply's ``data["service"]``); None for anything else."""
        if not isinstance(data, dict):
            return None
        at = data.get("error_at")
        error = data.get("connect_error")
        return cls(
            host,
            bool(data.get("served")),
            str(error) if error else None,
            float(at) if isinstance(at, int | float) else None,
        )


def record_connect_error(r: redis.Redis, host: str, error: str | None) -> None:
    """A worker's last attempt to reach ``host``: the error it met, or None once it got through."""
    key = keys.worker_connect_error(host)
    if error is None:
        r.delete(key)
    else:
        r.set(key, json.dumps({"error": error, "at": time.time()}), ex=CONNECT_ERROR_TTL_S)


def _rq_workers_serving(r: redis.Redis, host: str) -> bool:
    """An RQ worker with a live heartbeat listens on the host's queue (its key expires when it dies)."""
    return any(worker is not None for worker in Worker.all(queue=host_queue(r, host)))


def host_service(r: redis.Redis, host: str) -> HostService:
    """Whether a worker serves ``host`` now, and, if it does, the error it last met reaching it."""
    served = bool(r.exists(keys.observer_alive(host))) or _rq_workers_serving(r, host)
    if not served:
        return HostService(host, False)
    raw = r.get(keys.worker_connect_error(host))
    if not raw:
        return HostService(host, True)
    data = json.loads(raw)
    return HostService(host, True, str(data.get("error") or "unknown error"), data.get("at"))


def host_services(r: redis.Redis, hosts: list[str]) -> dict[str, HostService]:
    """:func:`host_service` of many hosts in one round trip (RQ's worker registry read only for hosts
    no observer says is alive), so a fleet's ``/queue`` and ``/status`` do not pay one trip per host."""
    pipe = r.pipeline(transaction=False)  # independent reads: no MULTI
    for host in hosts:
        pipe.exists(keys.observer_alive(host))
        pipe.get(keys.worker_connect_error(host))
    answers = pipe.execute() if hosts else []
    out: dict[str, HostService] = {}
    for i, host in enumerate(hosts):
        alive, raw = answers[2 * i], answers[2 * i + 1]
        if not (alive or _rq_workers_serving(r, host)):
            out[host] = HostService(host, False)
        elif not raw:
            out[host] = HostService(host, True)
        else:
            data = json.loads(raw)
            out[host] = HostService(host, True, str(data.get("error") or "unknown error"), data.get("at"))
    return out
