"""The wire client (``workers.benchmark.wire``) against hand-written HTTP responses on 127.0.0.1.

A raw TCP server sends exactly the bytes each test wants (split across writes where it matters), so
every framing the client may meet is pinned: chunked with extensions and trailers, Content-Length,
close-delimited HTTP/1.0, a keep-alive connection the server closed while idle (retried once, fresh),
a response cut short, a timeout. ``decode`` must hand back the body bytes stamped by the read that
carried them, exactly as aiohttp would have delivered them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from tests.util import free_port
from workers.benchmark.level import run_level
from workers.benchmark.limits import DEFAULT_LIMITS
from workers.benchmark.senders import make_sender
from workers.benchmark.settings import ClientSettings
from workers.benchmark.spec import BenchSpec
from workers.benchmark.wire import WireResponse, WireSession, decode

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return head


async def _serve(handler: Handler, requests: int, body: Callable[[WireSession], Awaitable[list]]) -> list:
    """Run ``body`` against a server whose ``handler(reader, writer, n)`` answers request n (True: keep open)."""
    port = free_port()
    count = 0
    connections = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        connections.append(writer)
        try:
            while count < requests:
                if await _read_request(reader) is None:
                    return
                count += 1
                if not await handler(reader, writer, count):
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    server = await asyncio.start_server(on_connect, "127.0.0.1", port)
    session = WireSession(f"http://127.0.0.1:{port}")
    try:
        return await body(session)
    finally:
        await session.close()
        server.close()
        for w in connections:
            w.close()
        await server.wait_closed()


def _body(resp: WireResponse) -> tuple[int | None, bytes, str | None]:
    status, reads, error = decode(resp)
    return status, b"".join(chunk for _, chunk in reads), error


def test_chunked_with_extensions_and_trailers_split_anywhere() -> None:
    parts = [
        b"HTTP/1.1 200 OK\r\nTransfer-Enc",
        b"oding: chunked\r\nContent-Type: text/event-stream\r\n\r\n",
        b"9;ext=1\r\ndata: ",
        b"a\n\n\r\n9\r\ndata: b\n\n\r\n0\r\nX-Trailer: yes\r\n",
        b"\r\n",
    ]

    async def handler(_r, writer, _n) -> bool:
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.01)
        return True

    async def body(session: WireSession) -> list:
        return [await session.post("/generate", b"{}", {}, 5)]

    (resp,) = asyncio.run(_serve(handler, 1, body))
    assert resp.error is None and len(resp.reads) >= 4
    status, payload, error = _body(resp)
    assert (status, payload, error) == (200, b"data: a\n\ndata: b\n\n", None)
    # each body byte carries the stamp of the read it arrived in: "data: " came before "a"
    _, reads, _ = decode(resp)
    assert reads[0][1] == b"data: " and reads[1][1].startswith(b"a") and reads[0][0] < reads[1][0]


def test_content_length_and_keep_alive_reuse_one_connection() -> None:
    async def handler(_r, writer, n) -> bool:
        text = f"reply {n}".encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text))
        await writer.drain()
        return True

    async def body(session: WireSession) -> list:
        out = [await session.post("/x", b"{}", {}, 5) for _ in range(3)]
        out.append(len(session._all))
        return out

    *resps, connections = asyncio.run(_serve(handler, 3, body))
    assert [_body(r)[1] for r in resps] == [b"reply 1", b"reply 2", b"reply 3"]
    assert connections == 1


def test_http_1_0_close_delimited_body_ends_at_close() -> None:
    async def handler(_r, writer, _n) -> bool:
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
        await writer.drain()
        return False  # close: that is the end of the body

    async def body(session: WireSession) -> list:
        return [await session.post("/x", b"{}", {}, 5)]

    (resp,) = asyncio.run(_serve(handler, 1, body))
    assert _body(resp) == (200, b"all of it", None)


def test_an_idle_connection_the_server_closed_is_retried_once_on_a_fresh_one() -> None:
    async def handler(_r, writer, n) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        return n != 1  # after the first reply the server drops the kept-alive connection (uvicorn's 5 s)

    async def body(session: WireSession) -> list:
        first = await session.post("/x", b"{}", {}, 5)
        for _ in range(100):  # until the client has seen the close: then the pool holds a dead conn
            if all(c.closed for c in session._idle):
                break
            await asyncio.sleep(0.01)
        return [first, await session.post("/x", b"{}", {}, 5)]

    first, second = asyncio.run(_serve(handler, 2, body))
    assert _body(first) == (200, b"ok", None) and _body(second) == (200, b"ok", None)


def test_a_response_cut_short_is_an_error_and_a_timeout_is_one_too() -> None:
    async def cut(_r, writer, _n) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
        await writer.drain()
        return False

    async def one(session: WireSession) -> list:
        return [await session.post("/x", b"{}", {}, 5)]

    (resp,) = asyncio.run(_serve(cut, 1, one))
    assert resp.error and "closed the connection before the response ended" in resp.error

    async def garbage(_r, writer, _n) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nnot framing\r\n")
        await writer.drain()
        await asyncio.sleep(1)  # the client must not wait for this: it gives up on the framing at once
        return False

    (bad,) = asyncio.run(_serve(garbage, 1, one))
    status, body, error = _body(bad)
    assert status == 200 and body == b"" and error and "bad chunked framing" in error

    async def silent(_r, _w, _n) -> bool:
        await asyncio.sleep(2)
        return False

    async def quick(session: WireSession) -> list:
        return [await session.post("/x", b"{}", {}, 0.2)]

    (slow,) = asyncio.run(_serve(silent, 1, quick))
    assert slow.error == "timed out after 0.2 s (timeout=0.2s)"


def test_connection_refused_is_an_error_not_a_crash() -> None:
    async def run() -> WireResponse:
        session = WireSession(f"http://127.0.0.1:{free_port()}")
        try:
            return await session.post("/x", b"{}", {}, 2)
        finally:
            await session.close()

    resp = asyncio.run(run())
    assert resp.error and "ConnectionRefusedError" in resp.error


def test_wire_refuses_https_which_goes_through_aiohttp() -> None:
    with pytest.raises(ValueError, match="plain http"):
        WireSession("https://127.0.0.1:1")

    async def kinds() -> tuple[str, str]:
        secure = make_sender("https://127.0.0.1:1", "/generate", {}, DEFAULT_LIMITS.budget(16))
        plain = make_sender("http://127.0.0.1:1", "/generate", {}, DEFAULT_LIMITS.budget(16))
        await secure.close()
        await plain.close()
        return type(secure).__name__, type(plain).__name__

    assert asyncio.run(kinds()) == ("_AiohttpSender", "_WireSender")


def test_both_hot_paths_measure_the_same_on_the_simulator() -> None:
    from workers.sim.launcher import start_sim

    with start_sim(free_port(), "--sim-timing", "fixed", "--sim-ttft-ms", "30", "--sim-itl-ms", "5") as sim:
        results = {
            client: asyncio.run(
                run_level(
                    sim.base_url,
                    ClientSettings(
                        BenchSpec(levels=(4,), num_requests=8, input_len=32, output_len=24, warmup=0),
                        processes=1,
                        client=client,
                    ),
                )
            ).metrics
            for client in ("wire", "aiohttp")
        }
    wire_m, aio_m = results["wire"], results["aiohttp"]
    assert (wire_m.completed, wire_m.output_tokens) == (aio_m.completed, aio_m.output_tokens) == (8, 8 * 24)
    assert wire_m.itl_ms["p50"] == pytest.approx(aio_m.itl_ms["p50"], abs=1.5)
    assert wire_m.ttft_ms["p50"] == pytest.approx(aio_m.ttft_ms["p50"], abs=10)
