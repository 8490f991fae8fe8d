"""Reading back the settings an engine took from a file only (its folder's ``settings_file``), for the observation.

Such settings (TensorRT-LLM's MoE backend, speculative config, KV fraction, in its ``--config`` YAML) are
reported by no endpoint, so without this step two servers differing only there would fingerprint alike and
a ``/bench`` meant for one would measure the other. benchbot keeps the file it wrote for the server's
lifetime (:mod:`workers.host.engine_env`), and here reads the file the running process's argv names:

- only benchbot's own file for that port, at its exact path in the host's log_dir
  (:func:`workers.host.transport.settings_file_path`): a file someone else's server names (or one of the same
  name elsewhere) is never read, so an observation never copies a stranger's file into ``/status``;
- through the transport's bounded read (``head -c`` with the path as a quoted argument over SSH), never run;
- parsed by the engine's ``read`` (the format benchbot writes: JSON, which YAML reads too).

What cannot be read is said so: the observed args get :data:`SETTINGS_UNREAD_ARG` (why), which keeps the
server's fingerprint apart from a server launched without settings, and the observation's detail names it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from workers.engines.args import ArgValues
from workers.engines.interface import SETTINGS_UNREAD_ARG, SettingsFile
from workers.errors import BenchbotError
from workers.host.transport import settings_file_path
from workers.json_value import JsonObject

#: The most a settings file may hold: benchbot writes a few hundred bytes; more is not benchbot's file.
MAX_SETTINGS_BYTES = 64 * 1024


class _Reader(Protocol):
    async def read_file(self, path: str, max_bytes: int = ...) -> str | None: ...


@dataclass(frozen=True)
class SettingsReadBack:
    """What the settings file of a running server said: its settings (in the observation's arg names), or why
    it could not be read (``unread``); ``path`` None when the process names no settings file."""

    path: str | None = None
    settings: JsonObject = field(default_factory=dict)
    unread: str = ""

    def fold(self, args: ArgValues) -> JsonObject:
        """The observed args with the file's settings over them (the engine applies the file over its command
        line), or with :data:`SETTINGS_UNREAD_ARG` when the file could not be read."""
        if self.unread:
            return {**args, SETTINGS_UNREAD_ARG: self.unread}
        return {**args, **self.settings}

    @property
    def detail(self) -> str:
        """A sentence for the observation's detail when the file could not be read, else ''."""
        if not self.unread:
            return ""
        return (
            f"its settings file {self.path} could not be read back ({self.unread}): the settings in it are not verified"
        )


def settings_path(argv: Sequence[str], path_flags: Sequence[str]) -> str | None:
    """The file argv names with one of ``path_flags`` (``--config PATH`` or ``--config=PATH``; the last wins)."""
    found: str | None = None
    items = list(argv)
    for i, token in enumerate(items):
        for flag in path_flags:
            if token == flag and i + 1 < len(items):
                found = items[i + 1]
            elif token.startswith(flag + "="):
                found = token.split("=", 1)[1]
    return found


async def read_back(
    transport: _Reader, spec: SettingsFile, argv: Sequence[str], port: int, directory: str
) -> SettingsReadBack:
    """The settings the process with ``argv`` (the engine on ``port``) was started with, read from its file if
    that is benchbot's own in ``directory`` (the host's log_dir)."""
    path = settings_path(argv, spec.path_flags)
    if path is None:
        return SettingsReadBack()
    if os.path.normpath(path) != os.path.normpath(settings_file_path(directory, port)):
        return SettingsReadBack(path, unread="not benchbot's settings file, so not read")
    try:
        text = await transport.read_file(path, MAX_SETTINGS_BYTES + 1)
    except BenchbotError:
        return SettingsReadBack(path, unread="unreadable")
    if text is None:
        return SettingsReadBack(path, unread="gone")
    if len(text.encode()) > MAX_SETTINGS_BYTES:
        return SettingsReadBack(path, unread="larger than benchbot writes")
    try:
        settings = spec.read(text)
    except ValueError:
        return SettingsReadBack(path, unread="not in the format benchbot writes")
    return SettingsReadBack(path, settings=dict(settings))
