"""Slack's side of Socket Mode on 127.0.0.1: an aiohttp WebSocket server the real bolt handler connects to."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable

from aiohttp import WSMsgType, web

from bot.slack_standin.web_api import SlackJson


class SocketModeStandIn:
    """An aiohttp WebSocket server that plays Slack's side of Socket Mode.

    It greets each connection with ``hello``, lets a test push envelopes (``push``) and records the
    client's acks by ``envelope_id``.
    """

    def __init__(self) -> None:
        self.acks: dict[str, SlackJson] = {}
        self.connections = 0
        self._sockets: list[web.WebSocketResponse] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="socket-mode-standin", daemon=True)
        self._runner: web.AppRunner | None = None
        self._stopped: asyncio.Event | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/link/?ticket=standin"

    def start(self) -> SocketModeStandIn:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("socket mode stand-in did not start")
        return self

    def stop(self) -> None:
        if self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(timeout=10)

    def __enter__(self) -> SocketModeStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        app = web.Application()
        app.router.add_get("/link/", self._link)
        app.router.add_get("/link", self._link)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sockets = getattr(site._server, "sockets", None)  # an asyncio.Server once the site started
        assert sockets
        self.port = sockets[0].getsockname()[1]
        self._ready.set()
        await self._stopped.wait()
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await ws.close()
        await self._runner.cleanup()

    async def _link(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.append(ws)
        self.connections += 1
        await ws.send_str(
            json.dumps(
                {
                    "type": "hello",
                    "num_connections": 1,
                    "connection_info": {"app_id": "A0STANDIN"},
                    "debug_info": {"host": "standin"},
                }
            )
        )
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    with contextlib.suppress(ValueError):
                        data = json.loads(msg.data)
                        if isinstance(data, dict) and data.get("envelope_id"):
                            self.acks[str(data["envelope_id"])] = data
        finally:
            self._sockets.remove(ws)
        return ws

    def push(self, envelope_type: str, payload: SlackJson, *, retry_attempt: int = 0) -> str:
        """Send one envelope to every connected client; returns its envelope id."""
        envelope_id = uuid.uuid4().hex
        envelope = {
            "envelope_id": envelope_id,
            "type": envelope_type,
            "payload": payload,
            "accepts_response_payload": envelope_type != "events_api",
            "retry_attempt": retry_attempt,
            "retry_reason": "timeout" if retry_attempt else "",
        }

        async def send() -> None:
            for ws in list(self._sockets):
                await ws.send_str(json.dumps(envelope))

        asyncio.run_coroutine_threadsafe(send(), self._loop).result(timeout=5)
        return envelope_id

    def wait_connected(self, timeout: float = 10.0) -> None:
        _poll(lambda: bool(self._sockets), timeout, "a socket mode client to connect")

    def wait_ack(self, envelope_id: str, timeout: float = 10.0) -> SlackJson:
        _poll(lambda: envelope_id in self.acks, timeout, f"the ack of envelope {envelope_id}")
        return self.acks[envelope_id]


def _poll(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
