"""A real SSH server on 127.0.0.1 for the soak and the tests: asyncssh's own server, no sshd needed.

The soak (``bench/soak.py``, its slow link) and the tests (``tests/sshd.py``, which adds Debian's OpenSSH
beside it) reach simulated hosts over real SSH through it. It knows its port, its throwaway client key and a
known_hosts file that trusts exactly its host key, and can build an ``SshTransport`` or a HostConfig-like
object for it. Nothing here reads or writes ``~/.ssh``.

Each command runs as ``/bin/sh -c COMMAND`` in a real subprocess, the way sshd runs it through the login
shell, and, like OpenSSH without a PTY, the session stays open until the command's stdout and stderr are
closed and a command is never killed when the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from workers.host.asyncssh_quiet import asyncssh
from workers.host.ssh import SshTransport


class SshTestServer:
    """What a client needs to reach one test server."""

    kind = "ssh"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.host = "127.0.0.1"
        self.port = 0
        self.username = getpass.getuser()
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        client_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key_path = directory / "client_key"
        self.authorized_keys_path = directory / "authorized_keys"
        self.known_hosts_path = directory / "known_hosts"
        self.host_key_path = directory / "host_key"
        client_key.write_private_key(str(self.client_key_path))
        self.authorized_keys_path.write_bytes(client_key.export_public_key())
        self.host_key.write_private_key(str(self.host_key_path))
        for path in (self.client_key_path, self.host_key_path):
            path.chmod(0o600)  # sshd and ssh refuse keys others can read

    def write_known_hosts(self) -> None:
        """Trust exactly this server's host key, in the `[host]:port` form a non-22 port needs."""
        line = f"[{self.host}]:{self.port} ".encode() + self.host_key.export_public_key()
        self.known_hosts_path.write_bytes(line)

    def transport(self, **overrides: Any) -> SshTransport:
        """A transport for this server, isolated from the user's SSH config and agent."""
        options: dict[str, Any] = {
            "username": self.username,
            "key_path": str(self.client_key_path),
            "known_hosts": str(self.known_hosts_path),
            "use_ssh_config": False,
            "agent": False,
            "connect_timeout": 10.0,
            "name": f"test-{self.kind}",
        }
        options.update(overrides)
        return SshTransport(self.host, self.port, **options)

    def host_config(self, name: str = "sshhost", **overrides: Any) -> SimpleNamespace:
        """An object with the attribute names of ``workers.config.HostConfig`` for an SSH host."""
        fields: dict[str, Any] = {
            "name": name,
            "transport": "ssh",
            "ssh_target": self.host,
            "ssh_port": self.port,
            "ssh_user": self.username,
            "ssh_key": str(self.client_key_path),
            "ssh_known_hosts": str(self.known_hosts_path),
            "ssh_insecure_no_host_check": False,
            "env": {},
        }
        fields.update(overrides)
        return SimpleNamespace(**fields)


# ---- asyncssh's server ----------------------------------------------------------------------------------


class AsyncsshServer(SshTestServer):
    """asyncssh's server on its own event loop in a background thread."""

    kind = "asyncssh"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="asyncssh-test-server", daemon=True)
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._connections: set[asyncssh.SSHServerConnection] = set()
        self._children: set[asyncio.subprocess.Process] = set()

    def _call(self, coro: Any, timeout: float = 10.0) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def start(self) -> None:
        self._thread.start()
        self._call(self._listen())
        self.write_known_hosts()

    async def _listen(self) -> None:
        server = self

        class _Tracking(asyncssh.SSHServer):
            def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
                server._connections.add(conn)

            def connection_lost(self, exc: Exception | None) -> None:
                server._connections.difference_update({c for c in server._connections if c.is_closed()})

        self._acceptor = await asyncssh.listen(
            self.host,
            0,
            server_host_keys=[self.host_key],
            authorized_client_keys=str(self.authorized_keys_path),
            server_factory=_Tracking,
            process_factory=self._handle,
            encoding=None,
            config=None,
        )
        self.port = self._acceptor.get_port()

    async def _handle(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        """Run the command through /bin/sh with real pipes and report its status like sshd does."""
        child = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            process.command or "exit 0",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self._children.add(child)
        assert child.stdin and child.stdout and child.stderr

        async def pump_out(reader: asyncio.StreamReader, writer: asyncssh.SSHWriter[bytes]) -> None:
            while data := await reader.read(65536):
                with contextlib.suppress(Exception):  # the client may be gone; keep draining
                    writer.write(data)

        async def pump_in() -> None:
            with contextlib.suppress(Exception):
                while data := await process.stdin.read(65536):
                    child.stdin.write(data)
                    await child.stdin.drain()
            with contextlib.suppress(Exception):
                child.stdin.close()

        feeder = asyncio.ensure_future(pump_in())
        try:
            # Like sshd: the session ends when the output pipes close, not when the shell exits.
            await asyncio.gather(pump_out(child.stdout, process.stdout), pump_out(child.stderr, process.stderr))
            code = await child.wait()
        finally:
            feeder.cancel()
            self._children.discard(child)
        with contextlib.suppress(Exception):
            process.exit(128 - code if code < 0 else code)

    def drop_connections(self) -> None:
        """Close every client connection from the server side, as a restarted sshd or a dead link would."""

        async def drop() -> None:
            for conn in list(self._connections):
                conn.close()
                await conn.wait_closed()
            self._connections.clear()

        self._call(drop())

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._acceptor is not None:
                self._acceptor.close()
                await self._acceptor.wait_closed()
            for conn in list(self._connections):
                conn.close()
            for child in list(self._children):
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                await child.wait()

        try:
            self._call(shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


@contextlib.contextmanager
def asyncssh_server(directory: Path) -> Iterator[AsyncsshServer]:
    """asyncssh's SSH server on 127.0.0.1, running commands as real subprocesses."""
    server = AsyncsshServer(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()
