"""A slow network to one soak host: asyncssh's server on 127.0.0.1 behind a TCP proxy that can delay every chunk.

``bench/soak.py --ssh-hosts K`` makes its last K hosts SSH hosts; each gets one :class:`SlowLink`: the test
suite's asyncssh server (``bench/ssh_server.py``: real SSH, commands run through ``/bin/sh`` in real
subprocesses) and, in front of it, a proxy whose per-chunk delay the ``slow_network`` fault raises for a
few seconds. benchbot's worker reaches the host through the proxy (``ssh_port`` is the proxy's; the
known_hosts line names the proxy's port), so every actuator call, health probe and bench request's
control traffic over SSH crosses the delay. The engine's own HTTP port stays direct, as on a real box.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

from bench.ssh_server import AsyncsshServer


class SlowLink:
    """An SSH server and a delaying proxy in front of it, on a loop in a background thread."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.ssh = AsyncsshServer(directory)
        self.delay_s = 0.0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="slow-link", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def start(self) -> SlowLink:
        self.ssh.start()
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        line = f"[{self.ssh.host}]:{self.port} ".encode() + self.ssh.host_key.export_public_key()
        self.ssh.known_hosts_path.write_bytes(line)  # the worker connects to the proxy's port
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.ssh.host, self.ssh.port)
        except OSError:
            writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    if self.delay_s:
                        await asyncio.sleep(self.delay_s)
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError, RuntimeError):
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def toml(self) -> str:
        """The ``[hosts.X]`` transport lines for this link."""
        s = self.ssh
        return (
            f'transport = "ssh"\nssh_target = "{s.host}"\nssh_port = {self.port}\nssh_user = "{s.username}"\n'
            f'ssh_key = "{s.client_key_path}"\nssh_known_hosts = "{s.known_hosts_path}"\n'
        )

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        with contextlib.suppress(Exception):
            self.ssh.stop()
