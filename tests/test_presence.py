"""Who serves a host, said at once: no worker, or a worker that cannot reach its host (issue 16.2, 16.3).

Real Redis, a real `benchbot worker` process and a real SSH server (asyncssh's) whose host key the
worker does not know: the worker runs, but every job would fail to reach the host.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bot.dispatch import Dispatcher
from tests.sshd import asyncssh_server
from tests.util import free_port, wait_until
from workers.config import load_config
from workers.jobs import presence

ROOT = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path, ssh_port: int, username: str, key: Path) -> Path:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    path = tmp_path / "benchbot.toml"
    path.write_text(
        f"""
default_host = "far"
[engine]
command = ["{{python}}", "-m", "workers.sim.sglang"]
model = "nvidia/Qwen3.5-397B-A17B-NVFP4"
[hosts.far]
transport = "ssh"
ssh_target = "127.0.0.1"
ssh_port = {ssh_port}
ssh_user = "{username}"
ssh_key = "{key}"
ssh_known_hosts = "{empty}"
nvidia_smi = ["{{python}}", "-m", "workers.sim.nvidia_smi"]
[hosts.near]
transport = "local"
port = {free_port()}
log_dir = "{tmp_path / "logs"}"
nvidia_smi = ["{{python}}", "-m", "workers.sim.nvidia_smi"]
"""
    )
    return path


@pytest.fixture
def start_worker(redis_url: str, tmp_path: Path) -> Iterator:
    procs: list[subprocess.Popen[str]] = []

    def start(config: Path, host: str) -> subprocess.Popen[str]:
        env = {**os.environ, "REDIS_URL": redis_url, "BENCHBOT_CONFIG": str(config), "PYTHONPATH": str(ROOT)}
        env["BENCHBOT_STATE_DIR"] = str(tmp_path / "state")
        proc = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "worker", "--host", host],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_no_worker_is_said_at_enqueue_in_queue_and_status(redis_client: redis.Redis, tmp_path: Path) -> None:
    config = load_config(str(_config(tmp_path, free_port(), "nobody", tmp_path / "key")))
    dispatcher = Dispatcher(config, redis_client, plots_dir=tmp_path)
    queued = dispatcher.handle("alice", "console", "/stop on near")
    assert queued.ok and queued.data["service"]["served"] is False
    hint = "no worker is serving near: its jobs wait until one starts (`benchbot worker --host near`)"
    assert queued.text.splitlines()[1] == hint
    listing = dispatcher.handle("alice", "console", "/queue near").text
    assert listing.splitlines()[0] == f"near: {hint}"
    assert hint in dispatcher.handle("alice", "console", "/status near").text


def test_worker_that_cannot_reach_its_host_says_what_failed(
    redis_client: redis.Redis, tmp_path: Path, start_worker
) -> None:
    (tmp_path / "ssh").mkdir()
    with asyncssh_server(tmp_path / "ssh") as srv:
        config_path = _config(tmp_path, srv.port, srv.username, srv.client_key_path)
        config = load_config(str(config_path))
        start_worker(config_path, "far")
        service = wait_until(
            lambda: (s := presence.host_service(redis_client, "far")).connect_error and s,
            timeout=60,
            what="the worker to record why it cannot reach far",
        )
        assert service.served and "host key" in service.connect_error and "empty_known_hosts" in service.connect_error

        dispatcher = Dispatcher(config, redis_client, plots_dir=tmp_path, observe_timeout_s=15)
        status = dispatcher.handle("alice", "console", "/status far").text
        assert "the worker serving far cannot reach it" in status and "host key" in status
        assert "no worker is serving" not in status
        queued = dispatcher.handle("alice", "console", "/stop on far")
        assert "the worker serving far cannot reach it" in queued.text.splitlines()[1]
        assert "cannot reach it" in dispatcher.handle("alice", "console", "/queue far").text


def test_a_worker_that_reaches_its_host_adds_nothing(redis_client: redis.Redis, tmp_path: Path, start_worker) -> None:
    config_path = _config(tmp_path, free_port(), "nobody", tmp_path / "key")
    start_worker(config_path, "near")
    wait_until(lambda: presence.host_service(redis_client, "near").served, timeout=60, what="the worker")
    assert presence.host_service(redis_client, "near").connect_error is None
    dispatcher = Dispatcher(load_config(str(config_path)), redis_client, plots_dir=tmp_path)
    queued = dispatcher.handle("alice", "console", "/queue near")
    assert queued.text == "near: idle, nothing queued"


def test_text_status_shows_gpu_memory_held_when_nothing_owns_the_port(tmp_path: Path) -> None:
    """An engine on another port holds the GPUs: the text /status of this port says how much and by whom."""
    import asyncio

    from bot.render import HostStatus, status_text
    from workers.host.local import LocalTransport
    from workers.observe_port import observe
    from workers.sim.launcher import start_sim

    state = tmp_path / "sim"
    with start_sim(free_port(), env={"BENCHBOT_SIM_STATE_DIR": str(state)}):
        smi = [sys.executable, "-m", "workers.sim.nvidia_smi", f"--sim-state-dir={state}"]
        port = free_port()
        seen = asyncio.run(
            observe(LocalTransport(name="h"), host_name="h", port=port, nvidia_smi=smi, engine_commands=[])
        )
    text = status_text([HostStatus(host="h", port=port, fresh=seen)])
    lines = text.splitlines()
    assert lines[1] == f"  nothing on port {port}"
    assert lines[2].startswith("  GPU memory still held by other processes: ") and "GiB (pids " in lines[2]
    assert lines[3].startswith("  GPUs: 8 x ") and not lines[3].endswith("memory 0/765 GiB")
