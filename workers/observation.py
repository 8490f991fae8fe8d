"""Observe what really runs on a host: the process on the port, the server's own args, the GPUs.

The seed's failure was a benchmark labelled "baseline" that ran against a NEXTN server, because the
config was remembered instead of looked at. So :func:`observe` always asks afresh (no caching) and a
:class:`RunningConfig` only holds what the host and the server said. The config fingerprint names a
configuration across restarts; the instance id names one process, so a restart mid-benchmark shows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol, TypedDict

from workers import observed_settings
from workers.engines import args as engine_args
from workers.engines import registry
from workers.engines.args import ArgComparison, ArgDiff, ArgValues
from workers.engines.interface import EngineDriver, ServerReport, ServerView
from workers.errors import BenchbotError
from workers.host.process_table import HostProcess, ProcessTable, parse_compute_apps
from workers.host.process_table import scan as scan_processes
from workers.host.transport import CommandResult, ProcessInfo
from workers.json_value import (
    JsonObject,
    JsonValue,
    json_object,
    opt_bool,
    opt_int,
    opt_str,
    req_float,
    req_int,
)
from workers.secrets import redact_argv

__all__ = [
    "ArgComparison",
    "ArgDiff",
    "GpuInfo",
    "LaunchedBy",
    "ObservedState",
    "ProcessView",
    "RunningConfig",
    "ServerView",
    "compare_requested",
    "diff_requested",
    "instance_id",
    "observe",
    "parse_nvidia_smi",
]

SCHEMA = 1


class ObservedState(StrEnum):
    """What answers on a host's engine port (see :class:`RunningConfig`); values are the stored strings."""

    RUNNING = "running"
    STARTING = "starting"
    LOADING = "loading"
    NONE = "none"
    UNRESPONSIVE = "unresponsive"
    #: It answered, but not as the host's engine. The stored word predates other engines; it stays.
    NOT_ENGINE = "not_sglang"


STATES = tuple(ObservedState)
#: The ``extra`` key of a ``none`` observation whose process table could not be read (why): nothing listened,
#: but an engine still loading (which only the process table shows) may be there.
UNREAD_TABLE = "process_table_unread"
GPU_QUERY = "index,name,memory.used,memory.total,utilization.gpu,compute_cap"

# ---------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessView:
    """The process that owns the port, from /proc (argv redacted)."""

    pid: int
    pgid: int
    argv: tuple[str, ...]
    start_time: float
    start_ticks: int

    def to_dict(self) -> JsonObject:
        return {
            "pid": self.pid,
            "pgid": self.pgid,
            "argv": list(self.argv),
            "start_time": self.start_time,
            "start_ticks": self.start_ticks,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> ProcessView:
        argv = d["argv"]
        if not isinstance(argv, list | tuple):
            raise TypeError(f"argv is {type(argv).__name__}, not a list")
        return cls(
            req_int(d["pid"]),
            req_int(d["pgid"]),
            tuple(str(word) for word in argv),
            req_float(d["start_time"]),
            req_int(d["start_ticks"]),
        )


@dataclass(frozen=True)
class GpuInfo:
    """One row of ``nvidia-smi --query-gpu``; a field nvidia-smi reports as ``[N/A]`` is None."""

    index: int
    name: str
    memory_used_mib: int | None
    memory_total_mib: int | None
    utilization_pct: int | None
    compute_cap: str | None

    def to_dict(self) -> JsonObject:
        return {
            "index": self.index,
            "name": self.name,
            "memory_used_mib": self.memory_used_mib,
            "memory_total_mib": self.memory_total_mib,
            "utilization_pct": self.utilization_pct,
            "compute_cap": self.compute_cap,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> GpuInfo:
        return cls(
            req_int(d["index"]),
            str(d["name"]),
            opt_int(d.get("memory_used_mib")),
            opt_int(d.get("memory_total_mib")),
            opt_int(d.get("utilization_pct")),
            opt_str(d.get("compute_cap")),
        )


@dataclass(frozen=True)
class LaunchedBy:
    """Who started a managed instance, with which job and when (from benchbot's launch record)."""

    user: str | None
    job: str | None
    at: float | None = None
    label: str | None = None

    def to_dict(self) -> JsonObject:
        return {"user": self.user, "job": self.job, "at": self.at, "label": self.label}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> LaunchedBy:
        at = d.get("at")
        return cls(
            user=None if d.get("user") is None else str(d["user"]),
            job=None if d.get("job") is None else str(d["job"]),
            at=float(at) if isinstance(at, (int, float)) else None,
            label=None if d.get("label") is None else str(d["label"]),
        )


@dataclass(frozen=True)
class RunningConfig:
    """One observation of a host's engine port. JSON shape: :meth:`to_dict` (``"schema": 1``).

    ``state``: ``running`` (the engine answered as itself and its health check passes), ``starting`` (it
    answers but is not ready: SGLang's 503 on ``/server_info``, or warming up: it says what it will serve
    while its health check says 503, and then ``server``, ``fingerprint`` and ``summary`` say what it will
    serve and ``detail`` starts with ``warming up``), ``loading`` (nothing listens yet, but an engine
    process bound for the port exists: real SGLang binds only once its weights are loaded), ``none`` (no
    listener, no engine), ``unresponsive`` (something owns the port but did not answer), ``not_sglang``
    (:attr:`ObservedState.NOT_ENGINE`: it answered, but not like the host's engine). ``engine_kind`` says
    whether the owning process is an engine benchbot can identify from its argv (``sglang``, ``vllm-sim``,
    ...), None for anything else: only identified engines are ever stopped. ``managed``/``launched_by`` and
    ``engine_version`` are for the caller to fill (``workers.observer.observe_host``).

    This is the one shape of an observation inside a process: the worker's jobs, the bot's dispatcher
    and renderers all take it; a dict exists only in Redis and JSON (:meth:`to_dict` / :meth:`from_dict`).
    """

    host: str
    port: int
    observed_at: float
    state: ObservedState
    process: ProcessView | None = None
    server: ServerView | None = None
    gpus: tuple[GpuInfo, ...] = ()
    fingerprint: str | None = None
    instance_id: str | None = None
    summary: str = ""
    detail: str = ""
    managed: bool | None = None
    launched_by: LaunchedBy | None = None  # who/what/when, filled by workers.observer for managed instances
    extra: Mapping[str, JsonValue] = field(default_factory=dict)
    #: ``{--flag: value}`` parsed from the listening process's argv (the driver's ``launch_args``).
    #: What it was started with, which can differ in name from what the server reports (NEXTN is
    #: renamed EAGLE inside SGLang); never used for the fingerprint.
    launch_args: ArgValues = field(default_factory=dict)
    #: What kind of engine owns the port, read from its argv (``sglang``, ``vllm-sim``, ...), or None when
    #: the owner is not an engine benchbot can identify (or nothing owns the port).
    engine_kind: str | None = None
    #: The operating-system user the owning process runs as.
    owner_user: str | None = None
    #: GPU memory (MiB) held by the owner's process tree, from ``nvidia-smi --query-compute-apps``;
    #: None when nvidia-smi could not tell.
    owner_gpu_mib: int | None = None
    #: Every compute process on the GPUs: ``{pid: MiB}`` (who else holds memory).
    gpu_processes: dict[int, int] = field(default_factory=dict)
    #: The engine's version: the server's own once it answers, else the last probe's (filled by the observer).
    engine_version: str | None = None

    @property
    def is_running(self) -> bool:
        return self.state == ObservedState.RUNNING

    @property
    def args(self) -> ArgValues:
        """The server's own args, {} when no server answered."""
        return self.server.args if self.server is not None else {}

    @property
    def is_engine(self) -> bool:
        """True when the port's owner is an engine identified from its argv (so it may be stopped)."""
        return self.engine_kind is not None

    def to_dict(self) -> JsonObject:
        return {
            "schema": SCHEMA,
            "host": self.host,
            "port": self.port,
            "observed_at": self.observed_at,
            "state": self.state,
            "process": self.process.to_dict() if self.process else None,
            "server": self.server.to_dict() if self.server else None,
            "gpus": [g.to_dict() for g in self.gpus],
            "fingerprint": self.fingerprint,
            "instance_id": self.instance_id,
            "summary": self.summary,
            "detail": self.detail,
            "managed": self.managed,
            "launched_by": self.launched_by.to_dict() if self.launched_by is not None else None,
            "launch_args": dict(self.launch_args),
            "engine_kind": self.engine_kind,
            "owner_user": self.owner_user,
            "owner_gpu_mib": self.owner_gpu_mib,
            "gpu_processes": {str(k): v for k, v in self.gpu_processes.items()},
            "engine_version": self.engine_version,
            **({"extra": dict(self.extra)} if self.extra else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RunningConfig:
        """Inverse of :meth:`to_dict`; a missing or future schema is a friendly error.

        Older schema-1 writers left fields out (``engine_kind``, ``owner_*``, ``launch_args``...):
        each has a default. ``launched_by`` may be missing, None or a partial mapping.
        """
        if not isinstance(data, Mapping):
            raise BenchbotError("a stored observation is not a JSON object")
        schema = data.get("schema")
        if schema != SCHEMA:
            raise BenchbotError(f"a stored observation has schema {schema!r}; this benchbot reads schema {SCHEMA}")
        try:
            return cls(
                host=str(data["host"]),
                port=req_int(data["port"]),
                observed_at=req_float(data["observed_at"]),
                state=ObservedState(str(data["state"])),
                process=ProcessView.from_dict(_object(data["process"], "process")) if data.get("process") else None,
                server=ServerView.from_dict(_object(data["server"], "server")) if data.get("server") else None,
                gpus=tuple(GpuInfo.from_dict(_object(g, "a gpu")) for g in _list(data.get("gpus"))),
                fingerprint=opt_str(data.get("fingerprint")),
                instance_id=opt_str(data.get("instance_id")),
                summary=str(data.get("summary") or ""),
                detail=str(data.get("detail") or ""),
                managed=opt_bool(data.get("managed")),
                launched_by=_launched_by(data.get("launched_by")),
                extra=json_object(data.get("extra")),
                launch_args=json_object(data.get("launch_args")),
                engine_kind=opt_str(data.get("engine_kind")),
                owner_user=opt_str(data.get("owner_user")),
                owner_gpu_mib=opt_int(data.get("owner_gpu_mib")),
                gpu_processes={req_int(k): req_int(v) for k, v in json_object(data.get("gpu_processes")).items()},
                engine_version=opt_str(data.get("engine_version")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BenchbotError(f"a stored observation is malformed ({type(exc).__name__}: {exc})") from exc


def _launched_by(value: object) -> LaunchedBy | None:
    return LaunchedBy.from_dict(value) if isinstance(value, Mapping) else None


def _object(value: object, what: str) -> Mapping[str, object]:
    """A nested JSON object of a stored observation (its process, server, a GPU); TypeError when it is none."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} is {type(value).__name__}, not an object")
    return value


def _list(value: object) -> list[object]:
    """A stored list (``gpus``): missing or null is empty; TypeError when it is something else."""
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return list(value)


# ---------------------------------------------------------------------------------------------------------
# Identity
# ---------------------------------------------------------------------------------------------------------


def instance_id(host_name: str, pid: int, start_ticks: int) -> str:
    """``"gpu-1:12345:987654"``: a pid alone is reused, a pid plus its start tick is not."""
    return f"{host_name}:{pid}:{start_ticks}"


# ---------------------------------------------------------------------------------------------------------
# Labels and diffs
# ---------------------------------------------------------------------------------------------------------


def compare_requested(requested: ArgValues, observed_args: ArgValues) -> ArgComparison:
    """What was asked for against what the server reports (:func:`workers.engines.args.compare_requested`),
    with every registered engine's renamed args and rewritten values (keyed by the engines' own arg names,
    so one engine's never stand for another's)."""
    renames: dict[str, tuple[str, ...]] = {}
    equivalents: dict[tuple[str, str, str], str] = {}
    for driver in registry.drivers():
        for arg, names in driver.observed_renames.items():
            renames[arg] = (*renames.get(arg, ()), *names)
        equivalents.update(driver.equivalent_values)
    return engine_args.compare_requested(requested, observed_args, renames=renames, equivalents=equivalents)


def diff_requested(requested: ArgValues, observed_args: ArgValues) -> list[ArgDiff]:
    """Requested args (already mapped, see the driver's ``requested_args``) the server does not run as asked.

    Only the requested keys are compared; NEXTN vs EAGLE and ``auto`` are equal; numbers and bools
    are coerced. Use :func:`compare_requested` to also get the notes that say which values were
    treated as equal and why.
    """
    return compare_requested(requested, observed_args).diffs


# ---------------------------------------------------------------------------------------------------------
# nvidia-smi
# ---------------------------------------------------------------------------------------------------------


def _opt_int(text: str) -> int | None:
    text = text.strip()
    try:
        return int(float(text))
    except ValueError:
        return None  # "[N/A]", "[Not Supported]", ""


def parse_nvidia_smi(text: str) -> list[GpuInfo]:
    """Parse ``--query-gpu=index,name,memory.used,memory.total,utilization.gpu,compute_cap`` CSV rows.

    The name is whatever lies between the first field and the last four, so a comma in it is harmless;
    malformed rows are skipped rather than guessed.
    """
    gpus: list[GpuInfo] = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 6:
            continue
        index = _opt_int(fields[0])
        if index is None:
            continue
        name = ", ".join(fields[1:-4])
        used, total, util, cap = fields[-4:]
        gpus.append(
            GpuInfo(
                index=index,
                name=name,
                memory_used_mib=_opt_int(used),
                memory_total_mib=_opt_int(total),
                utilization_pct=_opt_int(util),
                compute_cap=cap if cap and not cap.startswith("[") else None,
            )
        )
    return gpus


# ---------------------------------------------------------------------------------------------------------
# observe
# ---------------------------------------------------------------------------------------------------------


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
