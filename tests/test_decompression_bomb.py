"""Round 4, item 3 (issue 39): a decompression bomb never grows a worker.

A real HTTP server on 127.0.0.1 answers every path with ~64 KB of gzip that decodes to 64 MiB (four times
the control cap) under ``Content-Encoding: gzip``, whatever it was asked. The response caps count wire
bytes; httpx and aiohttp decode after them. Every control call (``/server_info``, ``/health``, the
sampler's ``/metrics``) and both streaming senders must ask for identity and refuse what came encoded,
unread.
"""

from __future__ import annotations

import asyncio
import http.server
import threading
import zlib
from collections.abc import Iterator

import httpx
import pytest

from workers.benchmark.limits import DEFAULT_LIMITS
from workers.benchmark.senders import make_sender
from workers.capped_http import CONTROL_MAX_BYTES, UnaskedEncoding, capped_client
from workers.engines import readiness, registry
from workers.telemetry.sampler import RunTelemetry

DECODED_BYTES = 4 * CONTROL_MAX_BYTES


def gzip_bomb(decoded: int) -> bytes:
    """``decoded`` zero bytes as one gzip member (about a thousandth of the size), made a MiB at a time."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(2**20)
    parts = [packer.compress(block) for _ in range(decoded // len(block))]
    return b"".join([*parts, packer.flush()])


class BombServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    bomb = b""
    asked: list[str]


class BombHandler(http.server.BaseHTTPRequestHandler):
    server: BombServer

    def _answer(self) -> None:
        self.server.asked.append(self.headers.get("Accept-Encoding", ""))
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = self.server.bomb
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if self.command == "POST" else "application/json")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def bomb_url() -> Iterator[tuple[str, BombServer]]:
    server = BombServer(("127.0.0.1", 0), BombHandler)
    server.bomb = gzip_bomb(DECODED_BYTES)
    server.asked = []
    assert len(server.bomb) < CONTROL_MAX_BYTES // 100  # small on the wire: under every wire cap
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()


def test_a_control_client_asks_for_identity_and_refuses_gzip_unread(bomb_url: tuple[str, BombServer]) -> None:
    url, server = bomb_url

    async def get() -> httpx.Response:
        async with capped_client(timeout=10) as client:
            return await client.get(url + "/server_info")

    before = len(server.asked)
    with pytest.raises(UnaskedEncoding, match="gzip-encoded"):
        asyncio.run(get())
    assert server.asked[before:] == ["identity"]


@pytest.mark.parametrize("kind", ["sglang", "vllm", "trtllm"])
def test_every_engines_observation_and_health_refuse_the_bomb(bomb_url: tuple[str, BombServer], kind: str) -> None:
    url, _ = bomb_url
    report = asyncio.run(registry.driver_for(kind).report(url, None, 10, None))
    assert report.outcome not in ("ok", "warming") and report.view is None, report
    status, why = asyncio.run(readiness.health_status(url, None, 10))
    assert status is None and "UnaskedEncoding" in why, (status, why)


def test_the_sampler_scrape_refuses_the_bomb(bomb_url: tuple[str, BombServer]) -> None:
    url, _ = bomb_url
    tel = RunTelemetry(transport=None, nvidia_smi=(), metrics_url=url + "/metrics")  # type: ignore[arg-type]

    async def scrape() -> tuple[object, str | None]:
        async with capped_client(timeout=10) as client:
            return await tel._scrape(client)

    reading, why = asyncio.run(scrape())
    assert reading is None and why == "UnaskedEncoding"


@pytest.mark.parametrize("client", ["wire", "aiohttp"])
def test_both_streaming_senders_refuse_an_encoded_stream(bomb_url: tuple[str, BombServer], client: str) -> None:
    url, server = bomb_url
    budget = DEFAULT_LIMITS.budget(64)

    async def send() -> tuple[str | None, int]:
        sender = make_sender(url, "/v1/completions", {"Content-Type": "application/json"}, budget, client)
        try:
            raw = sender.finish(await sender.send(b"{}"))
        finally:
            await sender.close()
        return raw.error, sum(len(chunk) for _, chunk in raw.reads)

    before = len(server.asked)
    error, kept = asyncio.run(send())
    assert error is not None and "gzip-encoded" in error, error
    assert kept <= len(server.bomb) and server.asked[before:] == ["identity"]  # nothing decoded
