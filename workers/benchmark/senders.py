"""Senders: the hot path of one streamed request, and nothing else.

Two implementations behind one shape (``send`` / ``finish`` / ``open_connections`` / ``close``):
:class:`_WireSender` (``workers.benchmark.wire``, plain ``http://``: a quarter of aiohttp's CPU per chunk)
and :class:`_AiohttpSender` (``https://``, and the reference the wire client matches). Per read a sender
only stamps ``perf_counter_ns()`` and keeps the bytes, plus a counter comparison for the response
bounds (``workers.benchmark.limits``); decoding happens after the level (``workers.benchmark.stream``).

aiohttp on uvloop: one shared ``ClientSession`` (``TCPConnector(limit=0)``, 10 MB read buffer),
``resp.content.readany()`` (``iter_any`` unrolled), one watchdog task per sender for late heads and
silences (docs/metrics.md, "Client accuracy", says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Protocol, TypeVar

import aiohttp

from workers.benchmark import wire
from workers.benchmark.limits import Budget
from workers.benchmark.stream import RawResponse, Read
from workers.capped_http import ACCEPT_ENCODING, unasked_encoding

ItemT = TypeVar("ItemT")
READ_BUFSIZE = 10 * 2**20
#: The most a warm-up ``GET /v1/models`` may answer before its connection is dropped instead of pooled.
TOUCH_MAX_BYTES = 2**20


class _Watch:
    """One aiohttp request in flight, as the sender's watchdog sees it."""

    __slots__ = ("head", "t_last_ns", "t_send_ns", "timer", "why")

    def __init__(self, t_send_ns: int) -> None:
        self.t_send_ns = self.t_last_ns = t_send_ns
        self.head = False  # the status and headers arrived
        self.timer: asyncio.Timeout | None = None
        self.why: str | None = None  # set by the watchdog when it cut the request


class _AiohttpSender:
    """aiohttp on the hot path: for ``https://`` servers (and as the reference the wire client matches).

    Its parser bounds the head (``max_line_size``/``max_field_size`` at ``header_bytes``, 128 headers);
    the read loop bounds bytes and line length; a watchdog task expires a request's own deadline
    (``asyncio.Timeout.reschedule``) when its head is late or it goes silent.
    """

    def __init__(self, base_url: str, path: str, headers: dict[str, str], budget: Budget) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=300)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)
        # identity only, never decompressed: a gzip bomb would be decoded past the byte budget (issue 39)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            read_bufsize=READ_BUFSIZE,
            max_line_size=budget.header_bytes,
            max_field_size=budget.header_bytes,
        )
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + path
        self.headers = {**headers, "Accept-Encoding": ACCEPT_ENCODING}
        self.budget = budget
        self._inflight: set[_Watch] = set()
        self._watchdog: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        """Cut a request whose head is late or that went silent: one pass per tick, nothing per chunk."""
        budget = self.budget
        first_ns, idle_ns = int(budget.first_byte_s * 1e9), int(budget.idle_s * 1e9)
        tick = min(1.0, max(0.02, min(budget.first_byte_s, budget.idle_s) / 4))
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(tick)
            now = time.perf_counter_ns()
            for w in list(self._inflight):
                if w.why is None and w.timer is not None:
                    if not w.head and now - w.t_send_ns > first_ns:
                        w.why = budget.no_first_byte()
                    elif w.head and now - w.t_last_ns > idle_ns:
                        w.why = budget.silent()
                    if w.why is not None:
                        with contextlib.suppress(RuntimeError):  # it may be exiting on its own this instant
                            w.timer.reschedule(loop.time())  # expire its deadline now: the send returns

    async def send(self, body: bytes) -> RawResponse:
        """One streamed request: stamp each read as it arrives, keep the bytes, decode nothing.

        The loop is ``iter_any()`` unrolled into ``readany()`` (one coroutine frame less per read), and the
        deadline is one ``asyncio.timeout`` per request rather than aiohttp's per-read timer context.
        Per read it adds a counter comparison for the byte budget and an ``rfind`` for the line length
        (an SSE event ends with its newline: found at once).
        """
        reads: list[Read] = []
        append = reads.append
        clock = time.perf_counter_ns
        budget = self.budget
        max_bytes, max_line = budget.max_bytes, budget.line_bytes
        t_send = clock()
        watch = _Watch(t_send)
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())
        self._inflight.add(watch)
        error: str | None = None
        try:
            async with asyncio.timeout(budget.timeout_s) as timer:
                watch.timer = timer
                async with self.session.post(self.url, data=body, headers=self.headers) as resp:
                    watch.head, watch.t_last_ns = True, clock()
                    if resp.status != 200:
                        text = (await resp.content.read(300)).decode(errors="replace").strip()
                        return RawResponse(t_send, clock(), (), f"HTTP {resp.status}: {text}")
                    if (encoding := unasked_encoding(resp.headers)) is not None:
                        resp.close()
                        return RawResponse(t_send, clock(), (), f"the stream came {encoding[:40]}-encoded, unasked")
                    readany = resp.content.readany
                    got = run = 0
                    while data := await readany():
                        t = clock()
                        append((t, data))
                        watch.t_last_ns = t
                        before, got = got, got + len(data)
                        nl = data.rfind(b"\n")
                        before_run, run = run, run + len(data) if nl < 0 else len(data) - nl - 1
                        if got > max_bytes or run > max_line:
                            error = _first_limit(budget, data, nl, before, before_run, run)
                            resp.close()  # drop the connection: nothing more is read
                            break
        except TimeoutError:
            return RawResponse(t_send, clock(), tuple(reads), watch.why or budget.timed_out())
        except aiohttp.ClientError as exc:
            return RawResponse(t_send, clock(), tuple(reads), _aiohttp_error(exc, budget))
        finally:
            self._inflight.discard(watch)
        return RawResponse(t_send, clock(), tuple(reads), error)

    def finish(self, item: RawResponse) -> RawResponse:
        return item

    async def open_connections(self, count: int) -> None:
        """Fill the keep-alive pool with ``count`` connections before timing starts, so the first wave's
        TTFT measures the server rather than ``count`` simultaneous TCP handshakes. ``GET /v1/models`` is
        cheap on SGLang (``/health`` would run a generation); any answer leaves a reusable connection.
        """
        url = self.base_url + "/v1/models"

        async def touch() -> None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with asyncio.timeout(10), self.session.get(url, headers=self.headers) as resp:
                    got = 0
                    while data := await resp.content.readany():  # the answer, up to what a model list is
                        got += len(data)
                        if got > TOUCH_MAX_BYTES:
                            resp.close()
                            break

        await asyncio.gather(*(touch() for _ in range(count)))

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        await self.session.close()


def _first_limit(budget: Budget, data: bytes, nl: int, before: int, before_run: int, run: int) -> str:
    """The limit the stream crossed first inside ``data``: aiohttp hands over everything it buffered at once
    (megabytes on a busy box), so one read can cross both the byte and the line limit; the cause is the one
    reached at the earlier byte, whatever the read sizes were."""
    max_bytes, max_line = budget.max_bytes, budget.line_bytes
    bytes_at = max_bytes - before if before + len(data) > max_bytes else len(data)
    if run <= max_line:
        return budget.too_big()
    line_at = max_line - before_run if nl < 0 else nl + 1 + max_line
    return budget.line_too_long() if line_at < bytes_at else budget.too_big()


def _aiohttp_error(exc: aiohttp.ClientError, budget: Budget) -> str:
    """aiohttp's parser refusals in the words of the bound they hit (and short: its message quotes the
    offending bytes, an ``FFFF...`` line of any length); anything else as aiohttp says it."""
    text = f"{type(exc).__name__}: {exc}".strip(": ")
    short = text if len(text) <= 200 else text[:200] + "..."
    if isinstance(exc, aiohttp.ClientResponseError) and exc.status == 400:  # the response parser's refusal
        message = " ".join(str(exc.message).split())
        if any(w in message for w in ("Too many headers", "Got more than", "too long", "Line is too long")):
            return budget.head_too_big(message[:120])
        if "hunk" in message:
            return budget.bad_framing(message[:120])
    return short


class _WireSender:
    """The plain-http hot path (``workers.benchmark.wire``): one stamp per read, decoding after the level."""

    def __init__(self, base_url: str, path: str, headers: dict[str, str], budget: Budget) -> None:
        self.session = wire.WireSession(base_url, budget)
        self.path = path
        self.headers = headers

    async def send(self, body: bytes) -> wire.WireResponse:
        return await self.session.post(self.path, body, self.headers)

    def finish(self, item: wire.WireResponse) -> RawResponse:
        """The response as aiohttp would have delivered it: body reads, or the error."""
        status, reads, error = wire.decode(item)
        if error is None and status != 200:
            text = b"".join(chunk for _, chunk in reads)[:300].decode(errors="replace").strip()
            return RawResponse(item.t_send_ns, item.t_end_ns, (), f"HTTP {status}: {text}")
        return RawResponse(item.t_send_ns, item.t_end_ns, reads, error)

    async def open_connections(self, count: int) -> None:
        await self.session.open_connections(count)

    async def close(self) -> None:
        await self.session.close()


class Sender(Protocol[ItemT]):
    """What a shard drives: ``send`` on the hot path, ``finish`` (the item as a :class:`RawResponse`) after it."""

    async def send(self, body: bytes) -> ItemT: ...

    def finish(self, item: ItemT) -> RawResponse: ...

    async def open_connections(self, count: int) -> None: ...

    async def close(self) -> None: ...


def make_sender(
    base_url: str, path: str, headers: dict[str, str], budget: Budget, client: str = "auto"
) -> Sender[Any]:  # each sender's own item type: what its send returns, its finish takes
    """``wire`` for plain ``http://`` (the default: a quarter of aiohttp's CPU per chunk), ``aiohttp`` otherwise."""
    use_wire = client == "wire" or (client == "auto" and base_url.startswith("http://"))
    if use_wire:
        return _WireSender(base_url, path, headers, budget)
    return _AiohttpSender(base_url, path, headers, budget)
