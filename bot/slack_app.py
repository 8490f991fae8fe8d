"""Slack front end: slash commands and buttons -> the dispatcher; Socket Mode or HTTP.

Slack gives a command 3 seconds to be acknowledged, so every listener acks first, with nothing
before it but the signature checks (HTTP mode: :mod:`bot.slack_http` at the edge, then bolt's), and
only then parses, checks access and enqueues (the rest runs on a pool, in order per person). What
comes back:

* refusals, access denials, help and other personal answers: ephemeral, through ``response_url``;
* a queued job: one in-channel header via ``chat.postMessage`` with a Cancel button, recorded as the
  job's thread (:func:`bot.job_threads.record_thread`) so the notifier edits it as the job runs;
* shared answers (``/compare`` and its PNGs): in the channel, the plots uploaded with
  ``files_upload_v2`` into the answer's thread.

Slack redelivers a request it thinks timed out (``X-Slack-Retry-Num``), and people double-click:
each delivery claims its ``trigger_id`` (and each button press its user/button/message) with a
Redis ``SET NX`` that expires, so a retry or a second click never creates a second job.
Tokens and the signing secret are only handed to the SDK; they are never logged or shown.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis as redis_lib
from slack_bolt import App, BoltResponse
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from bot import blocks, home, job_threads, notifier, render, slack_events, thread_talk
from bot import metrics as bot_metrics
from bot.commands import COMMANDS
from bot.dispatch import Dispatcher
from bot.replies import Reply, refused
from bot.slack_http import MAX_BODY_BYTES, SlackHTTPServer
from workers import keys, redis_conn
from workers.config import Config
from workers.errors import BenchbotError
from workers.jobs import events
from workers.jobs.presence import HostService

log = logging.getLogger(__name__)

ACTION_IDS = ("cancel_job", "bench_this", "rerun_job", "compare_baseline")
#: ``/launch``, or the same with a team prefix such as ``/bb-launch`` when a name is taken.
COMMAND_RE = re.compile(r"^/(?:[a-z0-9]+[-_])?(" + "|".join(map(re.escape, COMMANDS)) + r")$")
DELIVERY_KEY = keys.SLACK_DELIVERY_PREFIX
CLICK_KEY = keys.SLACK_CLICK_PREFIX
DELIVERY_TTL_S = 3600
CLICK_TTL_S = 10
SORRY = "sorry, something went wrong on benchbot's side; the team can find the details in its log"


def command_name(command: str) -> str:
    """``/launch`` or ``/bb-launch`` -> ``launch`` (unknown names pass through for a friendly error)."""
    match = COMMAND_RE.match(command.strip().lower())
    return match.group(1) if match else command.strip().lstrip("/")


def make_client(token: str, api_url: str | None = None, *, timeout: int = 15) -> WebClient:
    """A WebClient, pointed at ``api_url`` (a stand-in, a proxy) instead of slack.com when given."""
    if api_url:
        return WebClient(token=token, base_url=api_url.rstrip("/") + "/", timeout=timeout)
    return WebClient(token=token, timeout=timeout)


class SlackFrontEnd:
    """What the listeners do after they acked: dispatch, then answer the way Slack allows."""

    def __init__(self, dispatcher: Dispatcher, redis_client: redis_lib.Redis, client: WebClient) -> None:
        self.dispatcher = dispatcher
        self.redis = redis_client
        self.client = client
        #: deliveries dropped as retries or double clicks (observable by tests and the e2e harness)
        self.duplicates = 0
        self._count_lock = threading.Lock()

    # ------------------------------------------------------------------ dedupe

    def first_delivery(self, key: object, ttl_s: int = DELIVERY_TTL_S, prefix: str = DELIVERY_KEY) -> bool:
        """True the first time ``key`` is seen within ``ttl_s`` (a Redis SET NX, atomic across threads)."""
        if not key:
            return True
        try:
            first = bool(self.redis.set(prefix + str(key), "1", nx=True, ex=ttl_s))
        except redis_lib.RedisError:
            return True  # the dispatcher will fail with a clear message if Redis is really gone
        if not first:
            with self._count_lock:
                self.duplicates += 1
        return first

    # ------------------------------------------------------------------ slash commands

    def on_command(self, body: Mapping[str, object], respond: Callable[..., Any]) -> None:
        """A slash command, after its ack."""
        if not self.first_delivery(body.get("trigger_id")):
            log.info("slack: duplicate delivery of %s ignored", body.get("command"))
            return
        user = str(body.get("user_id", ""))
        channel = str(body.get("channel_id", ""))
        name = command_name(str(body.get("command", "")))
        log.info("slack: /%s from %s in %s", name, user, channel)
        try:
            reply = self.dispatcher.handle_command(user, channel, name, str(body.get("text", "")))
        except BenchbotError as exc:
            reply = refused(str(exc))
        except Exception:
            log.exception("slack: /%s failed", name)
            reply = refused(SORRY)
        self.deliver(reply, user=user, channel=channel, respond=respond)

    # ------------------------------------------------------------------ buttons

    def on_action(self, body: Mapping[str, object], action: Mapping[str, object], respond: Callable[..., Any]) -> None:
        """A button press, after its ack."""
        user = str(_obj(body.get("user")).get("id", ""))
        channel = str(_obj(body.get("channel")).get("id", ""))
        container = _obj(body.get("container"))
        message = _obj(body.get("message"))
        message_ts = str(container.get("message_ts") or message.get("ts") or "")
        action_id = str(action.get("action_id", ""))
        value = str(action.get("value", ""))
        delivery = body.get("trigger_id") or f"{user}:{action.get('action_ts', '')}"
        if not self.first_delivery(str(delivery)):
            log.info("slack: duplicate delivery of %s ignored", action_id)
            return
        if not self.first_delivery(f"{user}:{action_id}:{value}:{message_ts}", CLICK_TTL_S, CLICK_KEY):
            log.info("slack: double click on %s ignored", action_id)
            return
        log.info("slack: button %s(%s) from %s in %s", action_id, value, user, channel)
        try:
            reply = self.dispatcher.handle_action(user, channel, action_id, value)
        except BenchbotError as exc:
            reply = refused(str(exc))
        except Exception:
            log.exception("slack: button %s failed", action_id)
            reply = refused(SORRY)
        thread_ts = str(message.get("thread_ts") or message_ts or "") or None
        self.deliver(reply, user=user, channel=channel, respond=respond, thread_ts=thread_ts)

    # ------------------------------------------------------------------ answers

    def deliver(
        self, reply: Reply, *, user: str, channel: str, respond: Callable[..., Any], thread_ts: str | None = None
    ) -> None:
        """Send a Reply where it belongs: a job header, the channel, or only to the person."""
        if reply.ok and reply.kind == "queued" and reply.job_id:
            self.post_job_header(reply, channel=channel, respond=respond)
            host = str(reply.data.get("host", ""))
            problem = render.service_line(host, HostService.from_dict(host, reply.data.get("service")))
            if problem:  # no worker serves the host, or its worker cannot reach it: say so now, privately
                self.respond_ephemeral(respond, blocks.message(problem, [blocks.section(blocks.escape(problem))]))
            return
        if not reply.ok or reply.ephemeral:
            self.respond_ephemeral(respond, blocks.reply_message(reply))
            return
        try:
            self.post_in_channel(reply, channel=channel, thread_ts=thread_ts)
        except (SlackApiError, SlackClientError, OSError) as exc:
            log.warning("slack: could not post in %s (%s); answering privately", channel, _slack_error(exc))
            msg = blocks.reply_message(reply)
            note = "(benchbot could not post in this channel: invite it with /invite @benchbot)"
            self.respond_ephemeral(respond, blocks.message(msg["text"], [*msg["blocks"], blocks.context(note)]))

    def respond_ephemeral(self, respond: Callable[..., Any], msg: blocks.Message) -> None:
        """Only the person sees it (``response_url``; works even where the bot is not a member)."""
        try:
            respond(text=msg["text"], blocks=msg["blocks"], response_type="ephemeral", replace_original=False)
        except Exception as exc:  # a response_url can expire (30 min) or be used up (5 times)
            log.warning("slack: could not answer through response_url (%s)", type(exc).__name__)

    def post_job_header(
        self, reply: Reply, *, channel: str, respond: Callable[..., Any] | None, thread_ts: str | None = None
    ) -> None:
        """One in-channel header for a queued job, recorded as its thread; a job asked for in a thread
        (``thread_ts``) gets its header there, so the thread holds the whole experiment."""
        job_id = str(reply.job_id)
        header = job_threads.header_of(reply.data, job_id)
        try:
            try:
                resp = self.client.chat_postMessage(
                    channel=channel, thread_ts=thread_ts, **blocks.header_message(header)
                )
            except SlackApiError:
                if not channel.startswith("D") or thread_ts:
                    raise
                # A command typed in a DM between people, where the bot is no member: the job's thread goes
                # to the owner's own DM with benchbot (im:write), so they still hear how it goes.
                opened = self.client.conversations_open(users=str(reply.data.get("user") or ""))
                own_dm = str(_obj(opened.get("channel")).get("id") or "")
                resp = self.client.chat_postMessage(channel=own_dm, **blocks.header_message(header))
        except (SlackApiError, SlackClientError, OSError) as exc:
            log.warning("slack: job %s header not posted in %s (%s)", job_id, channel, _slack_error(exc))
            note = (
                "benchbot could not post this job's thread here: invite it with /invite @benchbot "
                "and follow the job with /queue"
            )
            if respond is not None:
                self.respond_ephemeral(
                    respond,
                    blocks.message(reply.text, [blocks.section(blocks.escape(reply.text)), blocks.context(note)]),
                )
            return
        posted_in = str(resp.get("channel") or channel)
        job_threads.record_thread(self.redis, job_id, posted_in, str(resp["ts"]), header, thread_ts=thread_ts)
        thread_talk.remember(self.redis, posted_in, thread_ts or str(resp["ts"]), job_id)

    def post_in_channel(self, reply: Reply, *, channel: str, thread_ts: str | None = None) -> None:
        """A shared answer; its files (PNGs) go into the answer's thread."""
        msg = blocks.reply_message(reply)
        resp = self.client.chat_postMessage(channel=channel, thread_ts=thread_ts, **msg)
        files = [Path(f) for f in reply.files if Path(f).is_file()]
        if files:
            self.client.files_upload_v2(
                channel=str(resp.get("channel") or channel),
                thread_ts=thread_ts or str(resp["ts"]),
                file_uploads=[{"file": str(p), "filename": p.name, "title": p.stem} for p in files],
            )


class InOrderWork:
    """Runs each person's work in the order their requests arrived; different people in parallel.

    A teammate who types ``/launch`` then ``/bench`` must get the launch queued first, even though both
    were acked at once and a pool runs the work.
    """

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._pending: dict[str, deque[tuple[Callable[..., Any], tuple[Any, ...]]]] = {}

    def submit(self, key: str, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` behind ``key``'s earlier work."""
        with self._lock:
            line = self._pending.get(key)
            if line is not None:
                line.append((fn, args))
                return
            self._pending[key] = deque([(fn, args)])
        self._pool.submit(self._drain, key)

    def _drain(self, key: str) -> None:
        while True:
            with self._lock:
                line = self._pending[key]
                if not line:
                    del self._pending[key]
                    return
                fn, args = line[0]
            try:
                fn(*args)
            except Exception:
                log.exception("slack: work for %s failed", key)
            with self._lock:
                line.popleft()


def _obj(value: object) -> Mapping[str, object]:
    """``value`` if it is a JSON object, else an empty one: a signed payload may still hold odd types."""
    return value if isinstance(value, Mapping) else {}


def _slack_error(exc: BaseException) -> str:
    if isinstance(exc, SlackApiError) and exc.response is not None:
        return str(exc.response.get("error") or exc.response.status_code)
    return type(exc).__name__


# --------------------------------------------------------------------------- the bolt app


def build_app(
    config: Config,
    redis_client: redis_lib.Redis,
    *,
    token: str,
    signing_secret: str | None,
    api_url: str | None = None,
    plots_dir: Path | None = None,
    dispatcher: Dispatcher | None = None,
) -> App:
    """The bolt App with every slash command of the grammar and the job buttons wired.

    ``signing_secret`` may be empty only for Socket Mode, where Slack does not sign envelopes.
    """
    if not token:
        raise BenchbotError(
            "SLACK_BOT_TOKEN is not set: copy the bot token (xoxb-...) from the app's OAuth & Permissions page"
        )
    client = make_client(token, api_url)
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="slack-work")
    try:
        app = App(
            client=client,
            signing_secret=signing_secret or "",
            request_verification_enabled=bool(signing_secret),
            # Ack in the request's own thread and hand the work to InOrderWork: with the ack itself on
            # bolt's 5-thread executor, a burst of teammates queued acks behind earlier commands' work and
            # bolt gave up on them after 3 s (bench/ack_latency.py: 50 of 200 lost).
            process_before_response=True,
            listener_executor=pool,  # shared: whoever shuts bolt's executor down stops our work too
            logger=logging.getLogger("bot.slack_app.bolt"),
        )
    except SlackApiError as exc:
        raise BenchbotError(f"Slack refused the bot token ({_slack_error(exc)}); check SLACK_BOT_TOKEN") from None
    except (SlackClientError, OSError) as exc:
        raise BenchbotError(f"could not reach Slack to check the bot token ({type(exc).__name__})") from None
    # the group exists before the first job is queued, so the notifier never misses its events
    events.ensure_group(redis_client, events.DEFAULT_GROUP)
    front = SlackFrontEnd(dispatcher or Dispatcher(config, redis_client, plots_dir=plots_dir), redis_client, client)
    app.benchbot = front  # type: ignore[attr-defined]  # for tests and the e2e harness

    work = InOrderWork(pool)

    def on_command(
        ack: Callable[..., Any], body: dict[str, object], respond: Callable[..., Any], context: dict[str, object]
    ) -> None:
        ack()
        bot_metrics.observe_ack(bot_metrics.COMMAND, context)
        work.submit(str(body.get("user_id", "")), front.on_command, body, respond)

    def on_action(
        ack: Callable[..., Any],
        body: dict[str, object],
        action: dict[str, object],
        respond: Callable[..., Any],
        context: dict[str, object],
    ) -> None:
        ack()
        bot_metrics.observe_ack(bot_metrics.ACTION, context)
        work.submit(str(_obj(body.get("user")).get("id", "")), front.on_action, body, _obj(action), respond)

    def on_error(error: Exception) -> BoltResponse:
        # Only signed requests get here (the HTTP server checked the signature and the body's shape first):
        # one holding a field of a type bolt indexes blindly. One line and a 400, never a traceback or a 500.
        log.warning(
            "slack: a signed request bolt could not handle (%s: %s); answered 400",
            type(error).__name__,
            str(error)[:200],
        )
        return BoltResponse(status=400, body="malformed Slack request")

    app.error(on_error)
    app.use(bot_metrics.stamp_receipt)  # Socket Mode's receipt time (HTTP mode's server stamps an earlier one)
    app.command(COMMAND_RE)(on_command)
    app.action(re.compile("^(" + "|".join(ACTION_IDS) + ")$"))(on_action)
    app.benchbot_events = slack_events.register_events(  # type: ignore[attr-defined]
        app, front, work, lambda user: home.publish_home(front, user)
    )
    return app


# --------------------------------------------------------------------------- the manifest

MANIFEST_PATH = Path(__file__).resolve().parent.parent / "deploy" / "slack-manifest.yml"
BOT_SCOPES = (
    "commands",
    "chat:write",
    "chat:write.public",
    "files:write",
    # thread talk (issue 35): mentions, thread replies in public and private channels, DMs
    "app_mentions:read",
    "channels:history",
    "groups:history",
    "im:history",
    "im:write",
)


def usage_hint(name: str) -> str:
    """The grammar's syntax without the command name: what Slack shows while typing."""
    return COMMANDS[name].syntax.replace(f"/{name} ", "").replace(f"/{name}", "").strip()


def render_manifest(app_name: str = "benchbot") -> str:
    """``deploy/slack-manifest.yml`` as text, generated from the grammar so the two never drift."""
    q = json.dumps  # a JSON string is a valid YAML double-quoted scalar
    lines = [
        "# Slack app manifest for benchbot: api.slack.com/apps -> Create New App -> From a manifest.",
        "# Generated from bot/commands.py by bot.slack_app.render_manifest(); a test keeps them in sync.",
        "# Socket Mode is on (no public URL needed). For HTTP mode instead, set socket_mode_enabled: false",
        "# and add  url: https://YOUR-HOST/slack/events  to each command, to interactivity (request_url)",
        "# and to event_subscriptions (request_url).",
        "_metadata:",
        "  major_version: 1",
        "  minor_version: 1",
        "display_information:",
        f"  name: {q(app_name)}",
        f"  description: {q('Queue, launch, benchmark and compare LLM-serving experiments on the team GPU box')}",
        '  background_color: "#2c3e50"',
        "features:",
        "  bot_user:",
        f"    display_name: {q(app_name)}",
        "    always_online: true",
        "  app_home:",
        "    home_tab_enabled: true",
        "    messages_tab_enabled: true",
        "    messages_tab_read_only_enabled: false",
        "  slash_commands:",
    ]
    for name, spec in COMMANDS.items():
        lines += [
            f"    - command: /{name}",
            f"      description: {q(spec.summary[:100])}",
            f"      usage_hint: {q(usage_hint(name)[:1000])}",
            "      should_escape: false",
        ]
    lines += [
        "oauth_config:",
        "  scopes:",
        "    bot:",
        *(f"      - {scope}" for scope in BOT_SCOPES),
        "settings:",
        "  event_subscriptions:",
        "    bot_events:",
        *(f"      - {event}" for event in slack_events.BOT_EVENTS),
        "  interactivity:",
        "    is_enabled: true",
        "  org_deploy_enabled: false",
        "  socket_mode_enabled: true",
        "  token_rotation_enabled: false",
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- serving

MAX_BODY_ENV = "BENCHBOT_SLACK_MAX_BODY_BYTES"


def max_body_bytes() -> int:
    """HTTP mode's body cap: ``BENCHBOT_SLACK_MAX_BODY_BYTES``, else 64 KB (Slack sends a few KB)."""
    raw = os.environ.get(MAX_BODY_ENV, "").strip()
    if not raw:
        return MAX_BODY_BYTES
    if not raw.isdigit() or not 1024 <= int(raw) <= 16 * 1024 * 1024:
        raise BenchbotError(f"{MAX_BODY_ENV} must be a number of bytes between 1024 and 16777216, not {raw!r}")
    return int(raw)


def run_slack(
    config: Config,
    redis_url: str,
    *,
    port: int | None = None,
    host: str | None = None,
    notify: bool = True,
    stop: threading.Event | None = None,
) -> None:
    """Run the Slack app (Socket Mode when ``SLACK_APP_TOKEN`` is set, else HTTP) and the notifier.

    Environment: ``SLACK_BOT_TOKEN`` (xoxb-), ``SLACK_SIGNING_SECRET`` (HTTP mode), ``SLACK_APP_TOKEN``
    (xapp-, Socket Mode), ``SLACK_API_URL`` (another Web API base URL), ``BENCHBOT_SLACK_CHANNEL``
    (where console jobs are posted), ``BENCHBOT_SLACK_BIND`` (HTTP bind address, default 0.0.0.0),
    ``BENCHBOT_SLACK_MAX_BODY_BYTES`` (HTTP body cap, default 64 KB).
    Blocks until ``stop`` is set (or forever).
    """
    token = os.environ.get("SLACK_BOT_TOKEN", "")
    secret = os.environ.get("SLACK_SIGNING_SECRET", "")
    app_token = os.environ.get("SLACK_APP_TOKEN", "")
    api_url = os.environ.get("SLACK_API_URL") or None
    if app_token and not app_token.startswith("xapp-"):
        raise BenchbotError("SLACK_APP_TOKEN must be an app-level token (xapp-...) with connections:write")
    if not app_token and not secret:
        raise BenchbotError(
            "HTTP mode needs SLACK_SIGNING_SECRET (Basic Information > App Credentials); "
            "or set SLACK_APP_TOKEN (xapp-...) to use Socket Mode"
        )
    redis_client = redis_conn.connect(redis_url, decode_responses=True)
    plots_dir = redis_conn.state_dir() / "plots"
    app = build_app(config, redis_client, token=token, signing_secret=secret, api_url=api_url, plots_dir=plots_dir)
    stop = stop or threading.Event()
    metrics = bot_metrics.start_bot_metrics(config, redis_client)  # None unless [metrics] bot_port is set
    note = None
    if notify:
        note = notifier.notifier_from_env(
            redis_conn.connect(redis_url, decode_responses=True), make_client(token, api_url), plots_dir=plots_dir
        )
        note.start()
    try:
        if app_token:
            from slack_bolt.adapter.socket_mode import SocketModeHandler

            handler = SocketModeHandler(app, app_token)
            handler.connect()
            log.info("benchbot Slack app connected in Socket Mode")
            try:
                stop.wait()
            finally:
                handler.close()
        else:
            bind = host or os.environ.get("BENCHBOT_SLACK_BIND", "0.0.0.0")
            server = SlackHTTPServer(
                app,
                signing_secret=secret,
                host=bind,
                port=3000 if port is None else port,
                max_body_bytes=max_body_bytes(),
            ).start()
            log.info("benchbot Slack app listening on %s", server.url)
            try:
                stop.wait()
            finally:
                server.stop()
    finally:
        if note is not None:
            note.stop()
        if metrics is not None:
            metrics.stop()
