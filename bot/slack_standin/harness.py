"""The real Slack front end on 127.0.0.1 for tests and the ack-latency bench: the Web API stand-in, the bolt
app over HTTP and the notifier, with slash commands and button presses signed the way Slack signs them."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from bot.slack_standin.web_api import WEBHOOK, Call, SlackJson, SlackStandIn

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

        message: SlackJson = {"type": "message", "ts": message_ts, "text": "header"}
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

    # ------------------------------------------------------------------ events as Slack sends them

    BOT_USER_ID = "U0BENCHBOT"  # what the stand-in's auth.test answers
    BOT_ID = "B0BENCHBOT"

    def event(
        self, event: dict[str, object], *, event_id: str | None = None, retry_num: int | None = None
    ) -> HttpAnswer:
        """A signed Events API ``event_callback`` (JSON), as Slack POSTs it; a retry carries the same event_id."""
        body = json.dumps(
            {
                "token": "legacy-verification-token",
                "team_id": "T0STANDIN",
                "api_app_id": "A0STANDIN",
                "event": event,
                "type": "event_callback",
                "event_id": event_id or f"Ev{uuid.uuid4().hex[:12].upper()}",
                "event_time": int(time.time()),
                "authorizations": [{"team_id": "T0STANDIN", "user_id": self.BOT_USER_ID, "is_bot": True}],
            }
        )
        headers = signed_headers(body, content_type="application/json")
        if retry_num is not None:
            headers.update({"X-Slack-Retry-Num": str(retry_num), "X-Slack-Retry-Reason": "http_timeout"})
        return self.post(body, headers)

    def say_in_thread(
        self,
        text: str,
        *,
        user: str = "alice",
        channel: str = "C0TEAM",
        thread_ts: str | None = None,
        mention: bool = True,
        event_id: str | None = None,
    ) -> tuple[str, str]:
        """A person writes in a thread: the message lands in the stand-in, and the app gets what Slack
        sends for it (``app_mention`` for a mention, ``message`` for a plain reply). Returns (ts, event_id)."""
        body = f"<@{self.BOT_USER_ID}> {text}" if mention else text
        ts = self.standin.user_message(channel, user, body, thread_ts)
        event: dict[str, object] = {
            "type": "app_mention" if mention else "message",
            "user": user,
            "text": body,
            "ts": ts,
            "channel": channel,
            "event_ts": ts,
            "channel_type": "channel",
        }
        if thread_ts:
            event["thread_ts"] = thread_ts
        event_id = event_id or f"Ev{uuid.uuid4().hex[:12].upper()}"
        answer = self.event(event, event_id=event_id)
        assert answer.status == 200, answer
        return ts, event_id

    def echo_bot_messages(self, *, bot_id: str = BOT_ID, user: str = BOT_USER_ID) -> int:
        """Hand every message the bot posted back to it as the ``message`` events Slack would send
        (``bot_id`` set; another bot's when ``bot_id``/``user`` say so): the app must do nothing with them.
        Returns how many were sent."""
        sent = 0
        for msg in self.standin.bot_messages():
            event: dict[str, object] = {
                "type": "message",
                "subtype": "bot_message",
                "bot_id": bot_id,
                "user": user,
                "text": msg.text,
                "ts": msg.ts,
                "channel": msg.channel,
                "channel_type": "channel",
            }
            if msg.thread_ts:
                event["thread_ts"] = msg.thread_ts
            self.event(event)
            sent += 1
        return sent

    def webhooks(self) -> list[Call]:
        """What the app sent through response_url, oldest first."""
        return self.standin.calls_to(WEBHOOK)
