"""The load generator bounds every response (issue 25, item 3), against hostile servers on 127.0.0.1.

A raw asyncio server answers each request with exactly the attack wanted: a stream without end, a
chunk size of ``FFFF...``, a chunk-size line without end, endless headers, silence after the head, a
head or a body trickled a byte at a time. Each must end in bounded time with bounded memory (the bytes
the client kept stay under the budget plus one read), with an error per request that names the option
to change, and the level marks it (``LevelMetrics.cut``), on both hot paths: the wire client (http://)
and aiohttp (https://, forced here over plain http with ``client="aiohttp"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest
import uvloop

from tests.util import free_port
from workers.benchmark import senders
from workers.benchmark.level import LevelResult, run_level
from workers.benchmark.limits import DEFAULT_LIMITS, ResponseLimits, limit_kind, parse_bytes
from workers.benchmark.metrics import describe
from workers.benchmark.prompts import Prompt
from workers.benchmark.settings import ClientSettings
from workers.benchmark.shard import ShardSpec
from workers.benchmark.spec import BenchSpec
from workers.benchmark.stream import RawResponse
from workers.capped_http import CONTROL_MAX_BYTES, capped_client
from workers.engines.sglang.observation import server_info as sglang_server_info
from workers.errors import BenchbotError

Attack = Callable[[asyncio.StreamWriter], Awaitable[None]]
EVENT = b'data: {"text":"x","meta_info":{"completion_tokens":1,"prompt_tokens":4}}\n\n'
OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
CLIENTS = ("wire", "aiohttp")
#: Small bounds so each attack trips within a second or two.
LIMITS = ResponseLimits(max_bytes=2_000_000, first_byte_s=1.0, idle_s=1.0, line_bytes=100_000)
#: What one read may add past a budget before the check sees it (aiohttp buffers up to its read size).
SLACK = {"wire": 1 << 20, "aiohttp": senders.READ_BUFSIZE + (1 << 20)}


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def endless_stream(w: asyncio.StreamWriter) -> None:
    w.write(OK_HEAD)
    block = _chunk(EVENT * 800)
    while True:
        w.write(block)
        await w.drain()


async def huge_chunk_size(w: asyncio.StreamWriter) -> None:
    w.write(OK_HEAD + b"F" * 16 + b"\r\n")
    while True:
        w.write(EVENT * 800)
        await w.drain()


async def endless_chunk_size_line(w: asyncio.StreamWriter) -> None:
    w.write(OK_HEAD)
    while True:
        w.write(b"F" * 65536)
        await w.drain()


async def endless_headers(w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 200 OK\r\n")
    n = 0
    while True:
        w.write(b"".join(b"X-Flood-%d: %s\r\n" % (n + i, b"y" * 40) for i in range(1000)))
        n += 1000
        await w.drain()


async def endless_line(w: asyncio.StreamWriter) -> None:
    w.write(OK_HEAD)
    while True:
        w.write(_chunk(b"data: " + b"z" * 65536))  # never a newline in the body
        await w.drain()


async def silent_after_head(w: asyncio.StreamWriter) -> None:
    w.write(OK_HEAD)
    await w.drain()
    await asyncio.sleep(3600)


async def silent(w: asyncio.StreamWriter) -> None:
    await asyncio.sleep(3600)


async def trickled_head(w: asyncio.StreamWriter) -> None:
    for byte in OK_HEAD:
        w.write(bytes([byte]))
        await w.drain()
        await asyncio.sleep(0.3)


async def trickled_body(w: asyncio.StreamWriter) -> None:
    w.write(OK_HEAD)
    await w.drain()
    body = _chunk(EVENT) * 1000
    for i in range(len(body)):
        w.write(body[i : i + 1])
        await w.drain()
        await asyncio.sleep(0.3)


@contextlib.asynccontextmanager
async def hostile(attack: Attack) -> AsyncIterator[str]:
    """A server on 127.0.0.1 that reads each request, then runs ``attack`` on the connection."""
    tasks: set[asyncio.Task[None]] = set()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")), 0
            )
            await reader.readexactly(length)
            await attack(writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    port = free_port()
    server = await asyncio.start_server(on_connect, "127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _send_one(attack: Attack, client: str, limits: ResponseLimits, timeout_s: float = 30.0) -> RawResponse:
    """One request through the real sender of ``client``: the response as the level would keep it."""

    async def run() -> RawResponse:
        async with hostile(attack) as url:
            budget = replace(limits, timeout_s=timeout_s).budget(16)
            sender = senders.make_sender(url, "/generate", {}, budget, client)
            try:
                sent: Any = await sender.send(b'{"stream": true}')  # the sender's own kind of response
                return sender.finish(sent)
            finally:
                await sender.close()

    return uvloop.run(run())


CASES = [
    (endless_stream, "max-bytes", "grew past 2MB"),
    (huge_chunk_size, "max-bytes", "max-bytes=2MB"),
    (endless_chunk_size_line, "framing", "HTTP"),
    (endless_headers, "header-bytes", "head"),
    (endless_line, "line-bytes", "without a newline"),
    (silent_after_head, "idle", "nothing received for 1 s"),
    (silent, "first-byte", "no complete response head within 1 s"),
    (trickled_head, "first-byte", "no complete response head within 1 s"),
]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("attack", "kind", "words"), CASES, ids=[c[0].__name__ for c in CASES])
def test_a_hostile_response_is_cut_in_bounded_time_and_memory(
    client: str, attack: Attack, kind: str, words: str
) -> None:
    started = time.monotonic()
    raw = _send_one(attack, client, LIMITS)
    elapsed = time.monotonic() - started
    kept = sum(len(data) for _, data in raw.reads)
    assert raw.error is not None and words in raw.error, raw.error
    assert limit_kind(raw.error) == kind, raw.error
    assert LIMITS.max_bytes is not None and kept <= LIMITS.max_bytes + SLACK[client], kept
    assert elapsed < 20, elapsed  # generous: the bounds are 1 s; the 900 s default is what it replaced


async def chunk_past_the_total(w: asyncio.StreamWriter) -> None:
    """1.5 MB of ordinary chunks, then one 600 KB chunk announced: no chunk is too big, their total is."""
    w.write(OK_HEAD)
    block = _chunk(EVENT * 500)
    for _ in range(1_500_000 // len(block)):
        w.write(block)
    w.write(b"%x\r\n" % 600_000)
    await w.drain()
    await asyncio.sleep(3600)


def test_a_chunk_that_takes_the_running_total_past_max_bytes_is_named_as_the_total() -> None:
    """Issue 36 item 5: the cut says the total would pass max-bytes, not that one 600 KB chunk was too big."""
    raw = _send_one(chunk_past_the_total, "wire", LIMITS)
    assert raw.error is not None and limit_kind(raw.error) == "max-bytes", raw.error
    assert raw.error.startswith("the response would grow past 2MB: 1.4"), raw.error
    assert raw.error.endswith("received, then a chunk of 600KB announced (max-bytes=2MB)"), raw.error


@pytest.mark.parametrize("client", CLIENTS)
def test_a_trickled_body_ends_at_the_timeout_it_was_given(client: str) -> None:
    # one byte every 0.3 s never looks silent; the whole-request deadline (timeout=) ends it
    # (aiohttp sees only body bytes, so its silences are longer than the byte gaps: idle is set past it)
    raw = _send_one(trickled_body, client, replace(LIMITS, idle_s=30.0), timeout_s=2.0)
    assert raw.error == "timed out after 2 s (timeout=2s)", raw.error
    assert limit_kind(raw.error) == "timeout"


@pytest.mark.parametrize("client", CLIENTS)
def test_the_level_counts_the_requests_a_bound_cut_and_says_so(client: str) -> None:
    async def run() -> LevelResult:
        async with hostile(endless_stream) as url:
            settings = ClientSettings(
                BenchSpec(levels=(2,), num_requests=4, warmup=0, output_len=16, limits=LIMITS),
                client=client,
            )
            return await run_level(url, settings)

    m = uvloop.run(run()).metrics
    assert (m.num_requests, m.errors, m.cut) == (4, 4, {"max-bytes": 4}), m
    assert "max-bytes=2MB" in m.error_samples[0]
    assert m.to_dict()["cut"] == {"max-bytes": 4}
    assert "cut off by response limits: 4 by max-bytes=" in describe(m)


def test_a_healthy_long_stream_stays_far_inside_the_defaults() -> None:
    # SGLang's /generate repeats the whole text so far in every event: ~4 bytes x tokens^2 / 2 in all
    tokens = 4096
    cumulative = sum(200 + 4 * k for k in range(tokens))
    budget = DEFAULT_LIMITS.budget(tokens)
    assert cumulative * 4 < budget.max_bytes and 4 * tokens * 8 < budget.line_bytes
    assert budget.first_byte_s >= 60 and budget.idle_s >= 60 and budget.header_bytes >= 32 * 1024


def test_the_budget_follows_the_longest_output_of_a_shard_and_explicit_values_win() -> None:
    prompt = Prompt(index=0, input_tokens=2, output_tokens=1000, exact_input=True, token_ids=(1, 2))
    settings = ClientSettings(BenchSpec(levels=(1,), limits=ResponseLimits(timeout_s=5.0)))
    spec = ShardSpec("http://x", settings, 1, (), (prompt,))
    assert spec.budget().max_bytes == DEFAULT_LIMITS.bytes_for(1000) and spec.budget().timeout_s == 5.0
    fixed = ResponseLimits(max_bytes=3_000_000)
    assert fixed.budget(10**6).max_bytes == 3_000_000
    assert ResponseLimits.from_dict(fixed.to_dict()) == fixed and DEFAULT_LIMITS.to_dict() == {}


@pytest.mark.parametrize(
    ("text", "expect"), [("256MB", 256_000_000), ("1GiB", 2**30), ("65536", 65536), ("1.5 GB", 1_500_000_000)]
)
def test_sizes_parse_as_people_type_them(text: str, expect: int) -> None:
    assert parse_bytes(text, "max-bytes=") == expect


@pytest.mark.parametrize("text", ["", "abc", "12 parsecs", "10", "-5MB"])
def test_a_bad_size_is_a_friendly_error(text: str) -> None:
    with pytest.raises(BenchbotError, match="max-bytes="):
        parse_bytes(text, "max-bytes=")


# --------------------------------------------------------------------------- control calls (httpx)


def test_a_control_call_against_an_endless_answer_is_cut_at_its_cap() -> None:
    async def run() -> str:
        async with hostile(endless_stream) as url, capped_client(max_bytes=1_000_000, timeout=30) as client:
            with pytest.raises(httpx.HTTPError) as info:
                await client.get(url + "/v1/models")
        return str(info.value)

    message = asyncio.run(run())
    assert "went past 1000000 bytes and was cut off" in message


def test_observation_reports_an_endless_server_info_instead_of_growing_without_end() -> None:
    async def run() -> tuple[str, object, str]:
        async with hostile(endless_stream) as url:
            return await sglang_server_info(url, None, timeout_s=30)

    tracemalloc.start()
    try:
        outcome, info, detail = asyncio.run(run())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (outcome, info) == ("unreachable", None) and "ResponseTooLarge" in detail, detail
    assert peak < CONTROL_MAX_BYTES * 3, peak  # the cap (16 MiB) and httpx's copies of it, not the stream


def test_warming_the_aiohttp_pool_reads_a_bounded_answer() -> None:
    # open_connections asks GET /v1/models to leave pooled connections: an endless answer is dropped
    async def run() -> float:
        async with hostile(endless_stream) as url:
            sender = senders.make_sender(url, "/generate", {}, LIMITS.budget(16), "aiohttp")
            started = time.monotonic()
            try:
                await sender.open_connections(2)
            finally:
                await sender.close()
            return time.monotonic() - started

    tracemalloc.start()
    try:
        elapsed = uvloop.run(run())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 9, elapsed  # cut at the cap, not at the 10 s deadline of the touch
    assert peak < 2 * senders.READ_BUFSIZE + 8 * senders.TOUCH_MAX_BYTES, peak


@pytest.mark.parametrize("client", CLIENTS)
def test_a_server_that_never_accepts_ends_at_first_byte(client: str) -> None:
    # a listener whose accept queue is full and that never accepts: the connect itself hangs
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):  # fill the accept queue (what gets through just never hears back)
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)

    async def run() -> RawResponse:
        sender = senders.make_sender(f"http://127.0.0.1:{port}", "/generate", {}, LIMITS.budget(16), client)
        try:
            sent: Any = await sender.send(b"{}")
            return sender.finish(sent)
        finally:
            await sender.close()

    started = time.monotonic()
    try:
        raw = uvloop.run(run())
    finally:
        for s in (*fillers, listener):
            s.close()
    assert limit_kind(raw.error) == "first-byte", raw.error
    assert time.monotonic() - started < 20


def test_one_huge_read_is_blamed_on_the_limit_the_stream_crossed_first() -> None:
    # aiohttp hands over all it buffered in one read (megabytes on a busy box): an endless line must still be
    # called a line too long, not a response too big, whatever the read sizes were
    budget = LIMITS.budget(64)
    data = b"z" * 3_000_000  # no newline: the line limit (100 kB) comes long before the byte limit (2 MB)
    why = senders._first_limit(budget, data, -1, 0, 0, len(data))
    assert limit_kind(why) == "line-bytes", why
    # newline-separated lines, then a long tail that crosses the byte limit first
    before = 1_950_000
    data = b"a\n" + b"z" * 150_000
    why = senders._first_limit(budget, data, 1, before, 10, 150_000)
    assert limit_kind(why) == "max-bytes", why
    # the tail crosses the line limit before the byte limit
    before = 1_000_000
    data = b"a\n" + b"z" * 1_500_000
    why = senders._first_limit(budget, data, 1, before, 10, 1_500_000)
    assert limit_kind(why) == "line-bytes", why
