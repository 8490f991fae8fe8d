"""A mention in a job's Slack thread -> the request it means, with the thread's job as its context.

Slack slash commands cannot be typed into a thread, so the talk about a result happens through events:
``@benchbot again out=512`` in a job's thread. The thread is the context: which host, which bench and
which runs come from the jobs whose story is in the thread (:func:`remember`, written when the job's
header is posted; :func:`workers.keys.slack_talk`). Each verb becomes the same text the slash command
would carry (``bench``, ``eval``, ``compare``, ``runs tag``) and goes through the same grammar
(:func:`bot.commands.parse_command`) and the same :meth:`bot.dispatch.Dispatcher.dispatch` (access
checks, limits, queueing); nothing here parses options of its own. A mention outside a known thread
is answered with the slash command that does the same.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path

import redis as redis_lib

from bot.commands import COMMANDS, BenchRequest, CancelRequest, ParseError, Request, parse_command
from bot.dispatch import Dispatcher
from bot.replies import Reply, refused
from workers import keys
from workers.benchmark.spec import BenchSpec
from workers.errors import BenchbotError
from workers.jobs import events, queue
from workers.jobs.events import FailedData
from workers.jobs.outcomes import parse_outcome, run_ids_of
from workers.jobs.payloads import BenchPayload, JobPayload, LaunchPayload, SweepPayload, parse_payload
from workers.results import notes, store

TALK_TTL_S = 30 * 24 * 3600
#: ``<@U0BENCHBOT> again``, ``benchbot: again``, ``@benchbot again``: what makes a message a command.
_LEAD_RE = re.compile(r"^\s*(?:<@(?P<id>[A-Z0-9]+)(?:\|[^>]*)?>|@?benchbot\b)[\s,:]*", re.IGNORECASE)
#: What each verb is as a slash command, for a mention outside a job's thread.
SLASH_EQUIVALENT = {
    "again": "bench",
    "bench": "bench",
    "eval": "eval",
    "compare": "compare",
    "tag": "runs",
    "why": "queue",
    "plot": "compare",
    "cancel": "cancel",
    "notes": "runs",
    "help": "help",
}
PLOT_KINDS = {"ttft": "latency", "itl": "latency", "tpot": "latency", "e2e": "latency", "energy": "telemetry"}
THREAD_HELP = (
    "In a job's thread, talk to benchbot with a mention; the thread's job is the context:\n"
    "  @benchbot again [opts]           the same bench again, options changed (out=512, n=64 ...)\n"
    "  @benchbot bench LEVELS [opts]    a bench of the server this thread is about\n"
    "  @benchbot eval [TASK] [n=N]      an accuracy check of it\n"
    "  @benchbot compare baseline       this run against the host's baseline (or: compare r12 r15)\n"
    "  @benchbot tag TAG                tag this run (tag baseline: the same rules as /runs tag)\n"
    "  @benchbot why                    the full diagnosis and log excerpt of a failed job\n"
    "  @benchbot plot ttft|itl|tpot|energy\n"
    "  @benchbot cancel                 cancel this thread's queued or running job\n"
    "  @benchbot notes                  what the team wrote here about the run\n"
    "Any other reply in the thread is kept with the run as a note."
)


def command_text(text: str, bot_user_id: str | None) -> str | None:
    """The command after the bot's mention (or a leading ``benchbot``), or None for a plain message."""
    match = _LEAD_RE.match(text or "")
    if match is None:
        return None
    mentioned = match.group("id")
    if mentioned and bot_user_id and mentioned != bot_user_id:
        return None  # a mention of someone else is talk, not a command
    return text[match.end() :].strip()


def remember(r: redis_lib.Redis, channel: str, thread_ts: str, job_id: str) -> None:
    """Record that job ``job_id``'s story is in the thread (channel, thread_ts), with its payload."""
    try:
        payload = queue.job_payload(r, job_id)
    except BenchbotError:
        payload = {}
    key = keys.slack_talk(channel, thread_ts)
    pipe = r.pipeline(transaction=True)
    pipe.hset(key, str(job_id), json.dumps(payload, separators=(",", ":"), default=str))
    pipe.expire(key, TALK_TTL_S)
    pipe.execute()


@dataclass(frozen=True)
class ThreadContext:
    """The jobs whose story is in one thread, oldest first, with their typed payloads."""

    channel: str
    thread_ts: str
    jobs: tuple[tuple[str, JobPayload | None], ...]

    @property
    def host(self) -> str | None:
        for _, payload in reversed(self.jobs):
            if payload is not None:
                return payload.host
        return None

    def bench(self) -> BenchSpec | None:
        """The newest bench asked for in the thread (a bench's, a launch's ``then bench``, a sweep's)."""
        for _, payload in reversed(self.jobs):
            if isinstance(payload, BenchPayload | LaunchPayload | SweepPayload) and payload.bench is not None:
                return payload.bench
        return None


def thread_context(r: redis_lib.Redis, channel: str, thread_ts: str) -> ThreadContext | None:
    """The thread's jobs, or None when no job's story is in it."""
    raw = r.hgetall(keys.slack_talk(channel, thread_ts))
    if not raw:
        return None
    jobs: list[tuple[str, JobPayload | None]] = []
    for job_id, text in raw.items():
        job = job_id.decode() if isinstance(job_id, bytes) else str(job_id)
        try:
            payload: JobPayload | None = parse_payload(json.loads(text))
        except (ValueError, TypeError, KeyError, BenchbotError):
            payload = None
        jobs.append((job, payload))
    jobs.sort(key=lambda pair: int(pair[0]) if pair[0].isdigit() else 0)
    return ThreadContext(channel, thread_ts, tuple(jobs))


def job_runs(r: redis_lib.Redis, job_id: str) -> tuple[str, ...]:
    """The runs a job's result named (none while it runs, or when it failed)."""
    for event in reversed(events.job_events(r, job_id)):
        if event.type == events.SUCCEEDED:
            return run_ids_of(parse_outcome(event.data))
    return ()


class ThreadTalk:
    """Answers a mention in a thread through the one dispatcher."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.redis = dispatcher.redis

    def answer(self, user: str, channel: str, thread_ts: str | None, text: str) -> Reply:
        """The Reply to ``@benchbot <text>`` in the thread ``thread_ts`` (None: not in a thread)."""
        verb, _, rest = text.strip().partition(" ")
        verb = verb.lower() or "help"
        rest = rest.strip()
        if verb not in SLASH_EQUIVALENT:
            return refused(f'"{verb[:40]}" is not something benchbot does in a thread.\n{THREAD_HELP}')
        if verb == "help":
            return Reply(ok=True, kind="help", text=THREAD_HELP)
        context = thread_context(self.redis, channel, thread_ts) if thread_ts else None
        if context is None:
            spec = COMMANDS[SLASH_EQUIVALENT[verb]]
            return refused(
                "this is not a benchbot job's thread, so there is no job to go on from. "
                f"Use the slash command instead: {spec.syntax}"
            )
        try:
            return getattr(self, f"_{verb}")(user, channel, context, rest)
        except BenchbotError as exc:
            return refused(str(exc))

    # ------------------------------------------------------------------ helpers

    def run_of(self, context: ThreadContext) -> str:
        """The thread's newest run."""
        for job_id, _ in reversed(context.jobs):
            run_ids = job_runs(self.redis, job_id)
            if run_ids:
                return run_ids[-1]
        raise BenchbotError("this thread has no run yet: its job has not finished a bench or eval")

    def _parsed(self, user: str, channel: str, name: str, text: str) -> Reply:
        return self._dispatch(user, channel, parse_command(name, text, self.dispatcher.config))

    def _dispatch(self, user: str, channel: str, request: Request | ParseError) -> Reply:
        if isinstance(request, ParseError):
            return refused(request.message)
        return self.dispatcher.dispatch(user, channel, request)

    @staticmethod
    def _on_host(text: str, context: ThreadContext) -> str:
        """The text with ``on HOST`` of the thread's job, unless it names a host itself."""
        if "on" in text.split() or context.host is None:
            return text
        return f"{text} on {context.host}".strip()

    # ------------------------------------------------------------------ verbs

    def _again(self, user: str, channel: str, context: ThreadContext, rest: str) -> Reply:
        previous = context.bench()
        if previous is None:
            raise BenchbotError('this thread\'s job ran no bench: ask for one with "@benchbot bench 1,8"')
        if previous.rates:
            base = "rate=" + ",".join(f"{rate:g}" for rate in previous.rates)
        elif previous.levels:
            base = ",".join(str(level) for level in previous.levels)
        else:
            raise BenchbotError('an SLO search is not repeated with "again": write "@benchbot bench slo ..."')
        words = rest.split()
        own_levels = bool(words) and "=" not in words[0] and words[0][:1].isdigit()
        asked = parse_command(
            "bench", self._on_host(rest if own_levels else f"{base} {rest}", context), self.dispatcher.config
        )
        plain = parse_command("bench", self._on_host(words[0] if own_levels else base, context), self.dispatcher.config)
        if isinstance(asked, ParseError) or isinstance(plain, ParseError):
            return self._dispatch(user, channel, asked if isinstance(asked, ParseError) else plain)
        assert isinstance(asked, BenchRequest) and isinstance(plain, BenchRequest)
        # What the person wrote wins; everything else is the thread's bench as it was.
        changed = {
            f.name: getattr(asked.spec, f.name)
            for f in fields(BenchSpec)
            if getattr(asked.spec, f.name) != getattr(plain.spec, f.name)
        }
        spec = replace(previous, levels=asked.spec.levels, rates=asked.spec.rates, **changed)
        return self.dispatcher.dispatch(user, channel, replace(asked, spec=spec))

    def _bench(self, user: str, channel: str, context: ThreadContext, rest: str) -> Reply:
        return self._parsed(user, channel, "bench", self._on_host(rest, context))

    def _eval(self, user: str, channel: str, context: ThreadContext, rest: str) -> Reply:
        return self._parsed(user, channel, "eval", self._on_host(rest, context))

    def _compare(self, user: str, channel: str, context: ThreadContext, rest: str) -> Reply:
        if rest.lower() in ("", "baseline"):
            return self.dispatcher.handle_action(user, channel, "compare_baseline", self.run_of(context))
        named = rest.replace(",", " ").split()
        text = rest if len(named) > 1 else f"{self.run_of(context)} {rest}"
        return self._parsed(user, channel, "compare", text)

    def _tag(self, user: str, channel: str, context: ThreadContext, rest: str) -> Reply:
        if len(rest.split()) != 1:
            raise BenchbotError('tag this thread\'s run with one word, e.g. "@benchbot tag baseline"')
        return self._parsed(user, channel, "runs", f"tag {self.run_of(context)} {rest}")

    def _cancel(self, user: str, channel: str, context: ThreadContext, rest: str) -> Reply:
        for job_id, _ in reversed(context.jobs):
            if not events.is_terminal(self.redis, job_id):
                return self.dispatcher.dispatch(user, channel, CancelRequest(job_id=job_id))
        raise BenchbotError("nothing of this thread is queued or running any more")

    def _notes(self, user: str, channel: str, context: ThreadContext, rest: str) -> Reply:
        run_id = self.run_of(context)
        text = notes.format_notes(run_id, notes.notes_of(self.redis, run_id))
        return Reply(ok=True, kind="notes", text=text, ephemeral=False, data={"run": run_id})

    def _why(self, user: str, channel: str, context: ThreadContext, rest: str) -> Reply:
        for job_id, _ in reversed(context.jobs):
            failed = [e for e in events.job_events(self.redis, job_id) if e.type == events.FAILED]
            if failed:
                data = FailedData.from_dict(failed[-1].data)
                diagnosis = data.diagnosis or {}
                lines = [f"Job #{job_id} failed: {diagnosis.get('summary') or data.message or 'no details'}"]
                if diagnosis.get("category"):
                    lines.append(f"diagnosis: {diagnosis['category']}")
                if diagnosis.get("evidence_line"):
                    lines.append(f"evidence: {diagnosis['evidence_line']}")
                if data.log_tail:
                    lines += ["log excerpt:", *data.log_tail[-20:]]
                return Reply(ok=True, kind="why", text="\n".join(lines), ephemeral=False, job_id=job_id)
        raise BenchbotError("nothing in this thread failed, so there is nothing to explain")

    def _plot(self, user: str, channel: str, context: ThreadContext, rest: str) -> Reply:
        metric = rest.lower().strip()
        if metric not in PLOT_KINDS:
            raise BenchbotError(f'plot one of {", ".join(PLOT_KINDS)}, e.g. "@benchbot plot ttft"')
        from bot import plots  # matplotlib is imported only when a plot is drawn

        record = store.get_run(self.redis, self.run_of(context))
        drawn = plots.draw_bench(record, store.baseline_for(self.redis, record.host), Path(self.dispatcher.plots_dir))
        chosen = [str(info.path) for info in drawn if info.kind == PLOT_KINDS[metric]]
        if not chosen:
            raise BenchbotError(f"{record.id} has nothing to plot for {metric} (no GPU telemetry was recorded)")
        return Reply(ok=True, kind="compare", text=f"{metric} of {record.id}", ephemeral=False, files=tuple(chosen))
