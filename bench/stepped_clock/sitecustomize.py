"""A stepped wall clock for the programs a simulated host runs: the soak's ``clock_step`` fault (``bench/soak.py``).

A host whose clock is stepped (NTP correcting a drifted clock, an admin's ``date -s``, a VM restored from a
snapshot) sees ``CLOCK_REALTIME`` jump forward or back while ``CLOCK_MONOTONIC`` and ``CLOCK_BOOTTIME`` run on.
The soak cannot step this box's clock (every other process shares it), so it steps the clock of one simulated
host's programs instead, the way libfaketime would: this directory goes first on ``PYTHONPATH`` in the host's
``env`` (benchbot runs every host-side program with it: the actuator, the process-table scan, the listener probe,
the simulated nvidia-smi), Python imports this module at start-up, and with ``BENCHBOT_SIM_CLOCK_FILE=PATH`` set
every wall-clock reading of the process (``time.time``, ``time_ns``, ``clock_gettime(CLOCK_REALTIME)``, and
``localtime``/``gmtime``/``ctime``/``strftime`` of "now") is offset by the seconds PATH holds (read again at most
every 50 ms, so a step reaches a running program too). The monotonic and boot clocks are left alone, as a real
step leaves them.

Not stepped: the simulated engines (their modelled GPU timeline stands in for a real engine's monotonic
scheduler, and their ledger is the soak's record of the truth), ``datetime.now()`` (none of benchbot's host-side
programs reads it), and the kernel's ``btime`` in ``/proc/stat`` (a real step shifts it, and so the start time
benchbot shows for a process; benchbot identifies processes by their start ticks, which no step moves).
"""

import os
import sys
import time

CLOCK_FILE_ENV = "BENCHBOT_SIM_CLOCK_FILE"
ENGINE_MODULES = ("workers.sim.sglang", "workers.sim.vllm", "workers.sim.trtllm")


def _is_engine(argv):
    return any(argv[i] == "-m" and argv[i + 1] in ENGINE_MODULES for i in range(len(argv) - 1))


def _install(path):
    real_time, real_time_ns, real_gettime = time.time, time.time_ns, time.clock_gettime
    real_gettime_ns, real_localtime, real_gmtime = time.clock_gettime_ns, time.localtime, time.gmtime
    real_ctime, real_strftime, monotonic = time.ctime, time.strftime, time.monotonic
    cache = [0.0, -1.0]  # offset, when read (monotonic)

    def offset():
        now = monotonic()
        if now - cache[1] > 0.05:
            try:
                with open(path) as f:
                    cache[0] = float(f.read().strip() or 0)
            except (OSError, ValueError):
                cache[0] = 0.0
            cache[1] = now
        return cache[0]

    def stepped_time():
        return real_time() + offset()

    def stepped_time_ns():
        return real_time_ns() + int(offset() * 1e9)

    def stepped_gettime(clock):
        return real_gettime(clock) + (offset() if clock == time.CLOCK_REALTIME else 0.0)

    def stepped_gettime_ns(clock):
        return real_gettime_ns(clock) + (int(offset() * 1e9) if clock == time.CLOCK_REALTIME else 0)

    def of_now(real):
        def call(secs=None):
            return real(stepped_time() if secs is None else secs)

        return call

    def stepped_strftime(fmt, t=None):
        return real_strftime(fmt, real_localtime(stepped_time()) if t is None else t)

    time.time, time.time_ns = stepped_time, stepped_time_ns
    time.clock_gettime, time.clock_gettime_ns = stepped_gettime, stepped_gettime_ns
    time.localtime, time.gmtime, time.ctime = of_now(real_localtime), of_now(real_gmtime), of_now(real_ctime)
    time.strftime = stepped_strftime


if os.environ.get(CLOCK_FILE_ENV) and not _is_engine(getattr(sys, "orig_argv", sys.argv)):
    _install(os.environ[CLOCK_FILE_ENV])
