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
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from workers import keys
from workers.config import Config, FlagValue, HostConfig
from workers.engines.probe import last_probed_version
from workers.engines.registry import driver_for
from workers.errors import BenchbotError
from workers.host import simulated
from workers.host.connect import open_transport
from workers.host.transport import Transport
from workers.jobs import host_state, presence
from workers.json_value import JsonObject
from workers.observation import LaunchedBy, RunningConfig
from workers.observe_port import observe
from workers.redis_conn import REDIS_DOWN, RedisOutage, TextRedis, connect, text_client

log = logging.getLogger(__name__)

ALIVE_TTL_S = 5
#: An observer answers a request only this young; older ones are dropped, and the list expires after as long.
REQUEST_MAX_AGE_S = 30
#: At most this many requests wait per host (the newest kept): a host nobody serves must not grow a list
#: without bound, since every job's end asks for an observation whether or not an observer listens.
MAX_PENDING_REQUESTS = 64
#: How long an observation for ``/status`` waits for the engine's own report: well inside the 5 s the bot
#: waits for the answer, so a stopped (SIGSTOP) or hung engine is reported *unresponsive* instead of the
#: bot, hearing nothing, showing the last healthy observation (issue 25 item 7).
STATUS_REPORT_TIMEOUT_S = 2.0
CONTACT_TIMEOUT_S = 30.0
#: The observer's CPU priority (``nice``; the probes it starts inherit it). Observing is background work: on a
#: GPU host it must not take the CPU from the engine's scheduler (nor perturb a bench), nor on a shared box
#: from the bot answering people. Not the idle scheduling class: a starved observer would look dead.
OBSERVER_NICE = 19
#: How often the observer says it is alive, apart from its observations (one may take seconds on a busy host).
HEARTBEAT_S = 1.0


_requests_key = keys.observe_requests
_reply_key = keys.observe_reply
_alive_key = keys.observer_alive
#: Where the host's last observation is kept.
last_key = keys.host_observed


#: The host-state field (see ``host_state.fenced_set``) holding the server benchbot launched on the host.
LAUNCHED_FIELD = "launched"


# ------------------------------------------------------------------ what benchbot launched


@dataclass(frozen=True)
class LaunchRecord:
    """The instance benchbot started on a host: its identity (pid + start tick) and who/which job/when.

    Stored as JSON in the host state (:data:`LAUNCHED_FIELD`); :meth:`from_dict` tolerates records
    written before a field existed.
    """

    instance_id: str | None
    pid: int
    user: str | None
    job: str | None
    at: float | None = None
    label: str | None = None
    log_path: str | None = None
    argv_flags: tuple[tuple[str, FlagValue], ...] = field(default_factory=tuple)

    @property
    def launched_by(self) -> LaunchedBy:
        """Who/which job/when, as an observation shows it."""
        return LaunchedBy(user=self.user, job=self.job, at=self.at, label=self.label)

    def to_dict(self) -> dict[str, object]:
        return {
            "instance_id": self.instance_id,
            "pid": self.pid,
            "user": self.user,
            "job": self.job,
            "at": self.at,
            "label": self.label,
            "log_path": self.log_path,
            "argv_flags": [list(pair) for pair in self.argv_flags],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> LaunchRecord:
        at = d.get("at")
        pid = d.get("pid")
        flags = d.get("argv_flags")
        return cls(
            instance_id=None if d.get("instance_id") is None else str(d["instance_id"]),
            pid=int(pid) if isinstance(pid, (int, str)) and str(pid).isdigit() else 0,
            user=None if d.get("user") is None else str(d["user"]),
            job=None if d.get("job") is None else str(d["job"]),
            at=float(at) if isinstance(at, (int, float)) else None,
            label=None if d.get("label") is None else str(d["label"]),
            log_path=None if d.get("log_path") is None else str(d["log_path"]),
            argv_flags=tuple(
                (str(pair[0]), pair[1] if isinstance(pair[1], bool) else str(pair[1]))
                for pair in (flags if isinstance(flags, list) else ())
                if isinstance(pair, (list, tuple)) and len(pair) == 2
            ),
        )


def record_launched(r: redis.Redis, host: str, fence: int, record: LaunchRecord) -> None:
    """Remember the instance we started (who, which job, when): written only under the current lease."""
    host_state.fenced_set(r, host, LAUNCHED_FIELD, dict(record.to_dict()), fence)


def launched_record(r: redis.Redis, host: str) -> LaunchRecord | None:
    """The last instance benchbot launched on ``host``, or None."""
    raw = host_state.host_state(r, host).get(LAUNCHED_FIELD)
    if not raw:
        return None
    data = json.loads(raw)
    return LaunchRecord.from_dict(data) if isinstance(data, Mapping) else None


def annotate(r: redis.Redis, host: str, observed: RunningConfig) -> RunningConfig:
    """The observation marked managed (launched by us, with who and when) or unmanaged."""
    record = launched_record(r, host)
    if observed.process is None:
        return replace(observed, managed=None, launched_by=None)
    if record is not None and observed.instance_id and record.instance_id == observed.instance_id:
        return replace(observed, managed=True, launched_by=record.launched_by)
    return replace(observed, managed=False, launched_by=None)


def observation_from_json(raw: str | bytes | Mapping[str, object] | None) -> RunningConfig | None:
    """An observation read from Redis (JSON text or an already decoded mapping); None when absent or unreadable."""
    if raw is None:
        return None
    try:
        data = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
        return RunningConfig.from_dict(data)
    except (ValueError, BenchbotError) as exc:
        log.warning("an unreadable stored observation was ignored: %s", exc)
        return None


async def observe_host(
    r: redis.Redis, host: HostConfig, transport: Transport, *, report_timeout_s: float | None = None
) -> RunningConfig:
    """Observe ``host`` now, annotate it, store it as the last observation, and return it.

    Port, URL, API key, engine command and engine driver (``kind``) are the host's own, as the worker
    serving it configures them. ``report_timeout_s`` bounds the wait for the server's own report.
    """
    running = await observe(
        transport,
        host_name=host.name,
        port=host.port,
        base_url=host.base_url,
        api_key=host.engine.api_key(),
        nvidia_smi=simulated.nvidia_smi_argv(host),
        engine_commands=[host.engine.command],
        driver=driver_for(host.engine.kind),
        report_timeout_s=report_timeout_s,
        settings_dir=host.log_dir,
    )
    # The server reports its own version once it answers; before that (loading), the last probe's.
    version = (running.server.version if running.server else None) or last_probed_version(r, host.name)
    observed = replace(annotate(r, host.name, running), engine_version=version)
    r.set(last_key(host.name), json.dumps(observed.to_dict()))
    return observed


def last_observation(r: redis.Redis, host: str) -> RunningConfig | None:
    """The host's last stored observation (may be stale: see its ``observed_at``)."""
    return observation_from_json(text_client(r).get(last_key(host)))


# ------------------------------------------------------------------ the bot's side


def request_observation(r: redis.Redis, host: str, *, timeout_s: float = 5.0) -> RunningConfig | None:
    """Ask a worker serving ``host`` to observe it now; None when no observer answers in time."""
    return ask_observations(r, [host]).collect(time.monotonic() + timeout_s)[host]


@dataclass
class PendingObservations:
    """Requests sent to the hosts' observers (:func:`ask_observations`), their answers collected by
    :meth:`collect`; whoever asked may read Redis for other things in between, inside the same deadline."""

    r: TextRedis
    answers: dict[str, RunningConfig | None]
    pending: dict[str, str]  # reply key -> host

    def collect(self, deadline: float) -> dict[str, RunningConfig | None]:
        """Wait until every asked observer answered or ``deadline`` (``time.monotonic()``) passed."""
        while self.pending and time.monotonic() < deadline:
            # Short slices: redis-py's default socket timeout is 5 s, a longer BLPOP would trip it.
            reply = self.r.blpop(list(self.pending), timeout=max(0.05, min(1.0, deadline - time.monotonic())))
            if reply:
                key, value = reply
                self.answers[self.pending.pop(key)] = observation_from_json(json.loads(value).get("observation"))
        return self.answers


def ask_observations(r: redis.Redis, hosts: list[str]) -> PendingObservations:
    """Ask the observer of every host that has a live one to observe it now; collect with ``.collect``.

    All at once, so ``/status`` takes the slowest host's time, not the sum: the liveness reads and the requests
    go in two pipelined round trips, so asking 50 hosts costs what asking one does."""
    r = text_client(r)
    pending: dict[str, str] = {}
    alive_pipe = r.pipeline(transaction=False)
    for host in hosts:
        alive_pipe.exists(_alive_key(host))
    alive = alive_pipe.execute() if hosts else []
    ask = r.pipeline(transaction=False)
    for host, is_alive in zip(hosts, alive, strict=True):
        if is_alive:
            request_id = uuid.uuid4().hex
            _push_request(ask, host, {"id": request_id, "at": time.time()})
            pending[_reply_key(request_id)] = host
    if pending:
        ask.execute()
    return PendingObservations(r, dict.fromkeys(hosts), pending)


def ask_observation(r: redis.Redis, host: str) -> None:
    """Ask ``host``'s observer to observe it soon, waiting for nothing (after a job changed the host).

    No ``id``: nobody waits for a reply, so the observer stores the observation and writes none."""
    pipe = r.pipeline(transaction=False)
    _push_request(pipe, host, {"at": time.time()})
    pipe.execute()


def _push_request(pipe: Any, host: str, request: dict[str, float | str]) -> None:
    """Queue one request on ``pipe``, keeping the list bounded (newest first) and expiring."""
    key = _requests_key(host)
    pipe.lpush(key, json.dumps(request))
    pipe.ltrim(key, 0, MAX_PENDING_REQUESTS - 1)
    pipe.expire(key, REQUEST_MAX_AGE_S)


def last_observations(r: redis.Redis, hosts: list[str]) -> dict[str, RunningConfig | None]:
    """Every host's stored observation in one round trip (each carries its ``observed_at``)."""
    if not hosts:
        return {}
    raws = text_client(r).mget([last_key(h) for h in hosts])
    return {host: observation_from_json(raw) for host, raw in zip(hosts, raws, strict=True)}


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
    _background_priority()
    # A spawned process starts with logging unconfigured: give its lines the worker's shape.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_serve(config, redis_url, hosts, stop, parent_pid))


def _background_priority() -> None:
    """Run this process (and the probes it starts, which inherit it) at ``nice`` +:data:`OBSERVER_NICE`: a busy
    box then answers ``/status`` from Redis with each observation's age rather than slowing the bot, a job or
    the engine to observe."""
    with contextlib.suppress(OSError):
        os.nice(OBSERVER_NICE)


async def _heartbeat(r: TextRedis, hosts: list[str], serving: Any) -> None:
    """Say every host's observer is alive every :data:`HEARTBEAT_S`, however long an observation takes."""
    while serving():
        with contextlib.suppress(*REDIS_DOWN):
            pipe = r.pipeline(transaction=False)
            for host in hosts:
                pipe.set(_alive_key(host), "1", ex=ALIVE_TTL_S)
            pipe.execute()
        await asyncio.sleep(HEARTBEAT_S)


async def _serve(config: Config, redis_url: str, hosts: list[str], stop: Any, parent_pid: int) -> None:
    # A socket timeout above BLPOP's 1 s: a Redis that hangs (rather than closing) is noticed too.
    r = text_client(connect(redis_url, socket_timeout=10, socket_connect_timeout=5, decode_responses=True))
    transports: dict[str, Transport] = {}
    outage = RedisOutage(f"observer for {', '.join(hosts)}", log, limit_s=float("inf"))

    def serving() -> bool:
        return not stop.is_set() and os.getppid() == parent_pid

    # Unasked observations: the first at once, then one every ``observe_every_s`` per host, spread out so
    # a worker's hosts (and a fleet's observers) do not all spawn their probes in the same second.
    every = config.limits.observe_every_s
    due = {host: time.monotonic() + every * i / max(1, len(hosts)) for i, host in enumerate(hosts)}
    beat = asyncio.get_running_loop().create_task(_heartbeat(r, hosts, serving))
    try:
        await _first_contact(r, config, hosts, transports)
        while serving():
            try:
                await _serve_one(r, config, hosts, transports, due)
            except REDIS_DOWN as exc:
                # A restart: wait (off the event loop) for as long as the worker lives, then serve again.
                await asyncio.to_thread(outage.wait, r, exc, stop=lambda: not serving(), sleep=stop.wait)
                continue
            outage.recovered()
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
        for transport in transports.values():
            with contextlib.suppress(Exception):
                await transport.close()
        for host in hosts:
            with contextlib.suppress(Exception):
                r.delete(_alive_key(host))
        r.close()


async def _first_contact(r: TextRedis, config: Config, hosts: list[str], transports: dict[str, Transport]) -> None:
    """Reach each host once at start, so a host the worker cannot reach is known before anyone asks (that the
    observer is alive, :func:`_heartbeat` says from the start)."""

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


async def _serve_one(
    r: TextRedis,
    config: Config,
    hosts: list[str],
    transports: dict[str, Transport],
    due: dict[str, float] | None = None,
) -> None:
    """Wait up to 1 s for a request, answer it; unasked, observe a host that is due. (That the observer is alive,
    :func:`_heartbeat` says, apart from this loop.)"""
    request_keys = {_requests_key(h): h for h in hosts}
    now = time.monotonic()
    overdue = [h for h in hosts if due is not None and due.get(h, now) <= now]
    # A request first (someone waits for it); only then a due host. BLPOP 0 would block forever: 10 ms.
    item = await asyncio.to_thread(r.blpop, list(request_keys), 0.01 if overdue else 1)
    if item is None and not overdue:
        return
    if item is None:
        host, waiting = overdue[0], []  # nobody waits for this one (the timer)
    else:
        host = request_keys[item[0]]
        # Everyone waiting for this host gets the one observation made now: a burst of /status (or of job
        # ends) costs one look at the host, not one each.
        waiting = [item[1], *_take_all(r, host)]
    if due is not None:
        due[host] = time.monotonic() + config.limits.observe_every_s  # any observation resets the timer
    now_s = time.time()
    requests = [q for q in (_Request.parse(raw) for raw in waiting) if now_s - q.at <= REQUEST_MAX_AGE_S]
    if waiting and not requests:
        return  # nobody waits for an answer that old
    reply: JsonObject
    try:
        host_cfg = config.host(host)
        if host not in transports:
            transports[host] = open_transport(host_cfg)
        observed = await observe_host(r, host_cfg, transports[host], report_timeout_s=STATUS_REPORT_TIMEOUT_S)
        reply = {"observation": observed.to_dict()}
        presence.record_connect_error(r, host, None)
    except REDIS_DOWN:
        raise  # the request is lost with Redis; whoever asked gets no answer and says so
    except Exception as exc:  # a failed observation is still an answer
        log.warning("observation of %s failed: %s", host, exc)
        presence.record_connect_error(r, host, str(exc))
        with contextlib.suppress(Exception):
            await transports.pop(host).close()
        reply = {"observation": None, "error": str(exc)}
    ids = [q.id for q in requests if q.id is not None]
    if not ids:
        return  # unasked (the timer, a job's end): stored by observe_host, nobody waits for a reply
    text = json.dumps(reply)
    pipe = r.pipeline()
    for request_id in ids:
        pipe.rpush(_reply_key(request_id), text)
        pipe.expire(_reply_key(request_id), 60)
    pipe.execute()


def _take_all(r: TextRedis, host: str) -> list[str]:
    """Every request still waiting for ``host``, taken off its list at once."""
    pipe = r.pipeline()
    pipe.lrange(_requests_key(host), 0, -1)
    pipe.delete(_requests_key(host))
    taken, _ = pipe.execute()
    return list(taken or [])


@dataclass(frozen=True)
class _Request:
    """One request as pushed: its reply id (None: nobody waits for a reply) and when it was asked."""

    id: str | None
    at: float

    @classmethod
    def parse(cls, raw: str) -> _Request:
        """``{"id"?, "at"}``; an unreadable request reads as an old one nobody waits for."""
        try:
            data = json.loads(raw)
            at = float(data.get("at", 0))
        except (ValueError, TypeError, AttributeError):
            return cls(None, 0.0)
        request_id = data.get("id")
        return cls(request_id if isinstance(request_id, str) else None, at)
