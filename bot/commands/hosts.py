"""``/status``, ``/queue``, ``/cancel``, ``/stop``: the commands about a host and its jobs."""

from __future__ import annotations

import re

from bot.commands.requests import CancelRequest, CommandSpec, QueueRequest, StatusRequest, StopRequest
from bot.commands.tokens import _fail, _no_more, _optional_host
from workers.config import Config

JOB_ID_RE = re.compile(r"^(?:#|job-?)?([0-9]{1,12})$")


def _parse_status(tokens: list[str], config: Config) -> StatusRequest:
    return StatusRequest(host=_optional_host(tokens, config, "status", group_ok=True))


def _parse_queue(tokens: list[str], config: Config) -> QueueRequest:
    return QueueRequest(host=_optional_host(tokens, config, "queue", group_ok=True))


#: ``/stop HOST force``: an admin stops an unmanaged process that benchbot could not show to be an engine.
FORCE_WORD = "force"


def _parse_stop(tokens: list[str], config: Config) -> StopRequest:
    force = FORCE_WORD in tokens
    if force:
        tokens.remove(FORCE_WORD)
    return StopRequest(host=_optional_host(tokens, config, "stop", group_ok=True) or config.default_host, force=force)


def _parse_cancel(tokens: list[str], config: Config) -> CancelRequest:
    if not tokens:
        raise _fail('which job? e.g. "/cancel 17" (/queue shows job numbers)')
    match = JOB_ID_RE.match(tokens.pop(0))
    if not match:
        raise _fail('job numbers look like "17" (see /queue)')
    _no_more(tokens, "cancel")
    return CancelRequest(job_id=match.group(1))


STATUS = CommandSpec(
    "status",
    "/status [HOST | GROUP]",
    "what really runs on a host, observed now",
    "Observes the host afresh: the process on the engine port, the server's own config, who "
    "launched it, its fingerprint and instance, GPU memory. Shows servers benchbot did not start. "
    "A group ([groups.NAME] in the config) shows each of its hosts and the gang job holding them.",
    "read",
    _parse_status,
)

QUEUE = CommandSpec(
    "queue",
    "/queue [HOST | GROUP]",
    "running and queued jobs, with owners and positions",
    "Lists each host's running job and the queued ones in order.",
    "read",
    _parse_queue,
)

CANCEL = CommandSpec(
    "cancel",
    "/cancel JOB",
    "cancel your queued or running job (admins: any job)",
    "A queued job is removed; a running one is stopped and what it started is cleaned up.",
    "cancel",
    _parse_cancel,
)

STOP = CommandSpec(
    "stop",
    "/stop [HOST] [force]",
    "stop the engine on a host (queued behind running jobs)",
    "Stops the engine that owns the engine port, in turn with the other jobs on that host: benchbot's own, "
    "or one it did not start that is shown to be an engine (its command line and its own API on the port). "
    "Anything else is named, never touched; an admin may add `force` to stop an unmanaged engine anyway.",
    "stop",
    _parse_stop,
)
