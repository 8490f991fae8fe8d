"""Sub-millisecond wake-ups on an event loop whose timers only have millisecond resolution.

uvloop (libuv) and asyncio's epoll both round timer deadlines to whole milliseconds, which alone
puts the p99 emit jitter near 1-2 ms. ``PreciseTimer`` therefore uses, on Linux, a ``timerfd`` armed
at the absolute ``CLOCK_REALTIME`` deadline (the clock of ``time.time()``) and watched by the loop
like a socket: the kernel's high-resolution timer wakes the loop within tens of microseconds and the
process sleeps in between. Elsewhere (or with ``BENCHBOT_SIM_TIMER=poll``) it arms the loop timer
1.5 ms early and then polls with ``call_soon`` until the deadline passes. Polling keeps a CPU busy
whenever deadlines are dense (hundreds of streams with spread phases always have one within 1.5 ms):
that made the simulator's CPU figure meaningless and, under SCHED_FIFO, ran into the kernel's
real-time throttling (50 ms stalls every second). Measured on the 2-vCPU dev VM, see docs/sim.md.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from collections.abc import Callable

EARLY_S = float(os.environ.get("BENCHBOT_SIM_TIMER_EARLY_S", "0.0015"))
_CLOCK_REALTIME = 0
_TFD_TIMER_ABSTIME = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or os.environ.get("BENCHBOT_SIM_TIMER") == "poll":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_libc()


class PreciseTimer:
    """One re-armable timer that calls ``callback()`` at (just after) a ``time.time()`` deadline.

    Call ``close()`` when done with it (it may hold a file descriptor).
    """

    __slots__ = ("_armed", "_callback", "_fd", "_handle", "_loop", "_spec", "_target")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._handle: asyncio.Handle | None = None
        self._target = 0.0
        self._armed = False
        self._fd = -1
        self._spec = _Itimerspec()
        if _LIBC is not None:
            fd = _LIBC.timerfd_create(_CLOCK_REALTIME, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                loop.add_reader(fd, self._on_fd)

    @property
    def kernel_timer(self) -> bool:
        """True when a timerfd (no polling) drives this timer."""
        return self._fd >= 0

    def arm(self, target: float) -> None:
        """Fire at wall time ``target`` (replaces any earlier arming)."""
        self._target = target
        if self._fd >= 0:
            value = self._spec.it_value
            sec = int(target)
            value.tv_sec, value.tv_nsec = sec, min(999_999_999, int((target - sec) * 1e9) + 1)  # never early
            _LIBC.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None)  # type: ignore[union-attr]
            self._armed = True
            return
        self._cancel_handle()
        delay = target - time.time() - EARLY_S
        if delay > 0:
            self._handle = self._loop.call_later(delay, self._poll)
        else:
            self._handle = self._loop.call_soon(self._poll)
        self._armed = True

    def cancel(self) -> None:
        self._armed = False
        if self._fd >= 0:
            value = self._spec.it_value
            value.tv_sec = value.tv_nsec = 0
            _LIBC.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None)  # type: ignore[union-attr]
        self._cancel_handle()

    def close(self) -> None:
        """Cancel and release the file descriptor."""
        self.cancel()
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    @property
    def armed(self) -> bool:
        return self._armed

    @property
    def target(self) -> float:
        """The deadline of the last ``arm``."""
        return self._target

    def _cancel_handle(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _on_fd(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:  # re-armed or cancelled after it expired: nothing due
            return
        if not self._armed:
            return
        if time.time() >= self._target:
            self._armed = False
            self._callback()
        else:  # float rounding put the kernel deadline a hair early: wait for the rest
            self.arm(self._target)

    def _poll(self) -> None:
        if time.time() >= self._target:
            self._handle = None
            self._armed = False
            self._callback()
        else:
            self._handle = self._loop.call_soon(self._poll)


async def sleep_until(target: float) -> None:
    """Precise ``asyncio.sleep`` to a wall-clock deadline."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    timer = PreciseTimer(loop, wake)
    timer.arm(target)
    try:
        await fut
    finally:
        timer.close()
