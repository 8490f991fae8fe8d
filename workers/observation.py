"""What really runs on a host, as one shape: the process on the port, the server's own args, the GPUs.

The seed's failure was a benchmark labelled "baseline" that ran against a NEXTN server, because the
config was remembered instead of looked at. So :func:`workers.observe_port.observe` always asks afresh (no
caching) and a :class:`RunningConfig` only holds what the host and the server said. The config fingerprint names a
configuration across restarts; the instance id names one process, so a restart mid-benchmark shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from workers.engines import args as engine_args
from workers.engines import registry
from workers.engines.args import ArgComparison, ArgDiff, ArgValues
from workers.engines.interface import ServerView
from workers.errors import BenchbotError
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
