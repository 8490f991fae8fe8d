"""Fresh observations on demand: ``/status`` asks, a worker's observer thread looks at the host.

The bot may run far from the GPU hosts, so it never observes a host itself. Each ``benchbot
worker`` runs an :class:`ObserverService` process beside its RQ loop; it answers observation
requests for its hosts through Redis even while a long job holds the lease (observing is read-only
and needs no lease). Every observation is stored as the host's *last observation*, marked
``managed`` when the instance is one benchbot launched (see :func:`record_launched`).
The service outlives a Redis restart: it waits for Redis (one log line when it goes, one when it
is back) and serves again, for as long as its worker lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import signal
import time
import uuid
from typing import Any

import redis

from workers.config import Config, HostConfig
from workers.engines.probe import last_probed_version
from workers.host.connect import open_transport
from workers.host.transport import Transport
from workers.jobs import host_state, presence
from workers.observation import observe
from workers.redis_conn import REDIS_DOWN, RedisOutage
from workers.sim import fleet

log = logging.getLogger(__name__)

ALIVE_TTL_S = 5
CONTACT_TIMEOUT_S = 30.0


def _requests_key(host: str) -> str:
    return f"benchbot:observe:{host}:requests"


def _reply_key(request_id: str) -> str:
    return f"benchbot:observe:reply:{request_id}"


def _alive_key(host: str) -> str:
    return f"benchbot:observer:{host}:alive"


def last_key(host: str) -> str:
    """Where the host's last observation is kept."""
    return f"benchbot:host:{host}:observed"


#: The host-state field (see ``host_state.fenced_set``) holding the server benchbot launched on the host.
LAUNCHED_FIELD = "launched"


# ------------------------------------------------------------------ what benchbot launched


def record_launched(r: redis.Redis, host: str, fence: int, record: dict[str, Any]) -> None:
    """Remember the instance we started (who, which job, when): written only under the current lease."""
    host_state.fenced_set(r, host, LAUNCHED_FIELD, record, fence)


def launched_record(r: redis.Redis, host: str) -> dict[str, Any] | None:
    """The last instance benchbot launched on ``host``, or None."""
    raw = host_state.host_state(r, host).get(LAUNCHED_FIELD)
    return json.loads(raw) if raw else None


def annotate(r: redis.Redis, host: str, config_dict: dict[str, Any]) -> dict[str, Any]:
    """Mark an observation managed (launched by us, with who and when) or unmanaged."""
    record = launched_record(r, host)
    instance = config_dict.get("instance_id")
    if config_dict.get("process") is None:
        config_dict["managed"] = None
        config_dict["launched_by"] = None
    elif record and instance and record.get("instance_id") == instance:
        config_dict["managed"] = True
        config_dict["launched_by"] = {k: record.get(k) for k in ("user", "job", "at", "label")}
    else:
        config_dict["managed"] = False
        config_dict["launched_by"] = None
    return config_dict


async def observe_host(r: redis.Redis, host: HostConfig, transport: Transport) -> dict[str, Any]:
    """Observe ``host`` now, annotate it, store it as the last observation, and return it as a dict.

    Port, URL, API key and engine command are the host's own, as the worker serving it configures them.
    """
    running = await observe(
        transport,
        host_name=host.name,
        port=host.port,
        base_url=host.base_url,
        api_key=host.engine.api_key(),
        nvidia_smi=fleet.nvidia_smi_argv(host),
        engine_commands=[host.engine.command],
    )
    data = annotate(r, host.name, running.to_dict())
    # The server reports its own version once it answers; before that (loading), the last probe's.
    data["engine_version"] = (running.server.version if running.server else None) or last_probed_version(r, host.name)
    r.set(last_key(host.name), json.dumps(data))
    return data


def last_observation(r: redis.Redis, host: str) -> dict[str, Any] | None:
    """The host's last stored observation (may be stale: see its ``observed_at``)."""
    raw = r.get(last_key(host))
    return json.loads(raw) if raw else None


# ------------------------------------------------------------------ the bot's side


def request_observation(r: redis.Redis, host: str, *, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """Ask a worker serving ``host`` to observe it now; None when no observer answers in time."""
    return request_observations(r, [host], timeout_s=timeout_s)[host]


def request_observations(r: redis.Redis, hosts: list[str], *, timeout_s: float = 5.0) -> dict[str, dict | None]:
    """Ask every host's observer at once, then collect: ``/status`` takes the slowest host's time, not the sum."""
    answers: dict[str, dict | None] = dict.fromkeys(hosts)
    pending: dict[str, str] = {}  # reply key -> host
    for host in hosts:
        if r.exists(_alive_key(host)):
            request_id = uuid.uuid4().hex
            r.lpush(_requests_key(host), json.dumps({"id": request_id, "at": time.time()}))
            pending[_reply_key(request_id)] = host
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        # Short slices: redis-py's default socket timeout is 5 s, a longer BLPOP would trip it.
        reply = r.blpop(list(pending), timeout=max(0.05, min(1.0, deadline - time.monotonic())))
        if reply:
            key = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
            answers[pending.pop(key)] = json.loads(reply[1]).get("observation")
    return answers


# ------------------------------------------------------------------ the worker's side


class ObserverService:
    """A child process answering observation requests for some hosts.

    A process, not a thread: RQ's worker forks a work horse per job, and a fork taken while another
    thread holds a lock (an import lock, say) hands the horse that lock held forever. The demo once
    hung exactly so. A spawned process shares nothing with the forking worker, and it exits by
    itself when its worker dies (it notices its parent changed).
    """

    def __init__(self, config: Config, redis_url: str, hosts: list[str]) -> None:
        self.config = config
        self.redis_url = redis_url
        self.hosts = hosts
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._process = context.Process(
            target=_serve_in_process,
            name="benchbot-observer",
            daemon=True,
            args=(config, redis_url, hosts, self._stop, os.getpid()),
        )

    @property
    def pid(self) -> int | None:
        """The observer process's pid once started."""
        return self._process.pid

    def start(self) -> ObserverService:
        """Start serving in the background."""
        self._process.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and wait for the process (terminated if it does not stop in time)."""
        self._stop.set()
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout)


def _serve_in_process(config: Config, redis_url: str, hosts: list[str], stop: Any, parent_pid: int) -> None:
    # Ctrl-C reaches the terminal's whole process group: the worker decides when its observer stops (the
    # stop event, or the worker's death), so the observer ignores SIGINT rather than die with a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A spawned process starts with logging unconfigured: give its lines the worker's shape.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_serve(config, redis_url, hosts, stop, parent_pid))


async def _serve(config: Config, redis_url: str, hosts: list[str], stop: Any, parent_pid: int) -> None:
    # A socket timeout above BLPOP's 1 s: a Redis that hangs (rather than closing) is noticed too.
    r = redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=5)
    transports: dict[str, Transport] = {}
    outage = RedisOutage(f"observer for {', '.join(hosts)}", log, limit_s=float("inf"))

    def serving() -> bool:
        return not stop.is_set() and os.getppid() == parent_pid

    try:
        await _first_contact(r, config, hosts, transports)
        while serving():
            try:
                await _serve_one(r, config, hosts, transports)
            except REDIS_DOWN as exc:
                # A restart: wait (off the event loop) for as long as the worker lives, then serve again.
                await asyncio.to_thread(outage.wait, r, exc, stop=lambda: not serving(), sleep=stop.wait)
                continue
            outage.recovered()
    finally:
        for transport in transports.values():
            with contextlib.suppress(Exception):
                await transport.close()
        for host in hosts:
            with contextlib.suppress(Exception):
                r.delete(_alive_key(host))
        r.close()


async def _first_contact(r: redis.Redis, config: Config, hosts: list[str], transports: dict[str, Transport]) -> None:
    """Reach each host once at start, so a host the worker cannot reach is known before anyone asks."""
    for host in hosts:
        r.set(_alive_key(host), "1", ex=ALIVE_TTL_S)

    async def reach(host: str) -> None:
        try:
            transports[host] = open_transport(config.host(host))
            await transports[host].run(["true"], timeout=CONTACT_TIMEOUT_S, check=True)
            presence.record_connect_error(r, host, None)
        except REDIS_DOWN:
            raise
        except Exception as exc:  # what failed is the answer: kept for /status, say and /queue
            log.warning("cannot reach %s: %s", host, exc)
            presence.record_connect_error(r, host, str(exc))
            with contextlib.suppress(Exception):
                await transports.pop(host).close()

    with contextlib.suppress(*REDIS_DOWN):
        await asyncio.gather(*(reach(host) for host in hosts))


async def _serve_one(r: redis.Redis, config: Config, hosts: list[str], transports: dict[str, Transport]) -> None:
    """Say we are alive, wait up to 1 s for a request, answer it."""
    for host in hosts:
        r.set(_alive_key(host), "1", ex=ALIVE_TTL_S)
    item = await asyncio.to_thread(r.blpop, [_requests_key(h) for h in hosts], 1)
    if not item:
        return
    host = item[0].decode().split(":")[2]
    request = json.loads(item[1])
    if time.time() - float(request.get("at", 0)) > 30:
        return  # nobody waits for an answer that old
    reply: dict[str, Any]
    try:
        host_cfg = config.host(host)
        if host not in transports:
            transports[host] = open_transport(host_cfg)
        reply = {"observation": await observe_host(r, host_cfg, transports[host])}
        presence.record_connect_error(r, host, None)
    except REDIS_DOWN:
        raise  # the request is lost with Redis; whoever asked gets no answer and says so
    except Exception as exc:  # a failed observation is still an answer
        log.warning("observation of %s failed: %s", host, exc)
        presence.record_connect_error(r, host, str(exc))
        with contextlib.suppress(Exception):
            await transports.pop(host).close()
        reply = {"observation": None, "error": str(exc)}
    pipe = r.pipeline()
    pipe.rpush(_reply_key(request["id"]), json.dumps(reply))
    pipe.expire(_reply_key(request["id"]), 60)
    pipe.execute()
