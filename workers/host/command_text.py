"""How a host command reads in error messages, the same for both transports.

A command's argv is shown shortened and with the values of every engine's secret-looking flags hidden, so
a failure or timeout message can go to a user (and a log) without leaking an API key.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from workers.engines.registry import redact_engine_argv

if TYPE_CHECKING:
    from workers.host.transport import CommandResult


def describe_argv(argv: Sequence[str], limit: int = 120) -> str:
    """A short, readable rendering of a command for error messages (values of secret-looking flags hidden)."""
    shown = redact_engine_argv(argv)  # every engine's secret flags
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
