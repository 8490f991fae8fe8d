"""HTTP mode's front door: ``POST /slack/events``, checked at the edge before bolt sees a byte of it.

Anyone who finds the URL can send anything, so the server answers for itself, in this order:

1. **framing** (before the body is read): one ``Content-Length`` of digits, no ``Transfer-Encoding``
   (400), at most :data:`MAX_BODY_BYTES` (413, answered at once and the connection closed: a declared
   64 MB or 10^12 bytes is never read or allocated). ``Expect: 100-continue`` gets the same answer
   instead of a ``100 Continue``;
2. **time**: the request line, headers and body must arrive within :data:`READ_DEADLINE_S`, or the
   connection is cut, with a 408 when the request got far enough to be answered (a slow client cannot
   hold a thread);
3. **signature and timestamp over the raw bytes** (401), before anything is decoded or parsed: an
   unsigned request learns nothing about what we would have made of its body;
4. **shape**: UTF-8, a form or a JSON object, a ``payload`` that is a JSON object (400 with a short
   text).

Only then does bolt get the request; it checks the signature again (a second line), and a signed
payload of types bolt indexes blindly is a one-line warning and a 400 (the app's error handler in
:mod:`bot.slack_app`). Nothing a client
sends produces a traceback or a 500: rejections are one INFO line each (``benchbot -v`` shows them).
Slack's own requests (a slash command, a button press) are a few KB.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

from slack_bolt import App, BoltRequest

from bot.metrics import RECEIVED_AT
from workers.errors import BenchbotError

log = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"
#: Slack's slash commands and interactive payloads stay far below this; anything larger is not Slack.
MAX_BODY_BYTES = 64 * 1024
#: The whole request (line, headers, body) must arrive within this many seconds.
READ_DEADLINE_S = 10.0
#: After refusing a body, at most this much of it is read and thrown away so the refusal arrives intact.
LINGER_BYTES = 1024 * 1024
#: Slack's replay window: a timestamp further than this from our clock is refused.
MAX_CLOCK_SKEW_S = 5 * 60
_DIGITS = re.compile(r"^[0-9]{1,18}$")  # 18 digits: every plausible length, never an absurd integer
_TIMESTAMP = re.compile(r"^[0-9]{1,12}$")


class Rejected(Exception):
    """An answer to send instead of handing the request to bolt."""

    def __init__(self, status: int, text: str, *, close: bool = False) -> None:
        super().__init__(text)
        self.status = status
        self.text = text
        self.close = close


# --------------------------------------------------------------------------- the checks


def declared_length(headers: Any, max_body_bytes: int) -> int:
    """The body length a request declares, or :class:`Rejected` (400 malformed, 413 too large)."""
    if headers.get("Transfer-Encoding") is not None:
        raise Rejected(400, "Transfer-Encoding is not accepted: send the body with a Content-Length", close=True)
    values = headers.get_all("Content-Length") or []
    if not values:
        raise Rejected(400, "a Content-Length header is required", close=True)
    stripped = {v.strip() for v in values}
    if len(stripped) != 1:
        raise Rejected(400, "conflicting Content-Length headers", close=True)
    raw = stripped.pop()
    if not _DIGITS.match(raw):
        raise Rejected(400, "Content-Length must be a non-negative number of bytes", close=True)
    length = int(raw)
    if length > max_body_bytes:
        raise Rejected(413, f"request body too large (limit {max_body_bytes} bytes)", close=True)
    return length


def signature_matches(
    secret: str, raw: bytes, timestamp: str | None, signature: str | None, *, now: float | None = None
) -> bool:
    """Slack's ``v0`` signature: HMAC-SHA256 of ``v0:{timestamp}:{raw body}``, within the replay window.

    Computed over the bytes as received, so nothing is decoded or parsed before it is trusted.
    """
    if not secret or not timestamp or not signature or not _TIMESTAMP.match(timestamp):
        return False
    if abs((time.time() if now is None else now) - int(timestamp)) > MAX_CLOCK_SKEW_S:
        return False
    expected = "v0=" + hmac.new(secret.encode(), b"v0:" + timestamp.encode() + b":" + raw, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace"))


def check_shape(raw: bytes, content_type: str) -> str:
    """The body as text if it is one bolt can parse (a form, a JSON object, a JSON ``payload``)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Rejected(400, "the body is not UTF-8") from None
    if not text:
        return text
    try:
        # bolt reads JSON when told so or when the body starts with "{"; a form otherwise
        if content_type.split(";")[0].strip().lower() == "application/json" or text.startswith("{"):
            if not isinstance(json.loads(text), dict):
                raise Rejected(400, "the JSON body is not an object")
            return text
        fields = dict(parse_qsl(text, keep_blank_values=True, max_num_fields=500))
        if "payload" in fields and not isinstance(json.loads(fields["payload"]), dict):
            raise Rejected(400, "the payload is not a JSON object")
    except (ValueError, RecursionError):  # not JSON, too many fields, nested beyond the parser's depth
        raise Rejected(400, "malformed body: not a form or a JSON object Slack would send") from None
    return text


# --------------------------------------------------------------------------- slow clients


class ReadDeadlines:
    """One thread that cuts the reading side of connections whose request did not arrive in time.

    A socket timeout bounds each ``recv``, not a request: a client trickling a byte every few seconds
    would hold its thread for hours. Shutting the socket's reading side makes the pending read return
    end-of-file at once; the handler then answers 408 (or just closes when nothing usable arrived).
    """

    def __init__(self, tick_s: float = 0.2) -> None:
        self._tick_s = tick_s
        self._lock = threading.Lock()
        self._due: dict[socket.socket, float] = {}
        self._cut: set[socket.socket] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slack-http-deadlines", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def watch(self, conn: socket.socket, seconds: float) -> None:
        """Cut ``conn``'s reading side unless :meth:`forget` is called within ``seconds``."""
        with self._lock:
            self._due[conn] = time.monotonic() + seconds
            self._cut.discard(conn)

    def was_cut(self, conn: socket.socket) -> bool:
        """Whether ``conn``'s reading side was cut (it stays watched)."""
        with self._lock:
            return conn in self._cut

    def forget(self, conn: socket.socket) -> bool:
        """Stop watching ``conn``; True if it had already been cut."""
        with self._lock:
            self._due.pop(conn, None)
            cut = conn in self._cut
            self._cut.discard(conn)
            return cut

    def _run(self) -> None:
        while not self._stop.wait(self._tick_s):
            now = time.monotonic()
            with self._lock:
                late = [conn for conn, due in self._due.items() if due <= now]
                for conn in late:
                    del self._due[conn]
                    self._cut.add(conn)
            for conn in late:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RD)


# --------------------------------------------------------------------------- the server


class _BurstHTTPServer(ThreadingHTTPServer):
    """socketserver's listen backlog is 5: a burst of teammates overflowed it and waited out SYN retries."""

    request_queue_size = 128
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback to stderr for anything a handler raised; what reaches here is a
        # client that vanished mid-request, worth one line, not a traceback.
        exc = sys.exc_info()[1]
        log.info("slack http: connection from %s ended: %s", client_address[0], type(exc).__name__)


class SlackHTTPServer:
    """``POST /slack/events`` served by a threading HTTP server: checked at the edge, then handed to bolt.

    ``signing_secret`` is the app's (``SLACK_SIGNING_SECRET``); HTTP mode cannot run without one.
    """

    def __init__(
        self,
        app: App,
        *,
        signing_secret: str,
        host: str = "127.0.0.1",
        port: int = 3000,
        path: str = EVENTS_PATH,
        max_body_bytes: int = MAX_BODY_BYTES,
        read_deadline_s: float = READ_DEADLINE_S,
    ) -> None:
        if not signing_secret:
            raise BenchbotError("HTTP mode needs SLACK_SIGNING_SECRET (Basic Information > App Credentials)")
        self.app = app
        self.path = path
        self.signing_secret = signing_secret
        self.max_body_bytes = max_body_bytes
        self.read_deadline_s = read_deadline_s
        self.deadlines = ReadDeadlines()
        self._server = _BurstHTTPServer((host, port), self._handler_class())
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        shown = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://{shown}:{self.port}{self.path}"

    def serve_forever(self) -> None:
        self.deadlines.start()
        self._server.serve_forever()

    def start(self) -> SlackHTTPServer:
        """Serve in a background thread."""
        self.deadlines.start()
        self._thread = threading.Thread(target=self._server.serve_forever, name="slack-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.deadlines.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def answer(
        self, path: str, headers: Any, raw: bytes, received_at: float | None = None
    ) -> tuple[int, Mapping[str, object], str]:
        """Steps 3 and 4 and bolt, for a request whose framing passed: (status, headers, body).

        ``received_at`` (``time.monotonic()`` when the request came in) reaches bolt's context, for the
        ack-latency metric (bot/metrics.py)."""
        timestamp = headers.get("X-Slack-Request-Timestamp")
        signature = headers.get("X-Slack-Signature")
        if not signature_matches(self.signing_secret, raw, timestamp, signature):
            raise Rejected(401, "invalid or missing Slack signature")
        text = check_shape(raw, headers.get("Content-Type") or "")
        _, _, query = path.partition("?")
        try:
            request = BoltRequest(
                body=text,
                query=query,
                headers={k.lower(): [v] for k, v in headers.items()},
                context={RECEIVED_AT: received_at} if received_at is not None else None,
            )
        except Exception as exc:  # bolt's own parsing of a shape we let through (types it did not expect)
            raise Rejected(400, "malformed Slack request") from exc
        response = self.app.dispatch(request)
        return response.status, response.headers, response.body

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = server.read_deadline_s + 5  # per recv: a backstop behind the whole-request deadline

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("http: %s", format % args)

            def handle_one_request(self) -> None:
                server.deadlines.watch(self.connection, server.read_deadline_s)
                try:
                    super().handle_one_request()
                finally:
                    server.deadlines.forget(self.connection)

            def handle_expect_100(self) -> bool:
                # No "100 Continue" for a body we would refuse: answer now, read nothing.
                if self.command == "POST":
                    try:
                        self._framing()
                    except Rejected as rejected:
                        self._reject(rejected)
                        return False
                return super().handle_expect_100()

            def _send(
                self, status: int, headers: Mapping[str, object], body: str | bytes, *, close: bool = False
            ) -> None:
                payload = body.encode() if isinstance(body, str) else body
                self.send_response(status)
                for key, values in headers.items():
                    for value in values if isinstance(values, list | tuple) else [values]:
                        if key.lower() not in ("content-length", "connection"):
                            self.send_header(key, str(value))
                self.send_header("Content-Length", str(len(payload)))
                if close:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                self.wfile.write(payload)

            def _reject(self, rejected: Rejected) -> None:
                log.info(
                    "slack http: %d for %s %s from %s: %s",
                    rejected.status,
                    self.command,
                    self.path.partition("?")[0][:100],
                    self.client_address[0],
                    rejected.text,
                )
                with contextlib.suppress(OSError):
                    self._send(
                        rejected.status,
                        {"Content-Type": "text/plain; charset=utf-8"},
                        rejected.text + "\n",
                        close=rejected.close,
                    )
                self.close_connection = self.close_connection or rejected.close
                if rejected.close:
                    self._linger()

            def _linger(self) -> None:
                # Closing with unread input makes the kernel send a reset, which can destroy our answer
                # before the client reads it. Say we are done writing, then discard a little of what the
                # client is still sending (bounded in bytes and time) before the socket closes.
                with contextlib.suppress(OSError):
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_WR)
                    self.connection.settimeout(0.25)
                    drained, until = 0, time.monotonic() + 1.0
                    while drained < LINGER_BYTES and time.monotonic() < until:
                        chunk = self.connection.recv(65536)
                        if not chunk:
                            break
                        drained += len(chunk)

            def _framing(self) -> int:
                if self.path.partition("?")[0] != server.path:
                    raise Rejected(404, "not found", close=True)
                return declared_length(self.headers, server.max_body_bytes)

            def _read_body(self, length: int) -> bytes:
                chunks: list[bytes] = []
                left = length
                try:
                    while left > 0:
                        chunk = self.rfile.read(min(left, 16384))
                        if not chunk:
                            break
                        chunks.append(chunk)
                        left -= len(chunk)
                except TimeoutError:
                    pass
                cut = server.deadlines.forget(self.connection)
                if left > 0:
                    if cut:
                        raise Rejected(408, "the request did not arrive in time", close=True)
                    raise Rejected(400, "the body is shorter than its Content-Length", close=True)
                return b"".join(chunks)

            def do_GET(self) -> None:
                server.deadlines.forget(self.connection)
                if self.path.partition("?")[0] == "/health":
                    self._send(200, {"Content-Type": "text/plain"}, "ok")
                else:
                    self._send(404, {}, "")

            def do_POST(self) -> None:
                received_at = time.monotonic()
                try:
                    if server.deadlines.was_cut(self.connection):  # mid-headers: what came is not all
                        raise Rejected(408, "the request did not arrive in time", close=True)
                    raw = self._read_body(self._framing())
                    status, headers, body = server.answer(self.path, self.headers, raw, received_at)
                except Rejected as rejected:
                    if rejected.__cause__ is not None:
                        log.info(
                            "slack http: bolt could not parse a signed request (%s)", type(rejected.__cause__).__name__
                        )
                    self._reject(rejected)
                    return
                self._send(status, headers, body)

        return Handler
