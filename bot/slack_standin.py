"""A local stand-in for Slack: the Web API over HTTP and a Socket Mode WebSocket, both on 127.0.0.1.

Slack itself cannot be reached from tests, and mocking ``slack_sdk`` would test nothing of the wire.
So the real ``WebClient`` (pointed here with ``base_url``), the real ``files_upload_v2`` three-step
upload and the real bolt ``SocketModeHandler`` talk to these servers, which keep a record of every
call and of the messages they produced (headers, edits, thread replies, files), and can be told to
answer ``429`` (with ``Retry-After``) or ``500`` for the next calls of a method.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import WSMsgType, web

UPLOAD = "upload"  # pseudo method name of the raw upload POST (step 2 of files_upload_v2)
WEBHOOK = "webhook"  # pseudo method name of response_url posts


@dataclass
class Call:
    """One request the stand-in received."""

    method: str  # "chat.postMessage", ..., or UPLOAD / WEBHOOK
    path: str
    body: dict[str, Any]
    raw: bytes
    status: int = 200
    at: float = field(default_factory=time.monotonic)

    def json_field(self, key: str) -> Any:
        """A field that the SDK sends as a JSON string in form posts (``blocks``, ``files``)."""
        value = self.body.get(key)
        return json.loads(value) if isinstance(value, str) else value


@dataclass
class Message:
    """A message as Slack would now show it, with the history of its edits."""

    channel: str
    ts: str
    text: str
    blocks: list[dict[str, Any]]
    thread_ts: str | None = None
    edits: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class UploadedFile:
    """A file that went through getUploadURLExternal, the upload POST and completeUploadExternal."""

    id: str
    filename: str
    length: int
    data: bytes = b""
    title: str | None = None
    channel: str | None = None
    thread_ts: str | None = None
    completed: bool = False
    order: int = 0


class SlackStandIn:
    """The Web API stand-in. ``base_url`` goes to ``WebClient(base_url=...)``."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.messages: dict[tuple[str, str], Message] = {}
        self.files: dict[str, UploadedFile] = {}
        self.socket_mode_url: str | None = None
        self._failures: dict[str, list[tuple[int, float | None]]] = {}
        self._lock = threading.Lock()
        self._order = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    def webhook_url(self, name: str = "") -> str:
        """A ``response_url`` that lands here."""
        return f"http://127.0.0.1:{self.port}/webhook/{name or uuid.uuid4().hex[:8]}"

    def start(self) -> SlackStandIn:
        self._thread = threading.Thread(target=self._server.serve_forever, name="slack-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, in bounded time: ``socketserver``'s ``shutdown()`` waits without a deadline for the
        serving loop, and a test's teardown must never hang on it (it did once, on a loaded box)."""
        stopper = threading.Thread(target=self._server.shutdown, name="slack-standin-stop", daemon=True)
        stopper.start()
        stopper.join(timeout=5)
        self._server.server_close()
        if self._thread:
            self._thread.join(timeout=5)

    def __enter__(self) -> SlackStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ test controls

    def fail_next(self, method: str, count: int = 1, *, status: int = 429, retry_after: float | None = 1) -> None:
        """Answer the next ``count`` calls of ``method`` with ``status`` (429 carries Retry-After)."""
        with self._lock:
            self._failures.setdefault(method, []).extend([(status, retry_after)] * count)

    def clear_failures(self) -> None:
        """Answer every method normally again."""
        with self._lock:
            self._failures.clear()

    def calls_to(self, method: str, *, ok_only: bool = True) -> list[Call]:
        """Calls of one method, in arrival order (by default only those answered 200)."""
        with self._lock:
            return [c for c in self.calls if c.method == method and (c.status == 200 or not ok_only)]

    def thread(self, channel: str, ts: str) -> list[Message | UploadedFile]:
        """Replies in the thread of (channel, ts), in the order Slack accepted them."""
        with self._lock:
            items: list[tuple[int, Message | UploadedFile]] = []
            for msg in self.messages.values():
                if msg.channel == channel and msg.thread_ts == ts and msg.ts != ts:
                    items.append((int(msg.ts.split(".")[1]), msg))
            for f in self.files.values():
                if f.completed and f.channel == channel and f.thread_ts == ts:
                    items.append((f.order, f))
            return [item for _, item in sorted(items, key=lambda pair: pair[0])]

    def top_level(self, channel: str | None = None) -> list[Message]:
        """Messages that are not thread replies (job headers, in-channel answers)."""
        with self._lock:
            return [
                m for m in self.messages.values() if m.thread_ts is None and (channel is None or m.channel == channel)
            ]

    # ------------------------------------------------------------------ API behaviour

    def _next_ts(self) -> str:
        # one counter orders messages and files alike, so thread() can interleave them
        order = next(self._order)
        return f"{1_700_000_000 + order}.{order:06d}"

    def _answer(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        if method == "auth.test":
            return {
                "ok": True,
                "url": "https://standin.slack.test/",
                "team": "Stand-in",
                "user": "benchbot",
                "team_id": "T0STANDIN",
                "user_id": "U0BENCHBOT",
                "bot_id": "B0BENCHBOT",
            }
        if method == "chat.postMessage":
            return self._post(body)
        if method == "chat.update":
            return self._update(body)
        if method == "chat.postEphemeral":
            return {"ok": True, "message_ts": self._next_ts()}
        if method == "files.getUploadURLExternal":
            file_id = "F" + uuid.uuid4().hex[:10].upper()
            self.files[file_id] = UploadedFile(
                id=file_id, filename=str(body.get("filename", "")), length=int(body.get("length", 0))
            )
            return {"ok": True, "upload_url": f"http://127.0.0.1:{self.port}/upload/{file_id}", "file_id": file_id}
        if method == "files.completeUploadExternal":
            return self._complete(body)
        if method == "apps.connections.open":
            if not self.socket_mode_url:
                return {"ok": False, "error": "socket_mode_not_enabled"}
            return {"ok": True, "url": self.socket_mode_url}
        return {"ok": True}

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        channel = str(body.get("channel", ""))
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        thread_ts = body.get("thread_ts") or None
        if thread_ts and (channel, thread_ts) not in self.messages:
            return {"ok": False, "error": "thread_not_found"}
        ts = self._next_ts()
        blocks = _maybe_json(body.get("blocks")) or []
        self.messages[(channel, ts)] = Message(
            channel=channel, ts=ts, text=str(body.get("text", "")), blocks=blocks, thread_ts=thread_ts
        )
        return {"ok": True, "channel": channel, "ts": ts, "message": {"text": body.get("text", ""), "ts": ts}}

    def _update(self, body: dict[str, Any]) -> dict[str, Any]:
        key = (str(body.get("channel", "")), str(body.get("ts", "")))
        msg = self.messages.get(key)
        if msg is None:
            return {"ok": False, "error": "message_not_found"}
        msg.edits.append({"text": msg.text, "blocks": msg.blocks})
        msg.text = str(body.get("text", ""))
        msg.blocks = _maybe_json(body.get("blocks")) or []
        return {"ok": True, "channel": key[0], "ts": key[1], "text": msg.text}

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        entries = _maybe_json(body.get("files")) or []
        channel = body.get("channel_id") or None
        thread_ts = body.get("thread_ts") or None
        done = []
        for entry in entries:
            f = self.files.get(str(entry.get("id")))
            if f is None or len(f.data) != f.length:
                return {"ok": False, "error": "file_not_found"}
            done.append(f)
        if thread_ts and channel and (channel, thread_ts) not in self.messages:
            return {"ok": False, "error": "thread_not_found"}
        for f, entry in zip(done, entries, strict=True):
            f.title = entry.get("title")
            f.channel, f.thread_ts, f.completed = channel, thread_ts, True
            f.order = next(self._order)
        return {"ok": True, "files": [{"id": f.id, "name": f.filename, "title": f.title} for f in done]}

    def _pop_failure(self, method: str) -> tuple[int, float | None] | None:
        queue = self._failures.get(method)
        return queue.pop(0) if queue else None

    def _handle(self, path: str, headers: Any, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        if path.startswith("/api/"):
            method = path[len("/api/") :].split("?")[0]
        elif path.startswith("/upload/"):
            method = UPLOAD
        elif path.startswith("/webhook/"):
            method = WEBHOOK
        else:
            return 404, {}, b"not found"
        body = _parse_body(headers.get("Content-Type", ""), raw) if method != UPLOAD else {}
        with self._lock:
            failure = self._pop_failure(method)
            call = Call(method=method, path=path, body=body, raw=raw)
            self.calls.append(call)
            if failure:
                status, retry_after = failure
                call.status = status
                extra = {"Retry-After": _fmt_seconds(retry_after)} if status == 429 and retry_after else {}
                error = "ratelimited" if status == 429 else "internal_error"
                return (
                    status,
                    {"Content-Type": "application/json", **extra},
                    json.dumps({"ok": False, "error": error}).encode(),
                )
            if method == UPLOAD:
                file_id = path.rsplit("/", 1)[-1]
                f = self.files.get(file_id)
                if f is None:
                    call.status = 404
                    return 404, {}, b"no such upload"
                f.data = raw
                return 200, {"Content-Type": "text/plain"}, f"OK - {len(raw)}".encode()
            if method == WEBHOOK:
                return 200, {"Content-Type": "text/plain"}, b"ok"
            auth = headers.get("Authorization", "")
            if not auth.startswith(("Bearer xox", "Bearer xapp-")):
                answer: dict[str, Any] = {"ok": False, "error": "not_authed"}
            else:
                answer = self._answer(method, body)
            return 200, {"Content-Type": "application/json"}, json.dumps(answer).encode()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet: the record is in .calls
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                status, headers, payload = standin._handle(self.path, self.headers, raw)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST

        return Handler


def _fmt_seconds(value: float | None) -> str:
    if value is None:
        return "1"
    return str(int(value)) if float(value).is_integer() else str(value)


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _parse_body(content_type: str, raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    text = raw.decode("utf-8", "replace")
    if "json" in content_type:
        try:
            data = json.loads(text)
        except ValueError:
            return {"_raw": text}
        return data if isinstance(data, dict) else {"_json": data}
    return dict(parse_qsl(text, keep_blank_values=True))


# ---------------------------------------------------------------------------------- Socket Mode


class SocketModeStandIn:
    """An aiohttp WebSocket server that plays Slack's side of Socket Mode.

    It greets each connection with ``hello``, lets a test push envelopes (``push``) and records the
    client's acks by ``envelope_id``.
    """

    def __init__(self) -> None:
        self.acks: dict[str, dict[str, Any]] = {}
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

    def push(self, envelope_type: str, payload: dict[str, Any], *, retry_attempt: int = 0) -> str:
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

    def wait_ack(self, envelope_id: str, timeout: float = 10.0) -> dict[str, Any]:
        _poll(lambda: envelope_id in self.acks, timeout, f"the ack of envelope {envelope_id}")
        return self.acks[envelope_id]


def _poll(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


# ---------------------------------------------------------------------------------- the harness

BOT_TOKEN = "xoxb-1111-2222-standintoken"
APP_TOKEN = "xapp-1-A0STANDIN-3333-standinapptoken"
SIGNING_SECRET = "standin-signing-secret-4f1c2a"


def signed_headers(
    body: str,
    *,
    secret: str = SIGNING_SECRET,
    timestamp: int | None = None,
    content_type: str = "application/x-www-form-urlencoded",
) -> dict[str, str]:
    """The headers Slack sends: ``v0=`` HMAC-SHA256 over ``v0:{ts}:{body}``."""
    from slack_sdk.signature import SignatureVerifier

    ts = str(int(time.time()) if timestamp is None else timestamp)
    signature = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body) or ""
    return {"Content-Type": content_type, "X-Slack-Request-Timestamp": ts, "X-Slack-Signature": signature}


@dataclass
class HttpAnswer:
    """What the app answered, and how long it took."""

    status: int
    body: str
    elapsed_s: float


class SlackHarness:
    """The real Slack front end on 127.0.0.1: stand-in + bolt app over HTTP + notifier.

    ``with SlackHarness(config, redis_url, tmp_path) as h: h.command("/launch", "cutlass")`` sends a
    signed slash command the way Slack does; ``h.standin`` holds what the app and notifier posted.
    """

    def __init__(
        self,
        config: Any,
        redis_url: str,
        work_dir: Any,
        *,
        notifier: bool = True,
        default_channel: str | None = None,
        progress_interval_s: float = 0.2,
        thread_wait_s: float = 2.0,
        **server_options: Any,
    ) -> None:
        self.config = config
        self.server_options = server_options  # SlackHTTPServer's max_body_bytes, read_deadline_s
        self.redis_url = redis_url
        self.work_dir = work_dir
        self.with_notifier = notifier
        self.default_channel = default_channel
        self.progress_interval_s = progress_interval_s
        self.thread_wait_s = thread_wait_s
        self.standin = SlackStandIn()
        self.notifier: Any = None
        self.server: Any = None
        self.app: Any = None
        self._redis: Any = None

    def __enter__(self) -> SlackHarness:
        from bot.notifier import Notifier
        from bot.slack_app import SlackHTTPServer, build_app, make_client
        from workers import redis_conn

        self.standin.start()
        try:
            self._redis = redis_conn.connect(self.redis_url)
            plots = self.work_dir / "plots"
            self.app = build_app(
                self.config,
                self._redis,
                token=BOT_TOKEN,
                signing_secret=SIGNING_SECRET,
                api_url=self.standin.base_url,
                plots_dir=plots,
            )
            self.server = SlackHTTPServer(
                self.app, signing_secret=SIGNING_SECRET, host="127.0.0.1", port=0, **self.server_options
            ).start()
            if self.with_notifier:
                self.notifier = Notifier(
                    self._redis,
                    make_client(BOT_TOKEN, self.standin.base_url),
                    consumer="harness-notifier",
                    default_channel=self.default_channel,
                    plots_dir=plots,
                    progress_interval_s=self.progress_interval_s,
                    thread_wait_s=self.thread_wait_s,
                    block_ms=100,
                )
                self.notifier.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.notifier is not None:
            self.notifier.stop()
        if self.server is not None:
            self.server.stop()
        if self.app is not None:
            executor = getattr(self.app, "_listener_runner", None)
            executor = getattr(executor, "listener_executor", None)
            if executor is not None:
                executor.shutdown(wait=True)
        self.standin.stop()
        if self._redis is not None:
            self._redis.close()

    # ------------------------------------------------------------------ requests as Slack sends them

    def post(self, body: str, headers: dict[str, str]) -> HttpAnswer:
        import urllib.error
        import urllib.request

        request = urllib.request.Request(self.server.url, data=body.encode(), headers=headers, method="POST")
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return HttpAnswer(resp.status, resp.read().decode(), time.monotonic() - started)
        except urllib.error.HTTPError as exc:
            return HttpAnswer(exc.code, exc.read().decode(), time.monotonic() - started)

    def command_body(
        self,
        command: str,
        text: str = "",
        *,
        user: str = "alice",
        channel: str = "C0TEAM",
        trigger_id: str | None = None,
        response_url: str | None = None,
    ) -> str:
        from urllib.parse import urlencode

        return urlencode(
            {
                "token": "legacy-verification-token",
                "team_id": "T0STANDIN",
                "team_domain": "standin",
                "channel_id": channel,
                "channel_name": "gpu-team",
                "user_id": user,
                "user_name": user,
                "command": command,
                "text": text,
                "api_app_id": "A0STANDIN",
                "response_url": response_url or self.standin.webhook_url(),
                "trigger_id": trigger_id or f"{uuid.uuid4().int % 10**12}.1.{uuid.uuid4().hex[:8]}",
            }
        )

    def command(self, command: str, text: str = "", **kwargs: Any) -> HttpAnswer:
        """A signed slash command, as Slack would POST it."""
        retry = kwargs.pop("retry_num", None)
        body = self.command_body(command, text, **kwargs)
        headers = signed_headers(body)
        if retry is not None:
            headers.update({"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"})
        return self.post(body, headers)

    def click(
        self,
        action_id: str,
        value: str,
        *,
        user: str = "alice",
        channel: str = "C0TEAM",
        message_ts: str = "",
        thread_ts: str | None = None,
        trigger_id: str | None = None,
    ) -> HttpAnswer:
        """A signed block_actions payload for one button press."""
        from urllib.parse import urlencode

        message: dict[str, Any] = {"type": "message", "ts": message_ts, "text": "header"}
        if thread_ts:
            message["thread_ts"] = thread_ts
        payload = {
            "type": "block_actions",
            "api_app_id": "A0STANDIN",
            "token": "legacy-verification-token",
            "team": {"id": "T0STANDIN", "domain": "standin"},
            "user": {"id": user, "username": user, "team_id": "T0STANDIN"},
            "container": {"type": "message", "message_ts": message_ts, "channel_id": channel, "is_ephemeral": False},
            "trigger_id": trigger_id or f"{uuid.uuid4().int % 10**12}.1.{uuid.uuid4().hex[:8]}",
            "channel": {"id": channel, "name": "gpu-team"},
            "message": message,
            "response_url": self.standin.webhook_url(),
            "actions": [
                {
                    "action_id": action_id,
                    "block_id": "b1",
                    "value": value,
                    "type": "button",
                    "action_ts": f"{time.time():.6f}",
                    "text": {"type": "plain_text", "text": action_id},
                }
            ],
        }
        body = urlencode({"payload": json.dumps(payload)})
        return self.post(body, signed_headers(body))

    def webhooks(self) -> list[Call]:
        """What the app sent through response_url, oldest first."""
        return self.standin.calls_to(WEBHOOK)
