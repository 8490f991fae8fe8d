"""A minimal HTTP/1.1 client for the streaming hot path: one asyncio Protocol, nothing per chunk but a stamp.

Why not aiohttp here: aiohttp + uvloop spends ~18-33 µs of CPU per streamed chunk (its parser feeds a
StreamReader, which wakes the reading coroutine once per chunk: a Future, a task step, a generator
resume). At 256 streams x 100 tok/s that is most of a core, and a busy client delays timestamps
(docs/metrics.md, "Client accuracy"). Here ``data_received`` is the only Python that runs per read:
it stamps ``perf_counter_ns()``, keeps the bytes, and advances a small framing state machine just far
enough to know when the response ends; the coroutine that sent the request wakes once, at the end.
Headers, chunked framing and SSE are decoded after the level (:func:`decode`), off the hot path.

Scope, on purpose: plain ``http://`` (engines on a private network; ``https`` goes through aiohttp),
``POST`` with a JSON body, responses framed by ``Transfer-Encoding: chunked``, ``Content-Length`` or
connection close. Keep-alive connections are reused per caller; a reused connection the server had
closed (uvicorn drops idle keep-alive after 5 s) is retried once on a fresh one if not a byte came back.

Every response is bounded (``workers.benchmark.limits``): its bytes, its head, a chunk-size line and a
body line, each a counter compared per read; its time to a complete head and its silences, read by one
watchdog task per session (a tick, not a timer per chunk). A response past a bound is cut: its
connection is closed at once (so nothing more is buffered) and the request ends with an error that
names the option to change.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from workers.benchmark.limits import CHUNK_LINE_BYTES, DEFAULT_LIMITS, Budget

_Read = tuple[int, bytes]
_HEADER_END = b"\r\n\r\n"


@dataclass(frozen=True)
class WireResponse:
    """What the hot path keeps: send and end stamps, every read as it arrived (headers and framing
    included), and a transport-level error (refused, reset, timed out) when there was one."""

    t_send_ns: int
    t_end_ns: int
    reads: tuple[_Read, ...]
    error: str | None = None


class _Conn(asyncio.Protocol):
    """One connection; :meth:`start` arms it for the next response."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reads: list[_Read] = []
        self.done: asyncio.Future[bool] | None = None
        self.keep_alive = True
        self.failure: str | None = None  # why the response could not be read (bad framing, a bound)
        self.budget: Budget = _DEFAULT_BUDGET
        self.t_send_ns = 0
        self.t_last_ns = 0  # the last read's stamp (the watchdog's silence clock)
        self._got = 0  # bytes of this response so far
        self._run = 0  # body bytes since the last newline
        # framing state of the response being read
        self._head = b""
        self._in_body = False
        self._mode = ""  # chunked | length | close
        self._left = 0  # bytes left in the current chunk's data (+2 for its CRLF), or of the body
        self._line = b""  # a partial chunk-size line
        self._trailer = False

    def start(self, done: asyncio.Future[bool], budget: Budget, t_send_ns: int) -> None:
        self.failure = None
        self.reads = []
        self.done = done
        self.budget = budget
        self.t_send_ns = self.t_last_ns = t_send_ns
        self._got = 0
        self._run = 0
        self._head = b""
        self._in_body = False
        self._line = b""
        self._trailer = False

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.done is None or self.done.done():
            return  # nothing asked for (an idle keep-alive connection), or already ended or cut
        t = time.perf_counter_ns()
        self.reads.append((t, data))
        self.t_last_ns = t
        self._got += len(data)
        if self._got > self.budget.max_bytes:
            self.cut(self.budget.too_big())
            return
        if not self._in_body:
            self._head += data
            end = self._head.find(_HEADER_END)
            if end < 0 or end > self.budget.header_bytes:
                if len(self._head) > self.budget.header_bytes:
                    self.cut(self.budget.head_too_big())
                return
            body = self._head[end + 4 :]
            self._headers(self._head[:end])
            self._in_body = True
            if self.failure is not None:
                return
            if not body:
                if self._mode == "length" and self._left == 0:
                    self._finish(True)
                return
            data = body
        if self._mode == "chunked":
            self._chunks(data)
        else:
            self._body(data, 0, len(data))
            if self._mode == "length":
                self._left -= len(data)
                if self._left <= 0:
                    self._finish(True)

    def _body(self, data: bytes, lo: int, hi: int) -> None:
        """Count body bytes since the last newline: ``rfind`` finds an SSE event's final newline at once."""
        nl = data.rfind(b"\n", lo, hi)
        self._run = self._run + (hi - lo) if nl < 0 else hi - nl - 1
        if self._run > self.budget.line_bytes:
            self.cut(self.budget.line_too_long())

    def cut(self, why: str) -> None:
        """End this response for ``why`` and close the connection: nothing more is read or kept."""
        if self.done is None or self.done.done():
            return
        self.failure = why
        self.keep_alive = False
        self._finish(False)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            # a close-delimited body ends here; anything else was cut short
            self.done.set_result(self._in_body and self._mode == "close")

    # -- framing
    def _headers(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version = lines[0][:8]
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip().lower()
        connection = fields.get(b"connection", b"")
        if version == b"HTTP/1.1":
            self.keep_alive = b"close" not in connection
        else:
            self.keep_alive = b"keep-alive" in connection
        encoding = fields.get(b"content-encoding", b"identity")
        if encoding not in (b"identity", b""):  # asked identity: nothing here decodes, nothing unasked is kept
            self.cut(f"the stream came {encoding[:40].decode('latin-1')}-encoded, unasked")
            return
        if b"chunked" in fields.get(b"transfer-encoding", b""):
            self._mode, self._left = "chunked", 0
        elif b"content-length" in fields:
            try:
                self._mode, self._left = "length", int(fields[b"content-length"] or b"0")
            except ValueError:
                self.cut(self.budget.bad_framing(f"Content-Length {fields[b'content-length'][:40]!r}"))
                return
            if self._left > self.budget.max_bytes:
                self.cut(self.budget.announced_too_big(self._left))
                return
        else:
            self._mode = "close"
            self.keep_alive = False
        status = lines[0][9:12]
        if status in (b"204", b"304") or lines[0].startswith(b"HTTP/1.1 1"):
            self._mode, self._left = "length", 0

    def _chunks(self, data: bytes) -> None:
        pos, n = 0, len(data)
        while pos < n:
            if self._left:
                take = min(self._left, n - pos)
                data_bytes = min(take, self._left - 2)  # the chunk's data, without its closing CRLF
                if data_bytes > 0:
                    self._body(data, pos, pos + data_bytes)
                    if self.failure is not None:
                        return
                self._left -= take
                pos += take
                continue
            end = data.find(b"\r\n", pos)
            if end < 0:
                self._line += data[pos:]
                longest = self.budget.header_bytes if self._trailer else CHUNK_LINE_BYTES
                if len(self._line) > longest:
                    self.cut(self.budget.chunk_line_too_long())
                return
            line = self._line + data[pos:end]
            self._line = b""
            pos = end + 2
            if self._trailer:
                if not line:  # the blank line after the last chunk (and any trailers)
                    self._finish(True)
                    return
                continue
            if len(line) > CHUNK_LINE_BYTES:
                self.cut(self.budget.chunk_line_too_long())
                return
            try:
                size = int(line.split(b";", 1)[0] or b"0", 16)
            except ValueError:  # not chunked framing: give up on this response (and connection)
                self.cut(f"bad chunked framing: {line[:40]!r} (framing)")
                return
            if size > self.budget.max_bytes - self._got:
                self.cut(self.budget.announced_too_big(size, self._got))
                return
            if size == 0:
                self._trailer = True
            else:
                self._left = size + 2

    def _finish(self, ok: bool) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(ok)


_DEFAULT_BUDGET = DEFAULT_LIMITS.budget(0)


class WireSession:
    """Requests to one ``http://host:port``: a pool of keep-alive connections, one in use per request.

    ``budget`` bounds every response (see the module docstring); a ``timeout_s`` given to :meth:`post`
    overrides its whole-request deadline.
    """

    def __init__(self, base_url: str, budget: Budget | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the wire client speaks plain http:// only, not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.budget = budget or _DEFAULT_BUDGET
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()
        self._busy: set[_Conn] = set()  # connections with a response in flight (the watchdog's)
        self._watchdog: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        """Cut a response whose head is late or that went silent: one pass over the busy connections
        per tick, so the hot path pays nothing for the clocks but its read stamps."""
        budget = self.budget
        first_ns, idle_ns = int(budget.first_byte_s * 1e9), int(budget.idle_s * 1e9)
        tick = min(1.0, max(0.02, min(budget.first_byte_s, budget.idle_s) / 4))
        clock = time.perf_counter_ns
        while True:
            await asyncio.sleep(tick)
            now = clock()
            for conn in list(self._busy):
                if not conn._in_body and now - conn.t_send_ns > first_ns:
                    conn.cut(budget.no_first_byte())
                elif conn.reads and now - conn.t_last_ns > idle_ns:
                    conn.cut(budget.silent())

    async def _open(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Conn, self.host, self.port)
        self._all.add(conn)
        return conn

    def _request(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        lines = [f"POST {self.prefix}{path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() != "accept-encoding"]
        lines += ["Accept-Encoding: identity", f"Content-Length: {len(body)}"]  # never a compressed stream
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    async def open_connections(self, count: int) -> None:
        """Have ``count`` idle connections ready before timing starts (TCP handshakes off the clock)."""
        while len(self._idle) < count:
            try:
                self._idle.append(await self._open())
            except OSError:
                return

    async def post(
        self, path: str, body: bytes, headers: dict[str, str], timeout_s: float | None = None
    ) -> WireResponse:
        """Send one request and wait for its whole response; errors are returned, never raised."""
        request = self._request(path, body, headers)
        clock = time.perf_counter_ns
        loop = asyncio.get_running_loop()
        budget = self.budget
        timeout_s = budget.timeout_s if timeout_s is None else timeout_s
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = loop.create_task(self._watch())
        for attempt in (1, 2):
            conn = self._take_idle()
            reused = conn is not None
            t_send = clock()
            if conn is None:
                try:
                    async with asyncio.timeout(min(timeout_s, budget.first_byte_s)):  # a server that never accepts
                        conn = await self._open()
                except TimeoutError:  # (before OSError: TimeoutError is one)
                    return WireResponse(t_send, clock(), (), budget.no_first_byte())
                except OSError as exc:
                    return WireResponse(t_send, clock(), (), f"{type(exc).__name__}: {exc}")
            done: asyncio.Future[bool] = loop.create_future()
            conn.start(done, budget, t_send)
            assert conn.transport is not None
            conn.transport.write(request)
            self._busy.add(conn)
            try:
                async with asyncio.timeout(timeout_s):
                    ok = await done
            except TimeoutError:
                self._drop(conn)
                why = f"timed out after {timeout_s:g} s (timeout={timeout_s:g}s)"
                return WireResponse(t_send, clock(), tuple(conn.reads), why)
            except asyncio.CancelledError:
                self._drop(conn)
                raise
            finally:
                self._busy.discard(conn)
            t_end = conn.reads[-1][0] if conn.reads else clock()
            if ok:
                if conn.keep_alive and not conn.closed:
                    self._idle.append(conn)
                else:
                    self._drop(conn)
                return WireResponse(t_send, t_end, tuple(conn.reads))
            self._drop(conn)
            if reused and not conn.reads and conn.failure is None and attempt == 1:
                continue  # the server had closed this idle keep-alive connection: once more, fresh
            why = conn.failure or "ServerDisconnectedError: server closed the connection before the response ended"
            return WireResponse(t_send, t_end, tuple(conn.reads), why)
        raise AssertionError("unreachable")

    def _take_idle(self) -> _Conn | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
            self._drop(conn)
        return None

    def _drop(self, conn: _Conn) -> None:
        self._all.discard(conn)
        if conn.transport is not None:
            conn.transport.close()

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        for conn in list(self._all):
            self._drop(conn)
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks


def decode(response: WireResponse) -> tuple[int | None, tuple[_Read, ...], str | None]:
    """After the level: ``(status, body reads, error)``, each body read stamped with the time the read
    that carried it arrived; chunked framing and headers removed, as aiohttp would have delivered it."""
    if not response.reads:
        return None, (), response.error
    data = b"".join(chunk for _, chunk in response.reads)
    end = data.find(_HEADER_END)
    if end < 0:
        return None, (), response.error or "no complete response headers"
    head = data[:end].split(b"\r\n")
    try:
        status = int(head[0].split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None, (), f"not an HTTP response: {head[0][:80]!r}"
    chunked = any(line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower() for line in head[1:])
    # where each read starts in ``data``, to stamp the body bytes with their read's arrival
    starts, offset = [], 0
    for t, chunk in response.reads:
        starts.append((offset, t))
        offset += len(chunk)
    body_spans: list[tuple[int, int]] = []  # [start, stop) of body bytes in ``data``
    pos = end + 4
    if chunked:
        while pos < len(data):
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                break
            try:
                size = int(data[pos:eol].split(b";", 1)[0] or b"0", 16)
            except ValueError:
                return status, (), response.error or f"bad chunked framing: {data[pos:eol][:40]!r}"
            if size == 0:
                break
            body_spans.append((eol + 2, min(eol + 2 + size, len(data))))
            pos = eol + 2 + size + 2
    else:
        body_spans.append((pos, len(data)))
    out: list[_Read] = []
    k = 0
    for lo, hi in body_spans:
        while lo < hi:
            while k + 1 < len(starts) and starts[k + 1][0] <= lo:
                k += 1
            stop = min(hi, starts[k + 1][0]) if k + 1 < len(starts) else hi
            if out and out[-1][0] == starts[k][1]:
                out[-1] = (out[-1][0], out[-1][1] + data[lo:stop])
            else:
                out.append((starts[k][1], data[lo:stop]))
            lo = stop
    return status, tuple(out), response.error
