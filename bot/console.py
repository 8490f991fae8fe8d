"""The interactive local front end: type commands as you would in Slack, see replies and job events."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any, TextIO

import redis

from bot.dispatch import Dispatcher
from bot.follow import follow_job
from workers.config import Config


def run_console(
    config: Config,
    r: redis.Redis,
    *,
    user: str,
    channel: str,
    out_dir: Path,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
) -> int:
    """Read commands until EOF or ``quit``; each queued job's events print as they come."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    lock = threading.Lock()

    def emit(text: str) -> None:
        with lock:
            print(text, file=stdout, flush=True)

    dispatcher = Dispatcher(config, r, plots_dir=out_dir)
    followers: list[threading.Thread] = []
    emit(
        f"benchbot console as @{user} in #{channel} (config: {config.source}). /help lists commands; "
        "quit or Ctrl-D leaves."
    )
    for raw in stdin:
        line = raw.strip()
        if not line:
            continue
        if line in ("quit", "exit", "/quit"):
            break
        reply = dispatcher.handle(user, channel, line)
        emit(reply.text)
        for path in reply.files:
            emit(f"  plot: {path}")
        if reply.job_id:
            job_client: Any = redis.Redis(connection_pool=r.connection_pool)
            thread = threading.Thread(
                target=follow_job,
                args=(job_client, reply.job_id),
                kwargs={"as_json": False, "out_dir": out_dir, "emit": emit},
                daemon=True,
            )
            thread.start()
            followers.append(thread)
    for thread in followers:
        thread.join(timeout=0.1)
    return 0
