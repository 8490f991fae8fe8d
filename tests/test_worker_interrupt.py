"""Ctrl-C on `benchbot worker` ends it quietly: no traceback from the worker or its observer (issue 16.8)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import redis

from tests.util import wait_until

ROOT = Path(__file__).resolve().parents[1]


def test_ctrl_c_stops_worker_and_observer_without_a_traceback(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "BENCHBOT_CONFIG"}
    env.update(REDIS_URL=redis_url, BENCHBOT_STATE_DIR=str(tmp_path / "state"), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "worker", "--host", "sim"],
        cwd=tmp_path,  # no ./benchbot.toml here: the embedded simulated host
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_until(lambda: redis_client.exists("benchbot:observer:sim:alive"), timeout=30, what="the observer")
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired as exc:  # say how far the shutdown got (its log lines), not just that it hung
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=10)
            tail = err[-3000:]
            raise AssertionError(f"the worker did not exit within 30 s of Ctrl-C; its log ends:\n{tail}") from exc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Traceback" not in err, err
    assert "KeyboardInterrupt" not in err + out
    assert proc.returncode in (0, 130), (proc.returncode, err)
    assert "observer stopped; the worker exits" in err, err[-3000:]
