"""``/status`` says what it could not see (the long soak's two "nothing on port" answers, issue 39).

An engine still loading listens on nothing; only the host's process table shows it. So a process table the
observer could not read (a scan that timed out on a loaded host, a fork that failed) must not read as
"nothing on port N": the answer says the table was unread. And while a job that replaces the engine holds
the host, "nothing on port" can be the moment between the old engine and the new one: the answer says so.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.render import HostStatus, status_text
from tests.util import free_port
from workers.host.local import LocalTransport
from workers.jobs.queue import JobInfo
from workers.observation import UNREAD_TABLE, ObservedState, RunningConfig, observe


@pytest.fixture
def loading_engine(tmp_path: Path) -> Iterator[tuple[list[str], int, int]]:
    """A real process bound for a free port that never listens (an engine loading its weights): the
    host's configured engine command, its port, its pid."""
    script = tmp_path / "sglang_loading.py"  # "sglang" in its argv: the scan sends its command line back
    script.write_text("import time\ntime.sleep(60)\n")
    port = free_port()
    command = [sys.executable, str(script)]
    proc = subprocess.Popen([*command, "--port", str(port)])  # returns once it exec'd
    try:
        yield command, port, proc.pid
    finally:
        proc.kill()
        proc.wait()


def _observe(command: list[str], port: int, timeout_s: float) -> RunningConfig:
    return asyncio.run(
        observe(
            LocalTransport(),
            host_name="gpu-1",
            port=port,
            nvidia_smi=(),
            engine_commands=[command],
            timeout_s=timeout_s,
            report_timeout_s=1.0,
        )
    )


def test_an_unread_process_table_is_never_read_as_nothing_on_the_port(
    loading_engine: tuple[list[str], int, int],
) -> None:
    command, port, pid = loading_engine
    seen = _observe(command, port, timeout_s=10)
    assert seen.state == ObservedState.LOADING and seen.process is not None and seen.process.pid == pid
    assert UNREAD_TABLE not in seen.extra

    # The same host, the same loading engine, but the scan cannot finish in time (no Python starts in 1 ms).
    blind = _observe(command, port, timeout_s=0.001)
    assert blind.state == ObservedState.NONE and blind.process is None
    assert blind.extra[UNREAD_TABLE]
    text = status_text([HostStatus(host="gpu-1", port=port, fresh=blind)])
    assert f"nothing on port {port}" not in text
    assert "process table could not be read" in text and "an engine still loading would not show" in text
    assert RunningConfig.from_dict(blind.to_dict()).extra[UNREAD_TABLE] == blind.extra[UNREAD_TABLE]


def _job(kind: str) -> JobInfo:
    return JobInfo("834", 834, "gpu-1", "alice", "C1", kind, f"{kind} cutlass cudnn", time.time(), "running")


@pytest.mark.parametrize(("kind", "between"), [("launch", True), ("sweep", True), ("bench", False)])
def test_nothing_on_the_port_while_a_launch_holds_the_host_says_it_is_between_engines(kind: str, between: bool) -> None:
    empty = RunningConfig(host="gpu-1", port=30000, observed_at=time.time(), state=ObservedState.NONE)
    text = status_text([HostStatus(host="gpu-1", port=30000, fresh=empty, running_job=_job(kind))])
    assert "nothing on port 30000" in text and f"running job: #834 {kind} cutlass cudnn (@alice)" in text
    assert ("the port is empty between one and the next" in text) is between
