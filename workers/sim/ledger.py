"""The simulated host's ledger: every engine it saw start, get a signal and exit, and every request that changed it.

A soak (``bench/soak.py``) checks benchbot's history against what the host itself saw, not against what
benchbot says it did: this is the host's side. With ``BENCHBOT_SIM_LEDGER=PATH`` in the engine's
environment (a simulated host's ``env`` in benchbot.toml carries it, locally and over SSH) each simulated
engine appends one JSON line per fact to PATH: ``engine_start`` (its pid, port, kind and the fencing token
the host's fence file held then, which the actuator wrote under its lock just before it spawned us),
``engine_signal`` (SIGTERM/SIGINT received), ``engine_exit``, and ``request`` (each non-GET request: a
generate, a completion, a cache flush, as it arrived; ``own`` marks the engine's warm-up request to itself).
Unset, nothing is recorded. One ``write`` of a short line with ``O_APPEND`` is atomic, so many engines
share one file.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

LEDGER_ENV = "BENCHBOT_SIM_LEDGER"
#: The host's fence file for this engine's port (benchbot's ``{log_dir}/.benchbot-fence-{port}``).
FENCE_FILE_ENV = "BENCHBOT_SIM_FENCE_FILE"


def _path() -> str | None:
    return os.environ.get(LEDGER_ENV) or None


def fence_now() -> int | None:
    """The token the host's fence file holds now (None without one)."""
    name = os.environ.get(FENCE_FILE_ENV)
    if not name:
        return None
    try:
        with open(name) as f:
            text = f.read(64).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def record(event: str, **fields: object) -> None:
    """Append one fact (no-op unless the ledger is on); never raises: the ledger must not change the engine."""
    path = _path()
    if path is None:
        return
    line = json.dumps({"ev": event, "ts": time.time(), "pid": os.getpid(), **fields}, separators=(",", ":")) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        return


def engine_started(kind: str, port: int) -> None:
    record("engine_start", kind=kind, port=int(port), fence=fence_now())


def on_signal(name: str, then: Callable[[], None]) -> Callable[[], None]:
    """A signal handler that records the signal, then does what the engine does with it."""

    def handler() -> None:
        record("engine_signal", signal=name, fence=fence_now())
        then()

    return handler


#: True while the engine warms itself up over HTTP (SGLang's own warm-up request): not benchbot's request.
WARMING = [False]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method != "GET":
        record("request", method=request.method, path=request.path, **({"own": True} if WARMING[0] else {}))
    return await handler(request)


def middlewares() -> list[Middleware]:
    """The ledger's aiohttp middleware when the ledger is on (first, so it sees even a refused request)."""
    return [_requests] if _path() is not None else []
