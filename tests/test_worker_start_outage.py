"""A worker started while Redis is away (restarting, failing over) waits for it instead of dying with a traceback.

RQ's ``Worker`` talks to Redis as it is built (``CLIENT SETNAME``). The soak met it: a worker restarted after a
SIGKILL just as Redis was SIGKILLed too exited at once, and the run went on with one worker fewer. A real
``run_worker`` process here starts with no server on its socket; once the server starts it registers with RQ
and serves, and its log says once that Redis was away and once that it came back, with no traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from rq import Worker

from tests.util import wait_until
from workers import redis_conn

ROOT = Path(__file__).resolve().parent.parent


def test_a_worker_started_while_redis_is_down_waits_for_it_and_serves(tmp_path: Path) -> None:
    directory = tmp_path / "redis"
    url = f"unix://{directory / redis_conn.SOCKET_NAME}"
    log = tmp_path / "worker.log"
    code = (
        "from workers.jobs.worker import run_worker; "
        "run_worker(__import__('os').environ['REDIS_URL'], ['h1'], name='early', logging_level='WARNING')"
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "REDIS_URL": url},
        )
    try:
        wait_until(lambda: "is unreachable" in log.read_text(), timeout=30, what="the worker to find Redis away")
        assert proc.poll() is None, log.read_text()
        sock = redis_conn.start_redis_server(directory)
        r = redis_conn.connect(f"unix://{sock}")
        wait_until(
            lambda: any(w.name == "early" for w in Worker.all(connection=r)), timeout=30, what="the worker to register"
        )
        text = log.read_text()
        assert "Traceback" not in text, text[-3000:]
        assert text.count("worker early: Redis is unreachable") == 1 and "worker early: Redis is back" in text
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        redis_conn.stop_redis_server(directory)
