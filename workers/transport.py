"""Run commands on a GPU host, here or over SSH, behind one small interface.

Jobs hold a :class:`Transport` and never know which kind: :class:`~workers.transport_local.LocalTransport`
(asyncio subprocesses, /proc read in-process) or :class:`~workers.transport_ssh.SshTransport` (asyncssh,
every part of a remote command ``shlex.quote``d). :func:`open_transport` picks one from a host's config.

Both kinds keep the same promises, because a job that works on the laptop must work on the box:

- ``run`` takes an argv list (never a shell string); a timeout really ends the command and raises
  :class:`~workers.errors.TransportError`; a non-zero exit is an exception only with ``check=True``;
  a program that cannot be found exits 127.
- ``spawn_detached`` starts a process in its own session (pid == pgid == sid) whose output goes to a
  log file, returns at once, and the process outlives the transport.
- a zombie counts as dead; ``signal_group`` refuses pgid <= 1 so a bug can never signal everything.
"""

from __future__ import annotations

import abc
import codecs
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from workers.errors import TransportError

if TYPE_CHECKING:
    from workers.transport_local import LocalTransport
    from workers.transport_ssh import SshTransport

__all__ = [
    "CommandResult",
    "HostLike",
    "LocalTransport",
    "ProcessInfo",
    "SpawnedProcess",
    "SshTransport",
    "Transport",
    "TransportError",
    "open_transport",
]

# Signals a job may send to a process group; names as `kill -s` takes them.
SIGNAL_NAMES = frozenset({"TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT"})
# How long a timed-out command gets between TERM and KILL (coreutils `timeout --kill-after`).
KILL_AFTER_S = 2.0
# Timeout for the small housekeeping commands (stat a pid, read a log chunk, ...).
QUICK_TIMEOUT_S = 30.0

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


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


@dataclass(frozen=True)
class ProcessInfo:
    """What /proc says about a process: enough to name it and to tell it from a later one with its pid."""

    pid: int
    pgid: int
    argv: tuple[str, ...]
    start_ticks: int
    start_time: float  # unix epoch, btime + start_ticks / CLK_TCK (1 s resolution from btime)


class HostLike(Protocol):
    """The attributes of ``workers.config.HostConfig`` that choosing a transport needs (duck typed)."""

    name: str
    transport: str  # "local" | "ssh"
    ssh_target: str | None
    ssh_port: int | None
    ssh_user: str | None
    ssh_key: str | None
    ssh_known_hosts: str | None
    ssh_insecure_no_host_check: bool
    env: Mapping[str, str] | None


class Transport(abc.ABC):
    """Commands, detached processes, logs and /proc facts on one host."""

    host_label: str

    def __init__(self, host_label: str, env: Mapping[str, str] | None = None) -> None:
        self.host_label = host_label
        self._host_env = check_env(env)

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
    async def spawn_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> SpawnedProcess:
        """Start argv in a new session with stdout+stderr to log_path (truncated) and return at once."""

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
    async def signal_group(self, pgid: int, signal: str = "TERM") -> bool:
        """Send a signal to a whole process group; False when no such group exists."""

    @abc.abstractmethod
    async def is_alive(self, pid: int) -> bool:
        """True when the process exists and is not a zombie."""

    @abc.abstractmethod
    async def listener_pid(self, port: int) -> int | None:
        """The pid of the process listening on TCP ``port`` (any address), or None.

        When several processes share the socket (a forked server) the lowest pid wins. Without root,
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


def open_transport(host: HostLike) -> Transport:
    """The transport a host's config asks for; raises TransportError for an unknown kind."""
    kind = getattr(host, "transport", "local")
    env = getattr(host, "env", None) or None
    if kind == "local":
        from workers.transport_local import LocalTransport

        return LocalTransport(name=host.name, env=env)
    if kind == "ssh":
        from workers.transport_ssh import SshTransport

        target = getattr(host, "ssh_target", None)
        if not target:
            raise TransportError(f"host {host.name!r} uses ssh but has no ssh_target")
        return SshTransport(
            target,
            getattr(host, "ssh_port", None) or 22,
            username=getattr(host, "ssh_user", None),
            key_path=getattr(host, "ssh_key", None),
            known_hosts=getattr(host, "ssh_known_hosts", None),
            insecure_no_host_check=bool(getattr(host, "ssh_insecure_no_host_check", False)),
            name=host.name,
            env=env,
        )
    raise TransportError(f"host {host.name!r}: unknown transport {kind!r} (use 'local' or 'ssh')")


def __getattr__(name: str) -> object:
    """Lazy re-exports: the implementations import this module, so importing them here would be a cycle."""
    if name == "LocalTransport":
        from workers.transport_local import LocalTransport

        return LocalTransport
    if name == "SshTransport":
        from workers.transport_ssh import SshTransport

        return SshTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- validation shared by both transports -------------------------------------------------------------


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
    """Refuse 0, 1 and negatives: `kill -- -1` would signal every process we may signal."""
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


# ---- a /proc probe both transports run (remote hosts have python3; SGLang needs it) ------------------

# argv[1] = port. Prints the lowest pid holding a LISTEN socket on that port (any address), or nothing.
# One implementation for both transports; the SSH transport tries `ss` first and falls back to this.
LISTENER_SCRIPT = """\
import os, sys
port = int(sys.argv[1])
wanted = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        with open(table) as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        cols = row.split()
        if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
            wanted.add("socket:[%s]" % cols[9])
pids = []
for entry in os.listdir("/proc") if wanted else ():
    if not entry.isdigit():
        continue
    try:
        fds = os.listdir("/proc/%s/fd" % entry)
    except OSError:
        continue
    for fd in fds:
        try:
            if os.readlink("/proc/%s/fd/%s" % (entry, fd)) in wanted:
                pids.append(int(entry))
                break
        except OSError:
            continue
print(min(pids) if pids else "")
"""


def parse_listener_output(text: str) -> int | None:
    """The pid LISTENER_SCRIPT printed, or None."""
    text = text.strip()
    return int(text) if text.isdigit() else None


_SS_PID = re.compile(r"pid=(\d+)")


def parse_ss_pids(text: str) -> int | None:
    """Lowest pid in `ss -ltnpH` output (``users:(("python3",pid=123,fd=3))``), or None."""
    pids = [int(m) for m in _SS_PID.findall(text)]
    return min(pids) if pids else None


# ---- parsing shared by both transports ----------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat we use."""

    state: str
    pgid: int
    start_ticks: int


def parse_proc_stat(text: str) -> ProcStat:
    """Parse /proc/PID/stat; the command name may hold spaces and parentheses, so split after the last ')'."""
    rest = text[text.rindex(")") + 1 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return ProcStat(state=rest[0], pgid=int(rest[2]), start_ticks=int(rest[19]))


def is_dead_state(state: str) -> bool:
    """Zombie (Z) and dead (X/x) processes count as gone."""
    return state in {"Z", "X", "x"}


def parse_cmdline(data: bytes) -> tuple[str, ...]:
    """NUL-separated /proc/PID/cmdline to argv; empty for kernel threads and zombies."""
    if not data:
        return ()
    if data.endswith(b"\0"):
        data = data[:-1]
    return tuple(part.decode("utf-8", "replace") for part in data.split(b"\0"))


def parse_btime(proc_stat: str) -> int:
    """Boot time (unix seconds) from the `btime` line of /proc/stat."""
    for line in proc_stat.splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    raise ValueError("no btime line in /proc/stat")


def decode_complete_utf8(data: bytes, max_bytes: int) -> tuple[str, int]:
    """Decode what is complete; returns the text and how many bytes it used (a cut character waits).

    With ``max_bytes`` under 4 a cut character could never fit, so it is replaced instead of waiting.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(data, final=False)
    pending = len(decoder.getstate()[0])
    if pending and max_bytes < 4:
        return text + decoder.decode(b"", final=True), len(data)
    return text, len(data) - pending


def decode(data: bytes) -> str:
    """Command output as text; bad bytes become U+FFFD instead of an exception."""
    return data.decode("utf-8", "replace")


def shell_returncode(code: int | None) -> int:
    """Death by signal N reads as 128+N, as a shell (and so an SSH host) reports it; unknown is -1."""
    if code is None:
        return -1
    return 128 - code if code < 0 else code


def describe_argv(argv: Sequence[str], limit: int = 120) -> str:
    """A short, readable rendering of a command for error messages (values of secret-looking flags hidden)."""
    from workers.engines.sglang import redact_argv  # the one definition of a secret flag

    shown = redact_argv(argv)
    text = shlex.join(shown)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def failure_message(host_label: str, result: CommandResult) -> str:
    """`check=True` failure text: the command, its status and the end of its stderr."""
    detail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-5:]
    tail = ("\n" + "\n".join(detail)) if detail else ""
    return f"{host_label}: `{describe_argv(result.argv)}` exited with status {result.returncode}{tail}"


def timeout_message(host_label: str, argv: Sequence[str], timeout: float) -> str:
    """What a user sees when a command ran past its deadline."""
    return f"{host_label}: `{describe_argv(argv)}` did not finish within {timeout:g}s and was stopped"
