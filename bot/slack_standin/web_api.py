"""The Slack Web API stand-in: an HTTP server on 127.0.0.1 that answers like Slack and records every call.

The real ``WebClient`` (pointed here with ``base_url``) and the real ``files_upload_v2`` three-step upload
talk to it; it keeps the messages they produced (headers, edits, thread replies, files) and can be told to
answer ``429`` (with ``Retry-After``) or ``500`` for the next calls of a method.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

#: A body as Slack's wire carries it (form fields or JSON): the untyped edge this stand-in answers.
SlackJson = dict[str, Any]

UPLOAD = "upload"  # pseudo method name of the raw upload POST (step 2 of files_upload_v2)
WEBHOOK = "webhook"  # pseudo method name of response_url posts


@dataclass
class Call:
    """One request the stand-in received."""

    method: str  # "chat.postMessage", ..., or UPLOAD / WEBHOOK
    path: str
    body: SlackJson
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
    blocks: list[SlackJson]
    thread_ts: str | None = None
    edits: list[SlackJson] = field(default_factory=list)
    user: str | None = None  # a person's message (:meth:`SlackStandIn.user_message`); None: the bot posted it


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
        #: DM channels the bot opened with a person (``conversations.open``); other DMs it cannot post in
        self.ims: set[str] = set()
        #: the Home view last published for each user (``views.publish``)
        self.views: dict[str, dict[str, object]] = {}
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

    def user_message(self, channel: str, user: str, text: str, thread_ts: str | None = None) -> str:
        """A person writes in the channel (or a thread): recorded as Slack would show it; returns its ts."""
        with self._lock:
            ts = self._next_ts()
            self.messages[(channel, ts)] = Message(channel, ts, text, [], thread_ts=thread_ts, user=user)
            return ts

    def bot_messages(self) -> list[Message]:
        """What the bot posted, in order (to hand back to the app as the message events Slack sends)."""
        with self._lock:
            return sorted((m for m in self.messages.values() if m.user is None), key=lambda m: int(m.ts.split(".")[1]))

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

    def _answer(self, method: str, body: SlackJson) -> SlackJson:
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
        if method == "conversations.open":
            users = str(body.get("users") or "")
            if not users or "," in users:
                return {"ok": False, "error": "invalid_arguments"}
            self.ims.add(f"D0BOT{users.upper()}")
            return {"ok": True, "channel": {"id": f"D0BOT{users.upper()}"}}
        if method == "views.publish":
            view = _maybe_json(body.get("view"))
            if not body.get("user_id") or not isinstance(view, dict) or view.get("type") != "home":
                return {"ok": False, "error": "invalid_arguments"}
            if len(view.get("blocks") or []) > 100:
                return {"ok": False, "error": "invalid_blocks"}
            self.views[str(body["user_id"])] = view
            return {"ok": True, "view": {"id": "V" + uuid.uuid4().hex[:10].upper(), **view}}
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

    def _post(self, body: SlackJson) -> SlackJson:
        channel = str(body.get("channel", ""))
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if channel.startswith("D") and channel not in self.ims:
            return {"ok": False, "error": "channel_not_found"}  # a DM between people: the bot is not in it
        thread_ts = body.get("thread_ts") or None
        if thread_ts and (channel, thread_ts) not in self.messages:
            return {"ok": False, "error": "thread_not_found"}
        ts = self._next_ts()
        blocks = _maybe_json(body.get("blocks")) or []
        self.messages[(channel, ts)] = Message(
            channel=channel, ts=ts, text=str(body.get("text", "")), blocks=blocks, thread_ts=thread_ts
        )
        return {"ok": True, "channel": channel, "ts": ts, "message": {"text": body.get("text", ""), "ts": ts}}

    def _update(self, body: SlackJson) -> SlackJson:
        key = (str(body.get("channel", "")), str(body.get("ts", "")))
        msg = self.messages.get(key)
        if msg is None:
            return {"ok": False, "error": "message_not_found"}
        msg.edits.append({"text": msg.text, "blocks": msg.blocks})
        msg.text = str(body.get("text", ""))
        msg.blocks = _maybe_json(body.get("blocks")) or []
        return {"ok": True, "channel": key[0], "ts": key[1], "text": msg.text}

    def _complete(self, body: SlackJson) -> SlackJson:
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
                answer: SlackJson = {"ok": False, "error": "not_authed"}
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


def _parse_body(content_type: str, raw: bytes) -> SlackJson:
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
