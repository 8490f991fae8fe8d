"""Real SSH servers on 127.0.0.1 for tests: asyncssh's own server (always) and Debian's OpenSSH sshd.

Both come as context managers yielding an object that knows its port, its throwaway client key and a
known_hosts file that trusts exactly its host key, and can build an ``SshTransport`` or a
HostConfig-like object for it. Nothing here reads or writes ``~/.ssh``.

The asyncssh server runs each command as ``/bin/sh -c COMMAND`` in a real subprocess, the way sshd
runs it through the login shell, and, like OpenSSH without a PTY, it keeps the session open until
the command's stdout and stderr are closed and never kills a command when the client goes away.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

from bench.ssh_server import AsyncsshServer, SshTestServer, asyncssh_server
from tests.util import free_port, wait_until

SSHD = os.environ.get("BENCHBOT_TEST_SSHD", "/usr/sbin/sshd")  # another path: a test of the skip line


# ---- OpenSSH sshd ---------------------------------------------------------------------------------------


def openssh_unavailable_reason() -> str | None:
    """Why the OpenSSH server cannot run here, or None when it can."""
    if not os.path.exists(SSHD):
        return f"{SSHD} is not installed (apt-get install openssh-server)"
    if os.geteuid() != 0:
        return "running sshd for tests needs root here (privilege separation)"
    return None


class OpensshServer(SshTestServer):
    """Debian's sshd in the foreground (`-D -e`) with its own config, host key and authorized_keys."""

    kind = "openssh"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.config_path = directory / "sshd_config"
        self.log_path = directory / "sshd.log"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        self.port = free_port()
        self.config_path.write_text(
            f"Port {self.port}\n"
            f"ListenAddress {self.host}\n"
            f"HostKey {self.host_key_path}\n"
            f"PidFile {self.directory / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.authorized_keys_path}\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "UseDNS no\n"
            # bash sources ~/.bashrc for ssh commands only at SHLVL < 2; skipping it here keeps a slow
            # developer .bashrc (pyenv init: ~150 ms) out of every test command.
            "SetEnv SHLVL=1\n"
            "LogLevel ERROR\n"
        )
        self.write_known_hosts()
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.config_path)], stdout=log, stderr=subprocess.STDOUT
            )
        process = self._process
        wait_until(
            lambda: process.poll() is not None or _accepts(self.host, self.port), timeout=10, what="sshd to listen"
        )
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited with {process.returncode}: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


@contextlib.contextmanager
def openssh_server(directory: Path) -> Iterator[OpensshServer]:
    """OpenSSH sshd on 127.0.0.1 (see ``openssh_unavailable_reason`` first)."""
    server = OpensshServer(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _accepts(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


__all__ = [
    "AsyncsshServer",
    "OpensshServer",
    "SshTestServer",
    "asyncssh_server",
    "openssh_server",
    "openssh_unavailable_reason",
]
