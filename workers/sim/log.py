"""SGLang-style log lines, flushed at once (the bot tails a redirected stdout while we run)."""

from __future__ import annotations

import sys
import time


def stamp(t: float | None = None) -> str:
    """``[2026-12-02 10:00:00]`` in local time, like SGLang's ``[%(asctime)s]`` format."""
    return time.strftime("[%Y-%m-%d %H:%M:%S]", time.localtime(time.time() if t is None else t))


def info(msg: str, rank: str | None = None, stream: str = "stdout") -> None:
    """One stamped log line (stdout unless ``stream="stderr"``); ``rank`` adds SGLang's ``TP0`` tag."""
    prefix = stamp() if rank is None else stamp()[:-1] + f" {rank}]"
    out = sys.stderr if stream == "stderr" else sys.stdout
    out.write(f"{prefix} {msg}\n")
    out.flush()


def warning(msg: str, rank: str | None = None) -> None:
    info(f"WARNING: {msg}" if not msg.startswith("WARNING") else msg, rank)


def raw(text: str, stream: str = "stdout") -> None:
    """Unstamped text (uvicorn lines, tracebacks); tracebacks go to stderr like Python's."""
    out = sys.stderr if stream == "stderr" else sys.stdout
    out.write(text if text.endswith("\n") else text + "\n")
    out.flush()
