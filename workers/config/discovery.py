"""Where the config comes from: ``--config``, ``BENCHBOT_CONFIG``, ``./benchbot.toml``, else the embedded default
on this user's own ports (30000 on a shared box is someone else's SGLang).
"""

from __future__ import annotations

import os
from pathlib import Path

from workers.errors import ConfigError
from workers.ports import free_local_port


def find_config_path(cli_path: str | None = None) -> Path | None:
    """``--config``, then ``BENCHBOT_CONFIG``, then ``./benchbot.toml``; None means the embedded default."""
    for candidate in (cli_path, os.environ.get("BENCHBOT_CONFIG")):
        if candidate:
            path = Path(candidate).expanduser()
            if not path.is_file():
                raise ConfigError(f"config file {path} does not exist")
            return path
    local = Path("benchbot.toml")
    return local if local.is_file() else None


EMBEDDED_PORT_FILE = "sim-port"
#: The embedded vLLM host's port, kept beside the SGLang host's.
EMBEDDED_VLLM_PORT_FILE = "sim-vllm-port"


def embedded_port(directory: Path, name: str = EMBEDDED_PORT_FILE) -> int:
    """This user's port for the embedded simulated host: picked free once, then kept in the state dir.

    30000 on a shared box is someone's SGLang; a port picked per process would differ between the bot and
    its workers, and after a restart a worker would look for its engine on another port. So the first
    process picks a free one and every later one (of this user, same state dir) reads it back.
    """
    path = directory / name
    for _ in range(3):
        try:
            port = int(path.read_text().strip())
            if 1024 <= port <= 65535:
                return port
        except (OSError, ValueError):
            pass
        port = free_local_port()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue  # another process picked first (or the file is bad: read it again, then replace)
        with os.fdopen(fd, "w") as stream:
            stream.write(f"{port}\n")
        return port
    path.unlink(missing_ok=True)
    return embedded_port(directory, name)
