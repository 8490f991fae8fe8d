"""A deterministic pause for fault tests: a job process stops itself at a named point.

Tests set ``BENCHBOT_FAULT_PAUSE_AT=<point>`` and ``BENCHBOT_FAULT_PAUSE_MARKER=<path>`` in a worker's
environment. The first job process of that worker (or any worker sharing the marker path) that reaches
``<point>`` creates the marker file (``O_EXCL``: only one process ever pauses per marker), writes
``{"pid", "point", "job"}`` into it, and sends itself SIGSTOP: every thread stops, the lease heartbeat
included, exactly as a VM freeze or a stuck machine would stop it. The test waits for the marker,
lets the lease TTL pass while another worker takes the host, then sends SIGCONT to the pid and checks
what the resumed job did. Production never sets these variables; unset, a pause point costs one
environment lookup (the bench request gate reads it once, when it is built).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable

PAUSE_AT_ENV = "BENCHBOT_FAULT_PAUSE_AT"
PAUSE_MARKER_ENV = "BENCHBOT_FAULT_PAUSE_MARKER"

#: Named points, each just before a side effect on the host (or before the success is published).
BEFORE_SIGNAL = "before_signal"
BEFORE_SPAWN = "before_spawn"
BEFORE_SMOKE = "before_smoke"
BEFORE_BENCH = "before_bench"
BEFORE_BENCH_REQUEST = "before_bench_request"
BEFORE_SUCCESS = "before_success"
BEFORE_EVAL = "before_eval"
BEFORE_EVAL_REQUEST = "before_eval_request"
#: After the Redis check passed, before the spawn reaches the host: only the host-side fence can stop it.
SPAWN_AFTER_CHECK = "spawn_after_check"
#: A tune's step after its trial and its between-trials check, before it enqueues the next step.
TUNE_BEFORE_NEXT_STEP = "tune_before_next_step"
POINTS = frozenset(
    {
        BEFORE_SIGNAL,
        BEFORE_SPAWN,
        BEFORE_SMOKE,
        BEFORE_BENCH,
        BEFORE_BENCH_REQUEST,
        BEFORE_SUCCESS,
        SPAWN_AFTER_CHECK,
        BEFORE_EVAL,
        BEFORE_EVAL_REQUEST,
        TUNE_BEFORE_NEXT_STEP,
    }
)


def armed(point: str) -> bool:
    """True when this process was told to pause at ``point``."""
    return os.environ.get(PAUSE_AT_ENV) == point


def pause_at(point: str, job: str = "") -> None:
    """SIGSTOP this process at ``point`` if a test asked for it (once per marker file); else nothing."""
    if os.environ.get(PAUSE_AT_ENV) != point:
        return
    marker = os.environ.get(PAUSE_MARKER_ENV)
    if not marker:
        return
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # another job already paused for this marker: only the first one does
    with os.fdopen(fd, "w") as f:
        json.dump({"pid": os.getpid(), "point": point, "job": job}, f)
    os.kill(os.getpid(), signal.SIGSTOP)


class PausingGate:
    """A picklable ``gate()`` for a hot path: the pause point (decided once, at construction), then ``inner``."""

    def __init__(self, point: str, inner: Callable[[], None], job: str = "") -> None:
        self.point = point if armed(point) else None
        self.inner = inner
        self.job = job

    def __call__(self) -> None:
        if self.point is not None:
            pause_at(self.point, self.job)
        self.inner()
