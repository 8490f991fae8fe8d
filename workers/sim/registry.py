"""Where running sim servers announce themselves so the ``nvidia-smi`` stand-in can show their memory.

One JSON file per server (``<pid>.json``) in the state dir: ``BENCHBOT_SIM_STATE_DIR``, else
``/tmp/benchbot-sim-<uid>``. Files are written atomically (write + rename); readers ignore entries
whose pid is dead, so a crashed server never leaves phantom memory behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path


def state_dir(explicit: str | None = None) -> Path:
    """The registry directory (created on demand)."""
    raw = explicit or os.environ.get("BENCHBOT_SIM_STATE_DIR") or f"/tmp/benchbot-sim-{os.getuid()}"
    path = Path(raw)
    path.mkdir(parents=True, exist_ok=True)
    return path


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def register(directory: Path, entry: dict) -> Path:
    """Write (or overwrite) this process's entry atomically."""
    path = directory / f"{entry['pid']}.json"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(entry, fh)
    os.replace(tmp, path)
    return path


def unregister(directory: Path, pid: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        (directory / f"{pid}.json").unlink()


def live_entries(directory: Path | None = None) -> list[dict]:
    """Entries of servers whose process is still alive, oldest first."""
    directory = directory or state_dir()
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
            pid = int(entry["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid_alive(pid):
            out.append(entry)
    out.sort(key=lambda e: e.get("started", 0))
    return out


def used_mib_by_gpu(entries: list[dict], exclude_pid: int | None = None) -> dict[int, int]:
    """Memory (MiB) each GPU index has in use by the given servers."""
    used: dict[int, int] = {}
    for e in entries:
        if exclude_pid is not None and int(e["pid"]) == exclude_pid:
            continue
        for gpu in e.get("gpus", []):
            used[int(gpu)] = used.get(int(gpu), 0) + int(e.get("mem_mib", 0))
    return used
