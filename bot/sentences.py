"""The sentences benchbot says about jobs and servers, written once for every renderer.

``bot/render.py`` (plain text: console, ``say``, Slack's notification fallback) and ``bot/blocks.py``
(Slack Block Kit) used to word the same facts separately, and the two drifted. Both now ask here for
the words; a :class:`Style` only says how to mark them up (a user, code, emphasis, escaping), so the
wording cannot differ between the terminal and Slack. Layout (lines, sections, buttons, icons) stays
with each renderer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from workers.engines.args import ArgDiff
from workers.jobs.payloads import Expectation
from workers.observation import LaunchedBy

SLACK_ID_RE = re.compile(r"^[UW][A-Z0-9]{2,}$")


def escape_mrkdwn(text: object) -> str:
    """Escape mrkdwn control characters so text shows as typed (and cannot ping anyone)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_mention(user: str) -> str:
    """``<@U123>`` for a Slack member id (Slack renders the name), ``@name`` for anything else."""
    return f"<@{user}>" if SLACK_ID_RE.match(user or "") else f"@{escape_mrkdwn(user or 'someone')}"


@dataclass(frozen=True)
class Style:
    """How a renderer marks up the parts of a sentence."""

    text: Callable[[object], str]  # any dynamic text (escaped where the medium needs it)
    user: Callable[[str], str]  # a person
    code: Callable[[str], str]  # a flag, an id
    strong: Callable[[str], str]  # the word that matters


PLAIN = Style(text=str, user=lambda u: f"@{u}", code=str, strong=str)
MRKDWN = Style(
    text=escape_mrkdwn,
    user=slack_mention,
    code=lambda t: f"`{escape_mrkdwn(t)}`",
    strong=lambda t: f"*{escape_mrkdwn(t)}*",
)


# --------------------------------------------------------------------------- a job


def ahead_words(ahead: int) -> str:
    """``next in line`` / ``2 ahead``."""
    return f"{ahead} ahead" if ahead else "next in line"


#: How the header's phases read after ``#17``.
PHASE_WORDS = {"running": "running", "ready": "ready", "done": "done", "failed": "failed", "cancelled": "cancelled"}


def job_line(
    style: Style, *, user: str, summary: str, host: str | None, job_id: object, phase: str = "queued", ahead: int = 0
) -> str:
    """``@alice: launch nextn cudnn on gpu-1, queued #17, 2 ahead`` / ``..., #17 done``."""
    where = f" on {style.text(host)}" if host else ""
    head = f"{style.user(user)}: {style.text(summary)}{where}"
    if phase == "queued":
        return f"{head}, queued #{job_id}, {ahead_words(ahead)}"
    return f"{head}, #{job_id} {PHASE_WORDS.get(phase, phase)}"


def measures_words(style: Style, expect: Expectation | None) -> str:
    """Which server a queued bench or eval will measure, said when it is queued (issue 25 item 6).

    ``None`` is ``any``. The same words in the reply, the terminal and the Slack header, so nobody
    learns only from a finished run that it measured someone else's server.
    """
    again = f"ask again with {style.code('any')} to measure whatever runs"
    if expect is None:
        return "measures: whatever runs when its turn comes (any)"
    if expect.unknown is not None:
        return (
            f"measures: {style.strong('nothing')}: benchbot cannot tell which server you mean "
            f"({style.text(expect.unknown)}), so it will be refused when its turn comes; {again}"
        )
    if expect.after_job:
        return f"measures: the server your job #{style.text(expect.after_job)} starts"
    if expect.nothing_running:
        return f"measures: nothing runs now, so it will be refused when its turn comes; /launch first, or {again}"
    label = style.text(expect.label or "the server running now")
    instance = f" (instance {style.text(expect.instance_id)})" if expect.instance_id else ""
    if expect.pinned:
        return (
            f"measures: {label}{instance}, running now, and only that server: a job queued ahead may replace it, "
            "and then this one is refused"
        )
    return f"measures: {label}{instance}, running now; refused if the config changes before its turn"


def cancelled_words(style: Style, by: str | None, done: str = "") -> str:
    """``cancelled by @alice``; ``cancelled by @alice after the engine was stopped (pid 123)`` when the job
    had already done something on the host (a cancel does not undo a stop)."""
    return "cancelled" + (f" by {style.user(by)}" if by else "") + (f" after {style.text(done)}" if done else "")


def run_words(style: Style, run_id: str) -> str:
    """``run r12``."""
    return f"run {style.text(run_id)}"


def invalid_words(style: Style, reason: str | None) -> str:
    """``INVALID: the server changed during the run``: a measured run whose label does not hold."""
    return f"INVALID: {style.text(reason or 'the server changed during the run')}"


def diagnosis_words(style: Style, category: str, summary: str) -> str:
    """``oom: the KV cache does not fit ...``, the category marked."""
    return f"{style.strong(category)}: {style.text(summary)}"


# --------------------------------------------------------------------------- a server


def launched_by_words(style: Style, who: LaunchedBy) -> str:
    """``launched by @alice (job 7)``."""
    return f"launched by {style.user(who.user or '?')} (job {style.text(who.job)})"


def diff_words(style: Style, diff: ArgDiff) -> str:
    """``--mem-fraction-static: asked 0.9, server reports 0.88``."""
    return f"{style.code(diff.arg)}: asked {style.text(diff.requested)}, server reports {style.text(diff.observed)}"


def unmanaged_words(style: Style) -> str:
    """A server on the port that benchbot did not start."""
    return f"{style.strong('UNMANAGED')}: benchbot did not start this server"
