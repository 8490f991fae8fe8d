"""``benchbot config check --connect``: reach every host the way its worker would, before any job does.

A newcomer's first launch should not be what finds an unknown SSH host key, a key file that is not
there, an engine command that is not installed or an ``nvidia-smi`` that is missing. Each check here
runs what a worker runs (the host's transport, the engine's version command with the engine's env,
the host's ``nvidia-smi -L``) and turns a failure into one line that says what to fix.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from workers.config import HostConfig
from workers.engines.probe import parse_version_output, version_argv
from workers.errors import BenchbotError
from workers.host import simulated
from workers.host.connect import open_transport
from workers.host.transport import CommandResult, Transport

CHECK_TIMEOUT_S = 60.0


@dataclass
class HostCheck:
    """What ``--connect`` found on one host: facts that held, and problems (none means ready)."""

    host: str
    simulated: bool
    found: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _last_line(result: CommandResult) -> str:
    lines = [ln.strip() for ln in (result.stderr or result.stdout or "").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no output"


def _missing_files(host: HostConfig) -> list[str]:
    """SSH files the config names that this machine does not have (the worker reads them from here)."""
    if host.transport != "ssh":
        return []
    named = (("ssh_key", host.ssh_key), ("ssh_known_hosts", host.ssh_known_hosts))
    missing = [(what, path) for what, path in named if path and not Path(path).expanduser().is_file()]
    return [f"{what} {path} does not exist on this machine" for what, path in missing]


async def check_host(host: HostConfig, timeout_s: float = CHECK_TIMEOUT_S) -> HostCheck:
    """Reach ``host``, ask its engine for its version and its ``nvidia-smi`` for its GPUs."""
    check = HostCheck(host.name, simulated.is_simulated(host))
    check.problems += _missing_files(host)
    if check.problems:
        return check
    try:
        transport = open_transport(host)
    except BenchbotError as exc:
        check.problems.append(str(exc))
        return check
    try:
        await _check_with(transport, host, check, timeout_s)
    finally:
        await transport.close()
    return check


async def _check_with(transport: Transport, host: HostConfig, check: HostCheck, timeout_s: float) -> None:
    where = f"{host.ssh_user + '@' if host.ssh_user else ''}{host.ssh_target}:{host.ssh_port}"
    try:
        reached = await transport.run(["true"], timeout=timeout_s)
    except BenchbotError as exc:
        check.problems.append(str(exc))
        return
    if not reached.ok:
        check.problems.append(f"`true` failed on the host (exit {reached.returncode}): {_last_line(reached)}")
        return
    check.found.append(f"reached over ssh ({where})" if host.transport == "ssh" else "reached (this machine)")
    engine = host.engine
    argv = version_argv(engine.command, engine.version_command)
    shown = shlex.join(engine.command)
    if argv is None:
        check.problems.append(f"cannot tell how to ask `{shown}` its version: set engine.version_command")
    else:
        try:
            result = await transport.run(argv, timeout=timeout_s, env=dict(engine.env))
        except BenchbotError as exc:
            result = None
            check.problems.append(f"engine version command `{shlex.join(argv)}`: {exc}")
        if result is not None and not result.ok:
            check.problems.append(
                f"engine command `{shown}` does not run here: its version check exited {result.returncode} "
                f"({_last_line(result)})"
            )
        elif result is not None:
            version = parse_version_output(result.stdout)
            if version is None:
                check.problems.append(f"`{shlex.join(argv)}` printed no version ({_last_line(result)})")
            else:
                check.found.append(f"engine {engine.kind} {version} (`{shown}`)")
    smi = simulated.nvidia_smi_argv(host)
    try:
        gpus = await transport.run([*smi, "-L"], timeout=timeout_s)
    except BenchbotError as exc:
        check.problems.append(f"`{shlex.join(smi)} -L`: {exc}")
        return
    if not gpus.ok:
        check.problems.append(f"`{shlex.join(smi)} -L` exited {gpus.returncode} ({_last_line(gpus)})")
    else:
        count = sum(1 for line in gpus.stdout.splitlines() if line.startswith("GPU "))
        note = "" if count == host.gpus else f" (the config says {host.gpus})"
        stand_in = simulated.runs_module(smi, simulated.SIM_NVIDIA_SMI_MODULE)
        tool = "the simulator's nvidia-smi" if stand_in else "nvidia-smi"
        check.found.append(f"{count} GPUs ({tool}){note}")
