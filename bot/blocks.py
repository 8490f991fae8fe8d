"""Block Kit for Slack: job headers, verified configs, diagnoses, tables and command replies.

Every function returns a message dict ``{"text": ..., "blocks": [...]}``: ``text`` is the plain
fallback Slack shows in notifications and to screen readers, so it is always sent. Slack's limits
are enforced here, at the one place messages are built (50 blocks, 3000 characters per section,
150 per button label, 40,000 per message text), so a long log or config can never make a post fail; the
blocks themselves are built with ``slack_sdk.models`` (``SectionBlock``, ``ContextBlock``, ``ButtonElement``,
``ActionsBlock``), whose ``to_dict()`` checks Slack's limits again, so a block that slipped past them raises
here rather than coming back from Slack as ``invalid_blocks``.
Dynamic text is escaped for mrkdwn (``&``, ``<``, ``>``) so a user's words cannot forge mentions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

from slack_sdk.models.blocks import (
    ActionsBlock,
    ButtonElement,
    ContextBlock,
    MarkdownTextObject,
    PlainTextObject,
    SectionBlock,
)

from bot.replies import Reply
from bot.sentences import (
    MRKDWN,
    ahead_words,
    cancelled_words,
    diagnosis_words,
    diff_words,
    job_line,
    launched_by_words,
    measures_words,
    run_words,
    unmanaged_words,
)
from bot.sentences import escape_mrkdwn as escape
from workers.engines.args import ArgDiff
from workers.jobs.eta import eta_words
from workers.jobs.outcomes import Stopped
from workers.jobs.payloads import Expectation, OutcomeKind
from workers.observation import RunningConfig

if TYPE_CHECKING:
    from bot.job_threads import HeaderState
    from workers.jobs.payloads import JsonValue

MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000
MAX_CONTEXT_TEXT = 2000
MAX_MESSAGE_TEXT = 40_000
MAX_BUTTON_TEXT = 75
MAX_BUTTON_VALUE = 2000

#: Header phases and how they read.
PHASE_ICON = {
    "queued": ":hourglass_flowing_sand:",
    "running": ":gear:",
    "ready": ":large_green_circle:",
    "done": ":white_check_mark:",
    "failed": ":x:",
    "cancelled": ":no_entry_sign:",
}
TERMINAL_PHASES = frozenset({"done", "failed", "cancelled"})

#: One Block Kit block (or element) as Slack's JSON: the untyped edge where messages leave for Slack.
Block = dict[str, object]


class Message(TypedDict):
    """A Slack message: the plain ``text`` fallback (notifications, screen readers) and its blocks."""

    text: str
    blocks: list[Block]


# --------------------------------------------------------------------------- primitives


def truncate(text: str, limit: int, marker: str = "…") -> str:
    """``text`` cut to ``limit`` characters, marked when cut."""
    return text if len(text) <= limit else text[: max(0, limit - len(marker))] + marker


def section(text: str) -> Block:
    """A mrkdwn section, cut to Slack's 3000 characters."""
    return SectionBlock(text=MarkdownTextObject(text=truncate(text or " ", MAX_SECTION_TEXT))).to_dict()


def context(text: str) -> Block:
    """A small grey line under a section."""
    return ContextBlock(elements=[MarkdownTextObject(text=truncate(text or " ", MAX_CONTEXT_TEXT))]).to_dict()


def code_sections(text: str, title: str | None = None, *, max_blocks: int = 4) -> list[Block]:
    """Monospace text as one or more sections of at most 3000 characters, split on line ends.

    Long text keeps its head and says how many lines were left out, rather than failing the post.
    """
    fence = "```"
    budget = MAX_SECTION_TEXT - 2 * len(fence) - 2
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    lines = escape(text.replace(fence, "'''")).splitlines() or [" "]
    shown = 0
    for line in lines:
        line = truncate(line, budget)
        if size + len(line) + 1 > budget:
            chunks.append("\n".join(current))
            current, size = [], 0
            if len(chunks) == max_blocks:
                break
        current.append(line)
        size += len(line) + 1
        shown += 1
    else:
        chunks.append("\n".join(current))
    blocks = []
    if title:
        blocks.append(section(title))
    blocks += [section(f"{fence}\n{chunk}\n{fence}") for chunk in chunks]
    if shown < len(lines):
        blocks.append(context(f"… {len(lines) - shown} more lines not shown"))
    return blocks


def button(text: str, action_id: str, value: str, style: str | None = None) -> Block:
    """A button whose press arrives as ``action_id`` with ``value``."""
    return ButtonElement(
        text=PlainTextObject(text=truncate(text, MAX_BUTTON_TEXT), emoji=True),
        action_id=action_id,
        value=truncate(str(value), MAX_BUTTON_VALUE, ""),
        style=style or None,
    ).to_dict()


def actions(buttons: Sequence[Block]) -> Block:
    """A row of buttons (Slack allows 25)."""
    return ActionsBlock(elements=[dict(b) for b in list(buttons)[:25]]).to_dict()


def message(text: str, blocks: Iterable[Block]) -> Message:
    """The message dict with Slack's limits applied; the last kept block says what was left out."""
    kept = list(blocks)
    if len(kept) > MAX_BLOCKS:
        dropped = len(kept) - (MAX_BLOCKS - 1)
        kept = [*kept[: MAX_BLOCKS - 1], context(f"… {dropped} more blocks not shown")]
    return Message(text=truncate(text or " ", MAX_MESSAGE_TEXT), blocks=kept)


# --------------------------------------------------------------------------- job header


def header_line(state: HeaderState) -> str:
    """The one-line summary: ``@alice: launch nextn cudnn on gpu-1, queued #17, 2 ahead``."""
    host = state.get("host")
    return job_line(
        MRKDWN,
        user=str(state.get("user") or ""),
        summary=str(state.get("summary") or state.get("kind") or "job"),
        host=str(host) if host else None,
        job_id=state.get("job_id", "?"),
        phase=str(state.get("phase", "queued")),
        ahead=int(state.get("ahead") or 0),
    )


def _phase_detail(state: HeaderState) -> str:
    phase = state.get("phase")
    if phase == "running":
        worker = state.get("worker")
        return "running" + (f" on worker {escape(worker)}" if worker else "")
    if phase == "ready":
        return "ready: " + escape(state.get("ready_summary") or "the server answers")
    if phase == "done":
        bits = []
        if state.get("run_id"):
            bits.append(run_words(MRKDWN, str(state["run_id"])))
        if state.get("run_ids"):
            bits.append("runs " + ", ".join(escape(r) for r in state["run_ids"]))
        if state.get("stopped") is not None:
            bits.append("engine stopped" if state.get("stopped") else "nothing was running")
        if state.get("eval_summary"):
            icon = ":red_circle: " if state.get("eval_flagged") else ""
            bits.append(icon + escape(state["eval_summary"]))
        if state.get("eval_drops"):
            bits.append(":red_circle: ACCURACY DROP: " + escape(", ".join(map(str, state["eval_drops"]))))
        if state.get("ready_summary") and not bits:
            bits.append(escape(state["ready_summary"]))
        return "done" + (": " + "; ".join(bits) if bits else "")
    if phase == "failed":
        category = state.get("category")
        reason = escape(state.get("error") or "see the thread")
        return "failed" + (f" ({escape(category)})" if category else "") + f": {reason}"
    if phase == "cancelled":
        by = state.get("cancelled_by")
        return cancelled_words(MRKDWN, str(by) if by else None, str(state.get("cancelled_after") or ""))
    queued = f"queued, {ahead_words(int(state.get('ahead') or 0))}"
    wait_s = state.get("eta_s")
    if isinstance(wait_s, int | float) and state.get("ahead"):
        queued += f", {eta_words(wait_s)}"
    measures = state.get("measures")
    if isinstance(measures, Mapping):
        expect = measures.get("expect")
        queued += "; " + measures_words(MRKDWN, Expectation.from_dict(expect if isinstance(expect, Mapping) else None))
    return queued


def header_buttons(state: HeaderState) -> list[Block]:
    """What a person can do with the job now."""
    job = str(state.get("job_id", ""))
    phase = state.get("phase", "queued")
    # The job's shape from its type: the result's kind once it ended, else what its payload will produce
    # (``outcome_kind``, recorded from the typed payload when it was queued), else its queue kind.
    shape = state.get("result_kind") or state.get("outcome_kind") or state.get("kind")
    out: list[Block] = []
    launch_only = shape == OutcomeKind.LAUNCH
    if launch_only and (phase == "ready" or (phase == "done" and not state.get("run_id"))):
        out.append(button("Bench this", "bench_this", job, "primary"))
    if phase not in TERMINAL_PHASES:
        out.append(button("Cancel", "cancel_job", job, "danger"))
    else:
        out.append(button("Re-run", "rerun_job", job))
    if phase == "done" and state.get("run_id"):
        out.append(button("Compare with baseline", "compare_baseline", str(state["run_id"])))
    return out


def header_message(state: HeaderState) -> Message:
    """The job's header: edited in place through queued, running, ready, done or failed."""
    line = header_line(state)
    phase = str(state.get("phase", "queued"))
    blocks = [section(f"{PHASE_ICON.get(phase, '')} {line}".strip())]
    detail = _phase_detail(state)
    progress = state.get("progress")
    if progress and phase not in TERMINAL_PHASES:
        detail += f" · {escape(progress)}"
    blocks.append(context(detail))
    buttons = header_buttons(state)
    if buttons:
        blocks.append(actions(buttons))
    return message(line, blocks)


# --------------------------------------------------------------------------- thread replies


def _arg_lines(args: Mapping[str, object]) -> str:
    lines = []
    for key in sorted(args):
        value = args[key]
        if isinstance(value, Mapping | list | tuple):
            value = json.dumps(value, default=str, separators=(",", ":"))
        lines.append(f"{key} = {value}")
    return "\n".join(lines)


def config_message(
    config: RunningConfig,
    diff: Sequence[ArgDiff] = (),
    replaced: Stopped | None = None,
    *,
    job_id: str | None = None,
    offer_bench: bool = True,
) -> Message:
    """The verified config: what the server itself reports, and how it differs from what was asked."""
    server = config.server
    process = config.process
    host = config.host
    port = config.port
    summary = config.summary
    title = f":mag: *Verified config* on {escape(host)}:{escape(port)} (observed from the server itself)"
    facts = []
    if server is not None and server.version:
        facts.append(f"engine {escape(server.version)}")
    if process is not None and process.pid:
        facts.append(f"pid {escape(process.pid)}")
    if config.fingerprint:
        facts.append(f"fingerprint `{escape(config.fingerprint[:12])}`")
    if config.instance_id:
        facts.append(f"instance `{escape(config.instance_id)}`")
    if config.managed is False:
        facts.append(unmanaged_words(MRKDWN))
    elif config.launched_by is not None:
        facts.append(launched_by_words(MRKDWN, config.launched_by))
    blocks: list[Block] = [section(title + (f"\n{escape(summary)}" if summary else ""))]
    if facts:
        blocks.append(context(" · ".join(facts)))
    if diff:
        lines = [":warning: *Differs from what was asked:*"]
        for item in diff:
            lines.append(f"• {diff_words(MRKDWN, item)}")
        blocks.append(section("\n".join(lines)))
    else:
        blocks.append(context(":white_check_mark: matches what was asked"))
    if replaced is not None:
        what = replaced.config.summary or replaced.config.instance_id or "the previous server"
        blocks.append(context(f"replaced {escape(what)}"))
    args = config.args
    if args:
        blocks += code_sections(_arg_lines(args), "*Server args*", max_blocks=3)
    gpus = config.gpus
    if gpus:
        names = {g.name or "?" for g in gpus}
        blocks.append(context(f"{len(gpus)} GPU(s): {escape(', '.join(sorted(names)))}"))
    if offer_bench and job_id:
        blocks.append(actions([button("Bench this", "bench_this", job_id, "primary")]))
    text = f"Verified config on {host}:{port}: {summary}".strip()
    if diff:
        text += f" ({len(diff)} difference(s) from what was asked)"
    return message(text, blocks)


def diagnosis_message(error: str, diagnosis: Mapping[str, JsonValue] | None) -> Message:
    """Why a job failed: the diagnosis category, its summary and the log line that shows it."""
    if not diagnosis:
        text = f"Failed: {error or 'no details'}"
        return message(text, [section(f":x: *Failed*: {escape(error or 'no details')}")])
    category = diagnosis.get("category") or "unknown"
    summary = diagnosis.get("summary") or error or ""
    blocks = [section(f":x: {diagnosis_words(MRKDWN, str(category), str(summary))}")]
    if diagnosis.get("evidence_line"):
        blocks += code_sections(str(diagnosis["evidence_line"]), "*Evidence*", max_blocks=1)
    if error and error != summary:
        blocks.append(context(escape(error)))
    if diagnosis.get("log_tail"):
        blocks.append(context("the log tail is attached below"))
    return message(f"Failed ({category}): {summary}", blocks)


def table_message(title: str, table: str, *, note: str | None = None, buttons: Sequence[Block] = ()) -> Message:
    """A monospace table (bench results, comparisons) under a title."""
    blocks = code_sections(table, f"*{escape(title)}*")
    if note:
        blocks.append(context(escape(note)))
    if buttons:
        blocks.append(actions(buttons))
    return message(f"{title}\n{table}", blocks)


def eval_blocks(summary: str, flagged: bool, detail: str = "", wrong: Sequence[str] = ()) -> list[Block]:
    """An accuracy verdict: the line (a red flag when it dropped beyond noise), how it was decided, and the
    first wrong answers."""
    icon = ":red_circle:" if flagged else ":white_check_mark:"
    out = [section(f"{icon} *{escape(summary)}*" if flagged else f"{icon} {escape(summary)}")]
    if detail:
        out.append(context(escape(detail)))
    if wrong:
        out.append(context("wrong: " + escape("; ".join(wrong))))
    return out


def text_message(text: str) -> Message:
    """Plain text: short as a section, long (tables, lists) as monospace."""
    if ("\n" in text and len(text) > 200) or "  " in text:
        return message(text, code_sections(text))
    return message(text, [section(escape(text))])


def reply_message(reply: Reply) -> Message:
    """An immediate answer (help, status, queue, runs, compare, refusals)."""
    if not reply.ok:
        icon = ":lock:" if reply.kind == "denied" else ":warning:"
        return message(reply.text, [section(f"{icon} {escape(reply.text)}")])
    if reply.kind in ("help", "status", "queue", "runs", "compare"):
        return message(reply.text, code_sections(reply.text, max_blocks=8))
    return text_message(reply.text)
