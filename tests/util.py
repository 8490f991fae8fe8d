"""Small helpers for tests: polling with a deadline instead of sleeping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from bench.polling import poll_until
from workers.ports import free_local_port

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, what: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    try:
        return poll_until(predicate, timeout, interval, what)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None


async def async_wait_until(
    predicate: Callable[[], Awaitable[T]], timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> T:
    """Async twin of :func:`wait_until`."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate!r}")
        await asyncio.sleep(interval)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    return free_local_port()
