"""Is a host simulated, and what its simulated engine and ``nvidia-smi`` are told: read from the host's config.

A rehearsal host runs benchbot's simulator instead of an engine; the worker learns that from the engine
command's shape alone (``-m workers.sim.KIND`` or ``benchbot sim KIND`` for a registered engine kind), never
by importing the simulator, which is not on the production path.

The simulated engine registers its memory in a state dir that the ``nvidia-smi`` stand-in reads. Two
simulated hosts served from one machine would share that dir (so the second launch "runs out of
memory" on GPUs the first one holds) unless each host's engine and stand-in agree on a dir of their
own. The worker derives it from the host's name: ``<base>/hosts/<name>``, where the base is the worker's
``BENCHBOT_SIM_STATE_DIR`` or the simulator's default. A ``BENCHBOT_SIM_STATE_DIR`` in the host's own
``env`` is an explicit choice and wins, for the engine and the stand-in alike. The variable and the flag
are this module's protocol with the simulator (``workers/sim`` reads them).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence

from workers.config import HostConfig
from workers.engines import registry
from workers.engines.processes import SIM_PACKAGE

SIM_NVIDIA_SMI_MODULE = f"{SIM_PACKAGE}.nvidia_smi"
STATE_ENV = "BENCHBOT_SIM_STATE_DIR"


def runs_module(argv: Sequence[str], module: str) -> bool:
    """True when ``argv`` starts Python's ``-m module`` (or the ``benchbot sim`` entry point for it:
    ``workers.sim.nvidia_smi`` is ``benchbot sim nvidia-smi``)."""
    parts = list(argv)
    if any(a == "-m" and b == module for a, b in itertools.pairwise(parts)):
        return True
    sub = module.rsplit(".", 1)[-1].replace("_", "-")
    return any(a == "sim" and b == sub for a, b in itertools.pairwise(parts))


def is_simulated(host: HostConfig) -> bool:
    """The host's engine is benchbot's simulator of a registered engine (a rehearsal host, no real GPU)."""
    return any(runs_module(host.engine.command, f"{SIM_PACKAGE}.{kind}") for kind in registry.kinds())


def host_state_dir(host: HostConfig, environ: Mapping[str, str] | None = None) -> str:
    """The sim state dir of ``host``: its own ``env`` setting, else ``<worker's or default base>/hosts/<name>``."""
    if host.env.get(STATE_ENV):
        return host.env[STATE_ENV]
    environ = os.environ if environ is None else environ
    base = environ.get(STATE_ENV) or f"/tmp/benchbot-sim-{os.getuid()}"
    return f"{base.rstrip('/')}/hosts/{host.name}"


def sim_engine_env(host: HostConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a simulated host's engine gets on top of its env: its own state dir (nothing for a real engine)."""
    return {STATE_ENV: host_state_dir(host, environ)} if is_simulated(host) else {}


def nvidia_smi_argv(host: HostConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """The host's ``nvidia_smi`` command; the stand-in is pointed at the host's own state dir."""
    argv = list(host.nvidia_smi)
    if runs_module(argv, SIM_NVIDIA_SMI_MODULE):
        argv.append(f"--sim-state-dir={host_state_dir(host, environ)}")
    return argv
