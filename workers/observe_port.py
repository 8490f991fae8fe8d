"""Look at a host now: who owns the engine port, what that server says it runs, and the GPUs.

:func:`observe` asks afresh every time (no caching): the seed's failure was a benchmark labelled "baseline"
that ran against a NEXTN server, because the config was remembered instead of looked at. What it finds is a
:class:`~workers.observation.RunningConfig` (the shape, its identity and the nvidia-smi parser live there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol, TypedDict

from workers import observed_settings
from workers.engines import registry
from workers.engines.args import ArgValues
from workers.engines.interface import EngineDriver, ServerReport
from workers.errors import BenchbotError
from workers.host.process_table import HostProcess, ProcessTable, parse_compute_apps
from workers.host.process_table import scan as scan_processes
from workers.host.transport import CommandResult, ProcessInfo
from workers.observation import (
    GPU_QUERY,
    UNREAD_TABLE,
    GpuInfo,
    ObservedState,
    ProcessView,
    RunningConfig,
    instance_id,
    parse_nvidia_smi,
)
from workers.secrets import redact_argv

__all__ = ["observe"]


class _TransportLike(Protocol):
    async def listener_pid(self, port: int) -> int | None: ...
    async def process_info(self, pid: int) -> ProcessInfo | None: ...
    async def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult: ...
    async def read_file(self, path: str, max_bytes: int = ...) -> str | None: ...


async def _nvidia_smi(transport: _TransportLike, nvidia_smi: Sequence[str], query: str, timeout_s: float) -> str | None:
    """One nvidia-smi CSV query on the host; None when nvidia-smi is missing or fails."""
    if not nvidia_smi:
        return None
    argv = [*nvidia_smi, query, "--format=csv,noheader,nounits"]
    try:
        result = await transport.run(argv, timeout=timeout_s)
    except (BenchbotError, OSError):
        return None
    if result.returncode != 0:
        return None
    return result.stdout or ""


async def _gpus(transport: _TransportLike, nvidia_smi: Sequence[str], timeout_s: float) -> list[GpuInfo]:
    """GPUs via nvidia-smi on the host; no nvidia-smi (or a failing one) means no GPUs are reported."""
    text = await _nvidia_smi(transport, nvidia_smi, f"--query-gpu={GPU_QUERY}", timeout_s)
    return parse_nvidia_smi(text) if text is not None else []


async def _compute_apps(
    transport: _TransportLike, nvidia_smi: Sequence[str], timeout_s: float
) -> dict[int, int] | None:
    """``{pid: MiB}`` of every process holding GPU memory, or None when nvidia-smi cannot say."""
    text = await _nvidia_smi(transport, nvidia_smi, "--query-compute-apps=pid,used_memory", timeout_s)
    return parse_compute_apps(text) if text is not None else None


async def _process_table(transport: _TransportLike, timeout_s: float) -> ProcessTable:
    try:
        return await scan_processes(transport, timeout_s=timeout_s)
    except (BenchbotError, OSError) as exc:  # a timeout on a loaded host, a fork that failed
        return ProcessTable({}, unread=(str(exc) or type(exc).__name__)[:200])


def _view(info: ProcessInfo, redact: Callable[[Sequence[str]], list[str]] = redact_argv) -> ProcessView:
    return ProcessView(info.pid, info.pgid, tuple(redact(info.argv)), float(info.start_time), info.start_ticks)


class _PortFacts(TypedDict):
    """What every observation says whatever answered: who owns the port, the GPUs, when."""

    host: str
    port: int
    observed_at: float
    process: ProcessView | None
    gpus: tuple[GpuInfo, ...]
    instance_id: str | None
    launch_args: ArgValues
    engine_kind: str | None
    owner_user: str | None
    owner_gpu_mib: int | None
    gpu_processes: dict[int, int]


async def observe(
    transport: _TransportLike,
    *,
    host_name: str,
    port: int,
    api_key: str | None = None,
    nvidia_smi: Sequence[str] = ("nvidia-smi",),
    timeout_s: float = 5,
    base_url: str | None = None,
    engine_commands: Sequence[Sequence[str]] = (),
    driver: EngineDriver | None = None,
    report_timeout_s: float | None = None,
    settings_dir: str | None = None,
) -> RunningConfig:
    """Look at the host now: who owns ``port``, what that server says it runs, and the GPUs.

    ``report_timeout_s`` bounds the server's own report (default ``timeout_s``): a stopped or hung engine
    accepts the connection and never answers, and whoever waits for this observation must hear
    "unresponsive" before they give up on it.

    ``base_url`` is where this worker reaches the engine (``HostConfig.base_url``; default
    ``http://127.0.0.1:{port}``). The owner of the port is the process listening on it or, when nothing
    listens, an engine process bound for the port that is still loading (found in the process table;
    ``engine_commands`` adds configured engine commands to what is recognised as an engine). When the
    listener's pid is invisible (another user's process) but the server answers, the state is still
    ``running``, with ``process`` None and no instance id: we report what we saw, nothing more.

    ``driver`` is the host's engine (:func:`workers.engines.registry.driver_for`; default: the registry's
    default engine): it asks the server what it runs, fingerprints and labels it, and names its configured
    command's kind.

    ``settings_dir`` is the host's log_dir, where benchbot keeps the settings file of an engine that takes
    some settings from a file only (:mod:`workers.observed_settings`); None: such settings are not read back.
    """
    driver = driver or registry.driver_for(None)
    observed_at = time.time()
    url = base_url or f"http://127.0.0.1:{port}"

    async def listener() -> ProcessInfo | None:
        pid = await transport.listener_pid(port)
        return await transport.process_info(pid) if pid is not None else None

    async def listener_and_report() -> tuple[ProcessInfo | None, ServerReport]:
        # The server's own word, asked with the argv of the process listening (vLLM reads its args there).
        info = await listener()
        wait = timeout_s if report_timeout_s is None else report_timeout_s
        return info, await driver.report(url, api_key, wait, info.argv if info is not None else None)

    # The looks are independent; over SSH each is a round trip, so they run together.
    (info, report), gpu_list, apps, table = await asyncio.gather(
        listener_and_report(),
        _gpus(transport, nvidia_smi, timeout_s),
        _compute_apps(transport, nvidia_smi, timeout_s),
        _process_table(transport, timeout_s),
    )
    gpus = tuple(gpu_list)
    engines = table.engines(engine_commands, driver.kind)
    engine = None
    if info is not None:
        # The listener is an engine itself, or a process in an engine's tree (an HTTP worker).
        engine = next((e for e in engines if info.pid in e.tree), None)
        process: ProcessView | None = (
            _view(info, driver.redact_argv)
            if engine is None or engine.pid == info.pid
            else _host_view(engine.process, info, driver.redact_argv)
        )
    else:
        bound = [e for e in engines if e.port == port]
        engine = bound[0] if bound else None
        process = _host_view(engine.process, None, driver.redact_argv) if engine is not None else None
    outcome, detail = report.outcome, report.detail
    owner_user = None
    tree: tuple[int, ...] = ()
    if engine is not None:
        owner_user, tree = engine.process.user, engine.tree
    elif info is not None and info.pid in table.processes:
        owner_user, tree = table.processes[info.pid].user, table.tree(info.pid)
    common = _PortFacts(
        host=host_name,
        port=port,
        observed_at=observed_at,
        process=process,
        gpus=gpus,
        instance_id=instance_id(host_name, process.pid, process.start_ticks) if process else None,
        launch_args=driver.launch_args(process.argv) if process else {},
        engine_kind=engine.kind if engine is not None else None,
        owner_user=owner_user,
        owner_gpu_mib=sum(apps.get(pid, 0) for pid in tree) if apps is not None and tree else None,
        gpu_processes=dict(apps or {}),
    )

    if outcome in ("ok", "warming") and report.view is not None:
        # Warming up: it reports what it will serve, but only a passing health check makes it running.
        server = report.view
        hidden = "" if process else "the listening process is not visible to this user"
        extra = dict(report.extra)
        settings_file = registry.engine(driver.kind).settings_file
        unread = ""
        if settings_file is not None and process is not None and settings_dir is not None:
            # what it took from a file only, which no endpoint reports: read back from benchbot's own file
            read = await observed_settings.read_back(transport, settings_file, process.argv, port, settings_dir)
            if read.path is not None:
                server = replace(server, args=read.fold(server.args))
                extra["settings_file"] = {"path": read.path, "read": not read.unread, "settings": sorted(read.settings)}
                unread = read.detail
        return RunningConfig(
            state=ObservedState.RUNNING if outcome == "ok" else ObservedState.STARTING,
            server=server,
            fingerprint=driver.fingerprint(server),
            summary=driver.describe(server, common["launch_args"]),
            extra=extra,
            detail="; ".join(d for d in (detail if outcome == "warming" else "", hidden, unread) if d),
            **common,
        )
    state: ObservedState
    if info is None and outcome == "unreachable":
        state = ObservedState.LOADING if engine is not None else ObservedState.NONE
        if engine is not None:
            detail = "an engine process is bound for this port but does not listen yet (loading)"
        elif table.unread is not None:
            # Nothing listens, but a loading engine shows only in the process table: say we could not look.
            return RunningConfig(state=ObservedState.NONE, detail=detail, extra={UNREAD_TABLE: table.unread}, **common)
    elif outcome == "starting":
        state = ObservedState.STARTING
    elif outcome == "not_engine":
        state = ObservedState.NOT_ENGINE
    else:
        state = ObservedState.UNRESPONSIVE
    return RunningConfig(state=state, detail=detail, **common)


def _host_view(
    proc: HostProcess, listener: ProcessInfo | None = None, redact: Callable[[Sequence[str]], list[str]] = redact_argv
) -> ProcessView:
    """A process-table entry as a :class:`ProcessView` (argv redacted; the listener's when it is the same)."""
    argv = listener.argv if listener is not None and listener.pid == proc.pid else proc.argv
    return ProcessView(proc.pid, proc.pgid, tuple(redact(argv)), float(proc.start_time), proc.start_ticks)
