"""A local stand-in for Slack: the Web API over HTTP and a Socket Mode WebSocket, both on 127.0.0.1.

Slack itself cannot be reached from tests, and mocking ``slack_sdk`` would test nothing of the wire.
So the real ``WebClient`` (pointed here with ``base_url``), the real ``files_upload_v2`` three-step
upload and the real bolt ``SocketModeHandler`` talk to these servers, which keep a record of every
call and of the messages they produced (headers, edits, thread replies, files), and can be told to
answer ``429`` (with ``Retry-After``) or ``500`` for the next calls of a method.

- :mod:`bot.slack_standin.web_api`: the Web API (:class:`SlackStandIn`) and what it records
- :mod:`bot.slack_standin.socket_mode`: Slack's side of Socket Mode (:class:`SocketModeStandIn`)
- :mod:`bot.slack_standin.harness`: the bolt app, its HTTP server and the notifier against the stand-in
  (:class:`SlackHarness`), and requests signed as Slack signs them
"""

from bot.slack_standin.harness import APP_TOKEN, BOT_TOKEN, SIGNING_SECRET, HttpAnswer, SlackHarness, signed_headers
from bot.slack_standin.socket_mode import SocketModeStandIn
from bot.slack_standin.web_api import UPLOAD, WEBHOOK, Call, Message, SlackJson, SlackStandIn, UploadedFile

__all__ = [
    "APP_TOKEN",
    "BOT_TOKEN",
    "SIGNING_SECRET",
    "UPLOAD",
    "WEBHOOK",
    "Call",
    "HttpAnswer",
    "Message",
    "SlackHarness",
    "SlackJson",
    "SlackStandIn",
    "SocketModeStandIn",
    "UploadedFile",
    "signed_headers",
]
