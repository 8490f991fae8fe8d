"""``/status`` says what it could not see (the long soak's two "nothing on port" answers, issue 39).

An engine still loading listens on nothing; only the host's process table shows it. So a process table the
observer could not read (a scan that timed out on a loaded host, a fork that failed) must not read as
"nothing on port N": the answer says the table was unread. And while a job that replaces the engine holds
the host, "nothing on port" can be the moment between the old engine and the new one: the answer says so.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bot.dispatch import Dispatcher
from bot.render import HostStatus, status_text
from tests.util import free_port, wait_until
from workers import keys, observer
from workers.config import load_config
from workers.errors import BenchbotError
from workers.host.local import LocalTransport
from workers.jobs import port_owner
from workers.jobs.context import JobContext
from workers.jobs.queue import JobInfo
from workers.observation import UNREAD_TABLE, ObservedState, RunningConfig
from workers.observe_port import observe


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


def test_a_launch_or_stop_never_takes_an_unread_process_table_for_a_free_port(
    redis_client: redis.Redis, tmp_path: Path, loading_engine: tuple[list[str], int, int]
) -> None:
    """The host's ``json`` is broken (a real scan that fails: ``PYTHONPATH`` puts a ``json`` that raises first;
    the listener read needs only ``os``), so the scan cannot read the table: ``free_port`` refuses, touching
    nothing, rather than answer "the port was free" and let a launch start a second engine over one loading."""
    command, port, pid = loading_engine
    config = load_config(_config_file(tmp_path, command, port))
    ctx = JobContext(redis_client=redis_client, job_id="7", host="box", user="alice", lease_ttl_s=5.0)
    broken = tmp_path / "broken" / "json"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('this host has a broken json')\n")
    blind = LocalTransport("box", env={"PYTHONPATH": str(broken.parent)})
    with pytest.raises(BenchbotError, match="process table could not be read") as refused:
        asyncio.run(port_owner.free_port(ctx, redis_client, config.host("box"), blind))
    assert "touches nothing" in str(refused.value)
    assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # the loading engine was not touched
    with pytest.raises(BenchbotError, match="an engine is loading"):  # a table that was read finds it
        asyncio.run(port_owner.free_port(ctx, redis_client, config.host("box"), LocalTransport("box")))


def _config_file(tmp_path: Path, command: list[str], port: int) -> Path:
    path = tmp_path / "benchbot.toml"
    words = ", ".join(f'"{w}"' for w in command)
    path.write_text(
        f"""
default_host = "box"
[engine]
command = [{words}]
model = "nvidia/Qwen3.5-397B-A17B-NVFP4"
[hosts.box]
transport = "local"
port = {port}
log_dir = "{tmp_path / "logs"}"
nvidia_smi = []
"""
    )
    return path


def test_a_bench_asked_while_the_table_is_unread_does_not_expect_nothing_running(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """Through a real observer: the host's scan fails (its ``json`` is broken, as above) and nothing listens, so
    what runs is unknown, not "nothing" (a bench expecting nothing would refuse the engine still loading)."""
    broken = tmp_path / "broken" / "json"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('this host has a broken json')\n")
    path = _config_file(tmp_path, [sys.executable, "-m", "workers.sim.sglang"], free_port())
    path.write_text(path.read_text() + f'env = {{ PYTHONPATH = "{broken.parent}" }}\n')
    config = load_config(path)
    service = observer.ObserverService(config, redis_url, ["box"]).start()
    try:
        wait_until(lambda: redis_client.exists(keys.observer_alive("box")), timeout=30, what="the observer")
        expected = Dispatcher(config, redis_client, observe_timeout_s=20)._expected_config("alice", "box")
    finally:
        service.stop()
    assert not expected.nothing_running
    assert expected.unknown is not None and "process table could not be read" in expected.unknown
