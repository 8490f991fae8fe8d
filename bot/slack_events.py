"""Slack events -> thread talk, notes and the Home tab: the listeners behind ``app_mention``, ``message.*``
and ``app_home_opened``.

Slack retries an event it thinks was not acknowledged within 3 s (``X-Slack-Retry-Num``, the same
``event_id``); a mention in a channel the bot reads arrives twice (as ``app_mention`` and as
``message.channels``, with two event ids). So each listener acks first, then on the pool (in order per
person): the ``event_id`` and the message itself (channel + ts) are each claimed once with a Redis
``SET NX`` that expires, and only the first claim does anything. Messages of bots (benchbot's own
posts included: ``bot_id``, ``bot_message``) and every other subtype (edits, deletions, joins) are
ignored: an edit or a deletion of the message that started a job changes nothing already queued, and
two bots cannot talk each other into a loop.

A command (a mention, or a thread reply that starts with ``benchbot``) goes to :class:`bot.thread_talk.ThreadTalk`;
a plain reply in a job's thread is kept with the thread's run as a note (:mod:`workers.results.notes`).
Every answer is posted into the thread it was asked in.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from slack_sdk.errors import SlackApiError, SlackClientError

from bot import thread_talk
from bot.replies import Reply, refused
from workers import keys
from workers.errors import BenchbotError
from workers.results import notes

if TYPE_CHECKING:
    from slack_bolt import App

    from bot.slack_app import InOrderWork, SlackFrontEnd

log = logging.getLogger(__name__)

EVENT_KEY = keys.SLACK_EVENT_PREFIX
EVENT_TTL_S = 3600
#: An answer longer than this is cut in its message (Block Kit's limits) and attached whole as a text file.
LONG_TEXT_CHARS = 6000
#: Only these arrive: the manifest subscribes to exactly them (``render_manifest``).
BOT_EVENTS = ("app_mention", "message.channels", "message.groups", "message.im", "app_home_opened")


def _obj(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def from_a_bot(event: Mapping[str, object], bot_user_id: str | None) -> bool:
    """Whether a message was written by a bot (benchbot itself included): never an instruction."""
    return bool(
        event.get("bot_id")
        or event.get("bot_profile")
        or event.get("subtype") == "bot_message"
        or (bot_user_id and event.get("user") == bot_user_id)
    )


class EventTalk:
    """What the event listeners do after they acked."""

    def __init__(self, front: SlackFrontEnd, talk: thread_talk.ThreadTalk) -> None:
        self.front = front
        self.talk = talk
        self.redis = front.redis
        #: events that did something (a command or a note): a bot's own message must leave this unchanged
        self.handled = 0
        #: message events taken from the pool, whatever became of them
        self.received = 0
        self._count = threading.Lock()

    def on_message_event(self, body: Mapping[str, object], bot_user_id: str | None) -> None:
        """An ``app_mention`` or a ``message.*`` event."""
        try:
            self._on_message_event(body, bot_user_id)
        finally:
            with self._count:
                self.received += 1

    def _on_message_event(self, body: Mapping[str, object], bot_user_id: str | None) -> None:
        event = _obj(body.get("event"))
        if not self.front.first_delivery(body.get("event_id"), EVENT_TTL_S, EVENT_KEY):
            log.info("slack: retry of event %s ignored", body.get("event_id"))
            return
        if from_a_bot(event, bot_user_id) or event.get("subtype"):
            return  # a bot (benchbot too), an edit, a deletion: nothing to do
        channel, ts = str(event.get("channel") or ""), str(event.get("ts") or "")
        user, text = str(event.get("user") or ""), str(event.get("text") or "")
        if not (channel and ts and user):
            return
        if not self.front.first_delivery(f"msg:{channel}:{ts}", EVENT_TTL_S, EVENT_KEY):
            return  # the same message as app_mention and as message.channels: answered once
        thread_ts = str(event.get("thread_ts") or "") or None
        command = thread_talk.command_text(text, bot_user_id)
        if command is None:
            if thread_ts and event.get("type") == "message":
                self.keep_note(user, channel, thread_ts, text)
            return
        self._did()
        log.info("slack: mention from %s in %s (thread %s)", user, channel, thread_ts)
        try:
            reply = self.talk.answer(user, channel, thread_ts, command)
        except Exception:
            log.exception("slack: a mention failed")
            reply = refused("sorry, something went wrong on benchbot's side; the team can find the details in its log")
        self.answer_in_thread(reply, user=user, channel=channel, thread_ts=thread_ts or ts)

    def _did(self) -> None:
        with self._count:
            self.handled += 1

    def keep_note(self, user: str, channel: str, thread_ts: str, text: str) -> None:
        """A plain reply in a job's thread: a note on the thread's run (none yet: nothing is kept)."""
        context = thread_talk.thread_context(self.redis, channel, thread_ts)
        if context is None:
            return
        self._did()
        try:
            run_id = self.talk.run_of(context)
            notes.add_note(self.redis, run_id, user, text)
        except BenchbotError as exc:
            log.info("slack: reply in thread %s not kept as a note (%s)", thread_ts, exc)
            return
        log.info("slack: note from %s kept with %s", user, run_id)

    def answer_in_thread(self, reply: Reply, *, user: str, channel: str, thread_ts: str) -> None:
        """The answer goes into the thread it was asked in; a new job's story too."""
        if reply.ok and reply.kind == "queued" and reply.job_id:
            self.front.post_job_header(reply, channel=channel, respond=None, thread_ts=thread_ts)
            return
        if not reply.ok:
            reply = Reply(ok=False, kind=reply.kind, text=f"<@{user}> {reply.text}")
        try:
            self.front.post_in_channel(reply, channel=channel, thread_ts=thread_ts)
            if len(reply.text) > LONG_TEXT_CHARS:  # the message shows its head; the whole table goes as a file
                self.front.client.files_upload_v2(
                    channel=channel, thread_ts=thread_ts, content=reply.text, filename=f"benchbot-{reply.kind}.txt"
                )
        except (SlackApiError, SlackClientError, OSError) as exc:
            log.warning("slack: could not answer in thread %s of %s (%s)", thread_ts, channel, type(exc).__name__)


def register_events(
    app: App, front: SlackFrontEnd, work: InOrderWork, on_home: Callable[..., None] | None
) -> EventTalk:
    """Wire the event listeners: ack at once, the work on the pool in order per person."""
    talk = EventTalk(front, thread_talk.ThreadTalk(front.dispatcher))

    def on_message(ack: Callable[..., Any], body: dict[str, object], context: dict[str, object]) -> None:
        ack()
        user = str(_obj(body.get("event")).get("user") or "")
        work.submit(user or "events", talk.on_message_event, body, _text(context.get("bot_user_id")))

    app.event("app_mention")(on_message)
    app.event("message")(on_message)
    if on_home is not None:

        def on_home_opened(ack: Callable[..., Any], body: dict[str, object]) -> None:
            ack()
            event = _obj(body.get("event"))
            if event.get("tab", "home") == "home" and front.first_delivery(
                body.get("event_id"), EVENT_TTL_S, EVENT_KEY
            ):
                work.submit(str(event.get("user") or ""), on_home, str(event.get("user") or ""))

        app.event("app_home_opened")(on_home_opened)
    return talk


def _text(value: object) -> str | None:
    return str(value) if value else None
