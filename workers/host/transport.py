"""Run commands on a GPU host, here or over SSH, behind one small interface.

Jobs hold a :class:`Transport` and never know which kind: :class:`~workers.host.local.LocalTransport`
(asyncio subprocesses, /proc read in-process) or :class:`~workers.host.ssh.SshTransport` (asyncssh,
every part of a remote command ``shlex.quote``d). :func:`workers.host.connect.open_transport` picks one
from a host's config; this module, the interface, imports neither implementation.

Both kinds keep the same promises, because a job that works on the laptop must work on the box:

- ``run`` takes an argv list (never a shell string); a timeout really ends the command and raises
  :class:`~workers.errors.TransportError`; a non-zero exit is an exception only with ``check=True``;
  a program that cannot be found exits 127.
- a zombie counts as dead.
- what reaches the host is checked here first, for both kinds (``check_argv``, ``check_env``, ``check_pgid``,
  ``check_signal``, ``check_positive``).

Side effects on the engine go through one host-side program, :mod:`workers.host.actuator`, sent the
same way by both transports (:meth:`Transport.actuate`): ``claim_host`` stores the job's fencing token
on the host, ``spawn_engine`` and ``signal_process`` act only while that token is still the newest,
under a lock held across the check and the action, so a worker paused between its Redis check and
the action can no longer touch a host another job took. Signals name a process by pid *and* start
ticks (a reused pid is never hit), and a group only when it is asked for and pgid == pid.
"""

from __future__ import annotations

import abc
import asyncio
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from workers.errors import StaleFenceError, TransportError
from workers.host.effect_record import ASKED, effect_record
from workers.json_value import JsonObject, JsonValue, RawJson
from workers.secrets import LOG_PATTERNS, REDACTED, is_secret_name

__all__ = [
    "CommandResult",
    "HostClock",
    "HostFence",
    "NewerClaimError",
    "ProcessInfo",
    "SignalResult",
    "SpawnedProcess",
    "Transport",
    "TransportError",
]

# How long a timed-out command gets between TERM and KILL (coreutils `timeout --kill-after`).
KILL_AFTER_S = 2.0
# Timeout for the small housekeeping commands (stat a pid, read a log chunk, ...).
QUICK_TIMEOUT_S = 30.0

#: What an engine inherits from the host side (the worker's env locally, the SSH login env remotely):
#: only these basics. Everything else it gets is named: host env, engine/preset env, ``engine.pass_env``.
ENGINE_BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR")
ENGINE_BASE_ENV_PREFIXES = ("LC_",)

#: The host-side actuator's source, sent as ``python3 -c`` (its requests travel on stdin).
ACTUATOR_SCRIPT = (Path(__file__).parent / "actuator.py").read_text(encoding="utf-8")


# ---- what every transport checks before anything reaches a host: argv, environment, process groups, signals.
# User text never reaches a shell: a command is an argv list whose items cross ``exec()`` and the ``env`` /
# ``timeout`` wrappers unchanged, environment names are identifiers, and a process group of 0 or 1 is refused.

# Signals a job may send to a process group; names as `kill -s` takes them.
SIGNAL_NAMES = frozenset({"TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT"})

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def check_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """A non-empty tuple of strings that can cross exec() and `env`/`timeout` wrappers unchanged."""
    if isinstance(argv, str | bytes):
        raise TransportError("a command must be a list of arguments, not one string")
    items = tuple(argv)
    if not items:
        raise TransportError("empty command")
    for item in items:
        if not isinstance(item, str):
            raise TransportError(f"command arguments must be text, got {type(item).__name__}")
        if "\0" in item:
            raise TransportError("a command argument contains a NUL character")
    # `env NAME=VALUE prog` and `timeout N prog` would read these as an assignment or an option.
    if not items[0] or items[0].startswith("-") or "=" in items[0]:
        raise TransportError(f"not a program name: {items[0]!r}")
    return items


def check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """Environment names must be shell identifiers; values are any text without NUL."""
    if not env:
        return {}
    checked: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise TransportError(f"not a valid environment variable name: {name!r}")
        if not isinstance(value, str) or "\0" in value:
            raise TransportError(f"environment variable {name} must be text without NUL characters")
        checked[name] = value
    return checked


def check_pgid(pgid: int) -> int:
    """Refuse 0, 1 and negatives: `kill -- -1` would signal every process we may signal (pids too)."""
    if isinstance(pgid, bool) or not isinstance(pgid, int) or pgid <= 1:
        raise TransportError(f"refusing to signal process group {pgid!r}")
    return pgid


def check_signal(signal: str) -> str:
    """Accept TERM / SIGTERM style names from a short list."""
    name = signal.upper().removeprefix("SIG")
    if name not in SIGNAL_NAMES:
        raise TransportError(f"unknown signal {signal!r} (use one of {', '.join(sorted(SIGNAL_NAMES))})")
    return name


def check_positive(value: float, what: str) -> float:
    """Timeouts and sizes must be positive: `timeout 0` would mean no timeout at all."""
    if not value > 0:
        raise TransportError(f"{what} must be positive, got {value!r}")
    return value


@dataclass(frozen=True)
class CommandResult:
    """What a finished command left behind; decoding errors are replaced, never raised."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.returncode == 0


@dataclass(frozen=True)
class SpawnedProcess:
    """A detached process: its own session, so ``pid == pgid``; ``start_ticks`` tells it from a reused pid."""

    pid: int
    pgid: int
    log_path: str
    start_ticks: int  # /proc/PID/stat field 22; 0 when the process was already gone
    log_writer_pid: int = 0  # the log scrubber: the log is complete once it has exited


#: The fence file of a port's engine: ``{log_dir}/.benchbot-fence-{port}``.
FENCE_FILE_PREFIX = ".benchbot-fence-"
#: What an engine's kept settings file adds to its fence file's name.
SETTINGS_FILE_SUFFIX = "-engine-settings.yaml"


def settings_file_name(port: int) -> str:
    """The name (no folder) of benchbot's kept settings file for the engine on ``port``."""
    return f"{FENCE_FILE_PREFIX}{int(port)}{SETTINGS_FILE_SUFFIX}"


def settings_file_path(directory: str, port: int) -> str:
    """benchbot's kept settings file for the engine on ``port``, in ``directory`` (the host's log_dir, beside
    the fence file): the observation reads a settings file back only when the running process names exactly
    this path (never anyone else's file, nor a file of that name elsewhere)."""
    return f"{directory.rstrip('/') or '/'}/{settings_file_name(port)}"


@dataclass(frozen=True)
class HostFence:
    """A job's claim on a host, as the host keeps it: the fence file and the lease's fencing token.

    One fence file per host and engine port (``{log_dir}/.benchbot-fence-{port}``, mode 0600); the
    engine's private config (its API key) lives beside it until the engine is ready or dead, and an engine's
    settings file without a secret (:class:`workers.engines.interface.SettingsFile`) for as long as it runs.
    """

    path: str
    token: int
    #: The lease's proven deadline on the worker's ``time.monotonic()`` clock, read at each request: the
    #: transport maps it onto the host's clock (learned by ``claim_host``) so the host refuses the action
    #: once the lease may have expired, even before anyone else claims. None: the token alone decides.
    deadline: Callable[[], float] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def for_port(cls, directory: str, port: int, token: int, deadline: Callable[[], float] | None = None) -> HostFence:
        """The fence of the engine on ``port``, its file in ``directory`` (the host's log_dir)."""
        if isinstance(token, bool) or not isinstance(token, int) or token < 1:
            raise TransportError(f"not a fencing token: {token!r}")
        return cls(f"{directory.rstrip('/') or '/'}/{FENCE_FILE_PREFIX}{int(port)}", token, deadline)

    @property
    def engine_config_path(self) -> str:
        """Where ``spawn_engine`` writes the engine's private options (0600), for ``--config PATH``."""
        return f"{self.path}-engine.yaml"

    @property
    def engine_settings_path(self) -> str:
        """Where ``spawn_engine`` writes engine settings that hold no secret (0600), for ``--config PATH``: kept
        while the server runs so the observation can read back what it was started with."""
        return f"{self.path}{SETTINGS_FILE_SUFFIX}"

    def to_dict(self) -> JsonObject:
        """The request shape the actuator reads (without a deadline: :meth:`Transport.fence_request` adds it)."""
        return {"path": self.path, "token": self.token}


class NewerClaimError(StaleFenceError):
    """``claim_host`` found a newer token (``stored``) in the host's fence file than the job's."""

    def __init__(self, message: str, stored: int) -> None:
        super().__init__(message)
        self.stored = stored


@dataclass(frozen=True)
class HostClock:
    """How the worker's monotonic clock maps onto a host's boot clock, learned at the claim.

    ``host_t`` was read by the host while serving the claim and ``worker_t0`` by the worker once the answer
    was back, so the host's reading came *earlier* in real time: ``host_t + (deadline - worker_t0)`` on the
    host's clock is never later than ``deadline`` on the worker's (it is early by up to the claim's round
    trip). (Reading the worker's clock before sending would err *late* by the request's transit: the
    OpenSSH test caught that, where a claim's round trip is a new session.) Both clocks run at the rate of
    real time (drift is parts per million); ``boot`` pins the mapping to one boot.
    """

    worker_t0: float
    host_t: float
    boot: str

    def on_host(self, worker_deadline: float) -> float:
        """The host-clock instant no later than ``worker_deadline`` on the worker's clock."""
        return self.host_t + (worker_deadline - self.worker_t0)


@dataclass(frozen=True)
class SignalResult:
    """What the host did with a signal: ``sent``, ``gone`` (no such live process) or ``refused``.

    ``reason`` says why a signal was refused: ``reused`` (the pid now belongs to a process with other
    start ticks), ``not_group_leader`` (a group was asked for and pgid != pid), ``not_permitted``.
    """

    outcome: str
    reason: str
    detail: str

    @property
    def sent(self) -> bool:
        """True when the signal was delivered."""
        return self.outcome == "sent"


@dataclass(frozen=True)
class ProcessInfo:
    """What /proc says about a process: enough to name it and to tell it from a later one with its pid."""

    pid: int
    pgid: int
    argv: tuple[str, ...]
    start_ticks: int
    start_time: float  # unix epoch, btime + start_ticks / CLK_TCK (1 s resolution from btime)


class Transport(abc.ABC):
    """Commands, detached processes, logs and /proc facts on one host."""

    host_label: str
    #: Told of every fenced actuator operation once it answered or failed (:mod:`workers.host.effect_record`): the job's
    #: effect journal (``workers.jobs.effects``) listens here; None, nobody does. It never decides anything.
    on_effect: Callable[[JsonObject], None] | None = None

    def __init__(self, host_label: str, env: Mapping[str, str] | None = None) -> None:
        self.host_label = host_label
        self._host_env = check_env(env)
        self._host_clock: HostClock | None = None  # learned by claim_host

    @abc.abstractmethod
    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        check: bool = False,
    ) -> CommandResult:
        """Run argv to completion; TransportError on timeout (the command is stopped) or, with check, rc != 0."""

    @abc.abstractmethod
    async def read_log(self, path: str, offset: int = 0, max_bytes: int = 1 << 20) -> tuple[str, int]:
        """Text appended since ``offset`` and the offset to pass next time.

        A missing file gives ``("", offset)``; a file shorter than ``offset`` (truncated by a new launch)
        is read from 0. A UTF-8 character cut by ``max_bytes`` is left for the next call.
        """

    @abc.abstractmethod
    async def tail(self, path: str, lines: int = 40) -> list[str]:
        """The last ``lines`` lines of a file, without newlines; [] when it does not exist."""

    @abc.abstractmethod
    async def is_alive(self, pid: int) -> bool:
        """True when the process exists and is not a zombie."""

    @abc.abstractmethod
    async def listener_pid(self, port: int) -> int | None:
        """The pid of the process listening on TCP ``port`` (any address), or None.

        When several processes share the socket (a forked server): the /proc probe gives the one whose
        parent does not hold it, `ss` the lowest pid; either is in the engine's tree. Without root,
        other users' processes are invisible and give None.
        """

    @abc.abstractmethod
    async def process_info(self, pid: int) -> ProcessInfo | None:
        """argv and start time of a process from /proc, or None when it does not exist."""

    @abc.abstractmethod
    async def file_exists(self, path: str) -> bool:
        """True when ``path`` exists (file or directory)."""

    @abc.abstractmethod
    async def read_file(self, path: str, max_bytes: int = 1 << 20) -> str | None:
        """The start of a small text file (pidfiles, configs), or None when it does not exist."""

    @abc.abstractmethod
    async def write_file(self, path: str, text: str) -> None:
        """Create or replace a small text file."""

    @abc.abstractmethod
    async def make_dirs(self, path: str) -> None:
        """``mkdir -p``."""

    @abc.abstractmethod
    async def remove_file(self, path: str) -> bool:
        """Remove a file; False when it was not there."""

    # ---- fenced side effects, one implementation for every transport ---------------------------------

    #: The interpreter that runs the actuator on the host (the worker's own locally).
    host_python = "python3"

    async def actuate(self, request: JsonObject) -> RawJson:
        """Run one actuator operation on the host; StaleFenceError when a newer claim refused it.

        The request (it may hold secrets) goes on stdin, never on argv or in the environment. A fenced
        operation is reported to :attr:`on_effect` once it answered or failed, with when it began and ended.
        """
        began = time.time()
        answer: Any = None
        outcome = "error"
        journaled = self.on_effect is not None and isinstance(request.get("fence"), Mapping)
        if journaled and request.get("op") == "spawn" and self.on_effect is not None:
            # A spawn outlives a job killed before its answer came back: the ask is journaled first, so an engine
            # that started after it is still accounted for (its job's record was never written).
            self.on_effect(effect_record(request, None, ASKED, began, began))
        try:
            result = await self.run(
                [self.host_python, "-c", ACTUATOR_SCRIPT], timeout=QUICK_TIMEOUT_S, input=json.dumps(dict(request))
            )
            lines = result.stdout.strip().splitlines()
            if result.returncode == 0 and lines:
                try:
                    answer = json.loads(lines[-1])
                except ValueError:
                    answer = None
            if not isinstance(answer, dict):
                answer = None
                detail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-3:]
                raise TransportError(
                    f"{self.host_label}: the host-side actuator failed ({request.get('op')}, status "
                    f"{result.returncode}){': ' + ' / '.join(detail) if detail else ''}"
                )
            if answer.get("ok"):
                outcome = str(answer.get("outcome") or "ok")
                return answer
            message = f"{self.host_label}: {answer.get('error') or 'refused'}"
            if answer.get("stale"):
                outcome = "stale"
                raise StaleFenceError(message)
            outcome = "refused"
            raise TransportError(message)
        finally:
            if journaled and self.on_effect is not None:
                self.on_effect(effect_record(request, answer, outcome, began, time.time()))

    def fence_request(self, fence: HostFence) -> JsonObject:
        """The fence as the actuator checks it: the token, and for a fence with a deadline that deadline on
        the host's clock (``until``), so the host refuses the action once the lease may have expired."""
        request = fence.to_dict()
        if fence.deadline is None:
            return request
        clock = self._host_clock
        if clock is None:
            raise StaleFenceError(f"{self.host_label}: fence {fence.token} was not claimed through this connection")
        request["until"] = clock.on_host(fence.deadline())
        request["boot"] = clock.boot
        return request

    async def claim_host(self, fence: HostFence) -> None:
        """Record ``fence`` as the host's newest claim (a job's first host action after taking the lease).

        Removes a private engine config a dead job left behind, and learns the host's clock (see
        :class:`HostClock`). StaleFenceError when the host already holds a newer token: another job took
        the host since.
        """
        answer = await self.actuate({"op": "claim", "fence": fence.to_dict(), "remove": [fence.engine_config_path]})
        worker_t0 = time.monotonic()  # after the answer, so after the host read its clock: errs early, never late
        if isinstance(answer.get("clock"), int | float):
            self._host_clock = HostClock(worker_t0, float(answer["clock"]), str(answer.get("boot") or ""))
        stored = answer.get("stored")
        if stored != fence.token:
            raise NewerClaimError(
                f"{self.host_label}: stale fence: {fence.path} holds {stored}, newer than this job's {fence.token}: "
                "another job holds the host now",
                int(stored) if isinstance(stored, int) else 0,
            )

    async def spawn_engine(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        fence: HostFence,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        private_options: Mapping[str, JsonValue] | None = None,
        secrets: Sequence[str] = (),
        settings: Mapping[str, object] | None = None,
    ) -> SpawnedProcess:
        """Start argv detached, in its own session (pid == pgid == sid), only while ``fence`` is the newest.

        Its environment is exactly the host env, ``env`` and the basics of :data:`ENGINE_BASE_ENV` from the
        host side. ``private_options`` are written as JSON (valid YAML) to ``fence.engine_config_path``
        (mode 0600) for the caller's ``--config PATH``; without them, ``settings`` (engine settings that hold
        no secret) go to ``fence.engine_settings_path`` instead, the same way, and stay there (the caller
        removes the private file once the engine has read it; :meth:`remove_engine_settings` the settings
        file once the engine is stopped). stdout and stderr reach ``log_path`` (0600, truncated) through a
        scrubber that hides ``secrets``, the private option values and ``api_key=...``/``--api-key X`` style
        assignments. Returns once the program was exec'd.
        """
        items = check_argv(argv)
        hidden = [str(v) for v in secrets if v]
        private = None
        if private_options:
            hidden += [str(v) for v in private_options.values() if isinstance(v, str) and v]
            hidden += _nested_secrets(private_options)  # settings beside the key: a secret-named one at any depth
            private = {"path": fence.engine_config_path, "text": json.dumps(dict(private_options))}
        elif settings:
            private = {"path": fence.engine_settings_path, "text": json.dumps(dict(settings))}
        answer = await self.actuate(
            {
                "op": "spawn",
                "fence": self.fence_request(fence),
                "argv": list(items),
                "env": self._merged_env(env),
                "inherit": list(ENGINE_BASE_ENV),
                "inherit_prefixes": list(ENGINE_BASE_ENV_PREFIXES),
                "cwd": cwd,
                "log_path": log_path,
                "private_file": private,
                "scrub": {"secrets": hidden, "patterns": list(LOG_PATTERNS), "replacement": REDACTED},
            }
        )
        return SpawnedProcess(
            pid=int(answer["pid"]),
            pgid=int(answer["pgid"]),
            log_path=str(answer["log_path"]),
            start_ticks=int(answer["start_ticks"]),
            log_writer_pid=int(answer["log_writer_pid"]),
        )

    async def wait_log_written(self, spawned: SpawnedProcess, timeout_s: float = 2.0) -> bool:
        """After the engine died: wait (bounded) until its log scrubber wrote the last lines and exited.

        False when it still runs at the deadline (an orphaned child of the engine keeps its output open).
        """
        deadline = time.monotonic() + timeout_s
        while spawned.log_writer_pid > 1 and await self.is_alive(spawned.log_writer_pid):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def remove_engine_config(self, fence: HostFence) -> bool:
        """Remove the engine's private config (once it is ready or dead); False when it was not there."""
        answer = await self.actuate(
            {"op": "unlink", "fence": self.fence_request(fence), "path": fence.engine_config_path}
        )
        return bool(answer.get("removed"))

    async def remove_engine_settings(self, fence: HostFence) -> bool:
        """Remove the engine's kept settings file (once that engine is stopped); False when it was not there."""
        answer = await self.actuate(
            {"op": "unlink", "fence": self.fence_request(fence), "path": fence.engine_settings_path}
        )
        return bool(answer.get("removed"))

    async def signal_process(
        self, pid: int, start_ticks: int, signal: str = "TERM", *, group: bool = False, fence: HostFence
    ) -> SignalResult:
        """Signal the process ``pid`` started at ``start_ticks``, only while ``fence`` is the newest claim.

        ``group=True`` signals its whole process group, and only when it leads one (pgid == pid): that is
        how benchbot starts engines. A pid now held by another process is refused, never signalled.
        """
        check_pgid(pid)
        answer = await self.actuate(
            {
                "op": "signal",
                "fence": self.fence_request(fence),
                "pid": int(pid),
                "start_ticks": int(start_ticks),
                "signal": check_signal(signal),
                "group": bool(group),
            }
        )
        return SignalResult(str(answer["outcome"]), str(answer.get("reason") or ""), str(answer.get("detail") or ""))

    async def process_descendants(self, pid: int, start_ticks: int) -> list[tuple[int, int]]:
        """Live descendants (pid, start ticks) of the process ``pid`` started at ``start_ticks`` (read-only)."""
        answer = await self.actuate({"op": "descendants", "pid": int(pid), "start_ticks": int(start_ticks)})
        return [(int(p), int(t)) for p, t in answer.get("descendants") or ()]

    async def close(self) -> None:  # noqa: B027 - a no-op by default: only SSH holds a connection
        """Release connections; detached processes keep running."""

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _merged_env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        """Host env overlaid with the call's env (the call wins), validated."""
        return {**self._host_env, **check_env(env)}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.host_label}>"


def _nested_secrets(options: Mapping[str, object]) -> list[str]:
    """The string values of secret-named keys inside nested tables of ``options`` (what the scrubber hides)."""
    found: list[str] = []
    for value in options.values():
        if isinstance(value, Mapping):
            found += [str(v) for k, v in value.items() if isinstance(v, str) and v and is_secret_name(str(k))]
            found += _nested_secrets(value)
    return found
