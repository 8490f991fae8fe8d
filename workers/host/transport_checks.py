"""What both transports check before anything reaches a host: argv, environment, process groups, signals.

User text never reaches a shell: a command is an argv list whose items cross ``exec()`` and the
``env``/``timeout`` wrappers unchanged, environment names are identifiers, and a process group of 0 or 1
(every process we may signal) is refused. Shared by :mod:`workers.host.local` and :mod:`workers.host.ssh`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from workers.errors import TransportError

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
