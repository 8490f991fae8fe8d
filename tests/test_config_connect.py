"""`benchbot config check --connect` reaches each host over its real transport (issue 16.4).

Real SSH servers (asyncssh's, and OpenSSH when it can run here) on 127.0.0.1: one host that works (the
simulated engine over SSH), one whose host key is unknown, one whose key file is missing, one local host
whose engine is not installed. The command says which hosts are simulated and what failed on each.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sshd import SshTestServer, asyncssh_server, openssh_server, openssh_unavailable_reason

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["asyncssh", "openssh"])
def ssh_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SshTestServer]:
    if request.param == "openssh":
        reason = openssh_unavailable_reason()
        if reason:
            pytest.skip(reason)
        serve = openssh_server
    else:
        serve = asyncssh_server
    (tmp_path / "ssh").mkdir()
    with serve(tmp_path / "ssh") as server:
        yield server


def _ssh_host(
    name: str, srv: SshTestServer, *, key: str | None = None, known_hosts: str | None = None, port: int = 30000
) -> str:
    """One SSH host on the test server; each its own engine port (one machine: config check refuses a shared one)."""
    return (
        f'[hosts.{name}]\ntransport = "ssh"\nssh_target = "{srv.host}"\nssh_port = {srv.port}\nport = {port}\n'
        f'ssh_user = "{srv.username}"\nssh_key = "{key or srv.client_key_path}"\n'
        f'ssh_known_hosts = "{known_hosts or srv.known_hosts_path}"\n'
    )


def _config(srv: SshTestServer, tmp_path: Path) -> Path:
    empty_known_hosts = tmp_path / "empty_known_hosts"
    empty_known_hosts.write_text("")
    text = (
        'default_host = "good"\n[engine]\ncommand = ["/nonexistent/python3", "-m", "sglang.launch_server"]\n'
        'model = "nvidia/Qwen3.5-397B-A17B-NVFP4"\n\n'
        + _ssh_host("good", srv)
        + 'nvidia_smi = ["{python}", "-m", "workers.sim.nvidia_smi"]\n'
        + '[hosts.good.engine]\ncommand = ["{python}", "-m", "workers.sim.sglang"]\n\n'
        + _ssh_host("stranger", srv, known_hosts=str(empty_known_hosts), port=30001)
        + "\n"
        + _ssh_host("nokey", srv, key=str(tmp_path / "no_such_key"), port=30002)
        + '\n[hosts.real]\ntransport = "local"\nport = 30003\nnvidia_smi = ["/nonexistent/nvidia-smi"]\n'
    )
    path = tmp_path / "benchbot.toml"
    path.write_text(text)
    return path


def _check(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BENCHBOT_CONFIG", "SSH_AUTH_SOCK")}
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", "--config", str(config), "config", "check", *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _blocks(stdout: str) -> dict[str, list[str]]:
    """``--connect``'s report: host name -> its lines (the first says ok/FAILED)."""
    report = stdout.split("connect:\n", 1)[1]
    blocks: dict[str, list[str]] = {}
    current: list[str] = []
    for line in report.splitlines():
        if line.startswith("  host "):
            name, rest = line[len("  host ") :].split(": ", 1)
            current = blocks.setdefault(name, [rest])
        elif line.startswith("    "):
            current.append(line.strip())
    return blocks


def test_connect_reaches_each_host_and_says_what_failed(ssh_server: SshTestServer, tmp_path: Path) -> None:
    config = _config(ssh_server, tmp_path)
    done = _check(config, "--connect")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    blocks = _blocks(done.stdout)
    assert set(blocks) == {"good", "stranger", "nokey", "real"}

    good = blocks["good"]
    assert good[0] == "ok (simulated)", good
    assert any(line.startswith(f"reached over ssh ({ssh_server.username}@127.0.0.1:") for line in good), good
    assert any(line.startswith("engine sglang 0.5.") for line in good), good
    assert "8 GPUs (the simulator's nvidia-smi)" in good

    stranger = " ".join(blocks["stranger"])
    assert blocks["stranger"][0] == "FAILED" and "host key" in stranger and "empty_known_hosts" in stranger

    nokey = " ".join(blocks["nokey"])
    assert blocks["nokey"][0] == "FAILED" and "no_such_key does not exist" in nokey

    real = " ".join(blocks["real"])
    assert blocks["real"][0] == "FAILED" and "simulated" not in blocks["real"][0]
    assert "`/nonexistent/python3 -m sglang.launch_server` does not run here" in real
    assert "/nonexistent/nvidia-smi -L` exited 127" in real
    assert done.stdout.rstrip().endswith("1 of 4 hosts ready, 3 failed")


def test_plain_check_marks_simulated_hosts_and_connects_nowhere(tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        (tmp_path / "ssh").mkdir()
        srv = stack.enter_context(asyncssh_server(tmp_path / "ssh"))
        done = _check(_config(srv, tmp_path))
    assert done.returncode == 0, done.stderr
    assert "connect:" not in done.stdout
    assert "  host good: simulated, ssh (127.0.0.1)" in done.stdout
    assert "  host real: local (this machine)" in done.stdout
