"""Events, observations and job listings -> plain text (console, ``say``, Slack fallbacks).

Block Kit lives in ``bot/blocks.py``; the sentences both say come from ``bot/sentences.py`` (here in its
plain :data:`~bot.sentences.PLAIN` style), so the two never disagree.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from bot.sentences import (
    PLAIN,
    cancelled_words,
    diagnosis_words,
    diff_words,
    invalid_words,
    job_line,
    launched_by_words,
    measures_words,
    run_words,
    unmanaged_words,
)
from workers.engines import registry
from workers.jobs import eta
from workers.jobs.events import (
    CancelledData,
    Event,
    EventType,
    FailedData,
    JobState,
    ProgressData,
    QueuedData,
    StartedData,
)
from workers.jobs.outcomes import (
    BenchOutcome,
    EvalOutcome,
    LaunchOutcome,
    ReadyData,
    StopOutcome,
    SweepOutcome,
    parse_outcome,
)
from workers.jobs.payloads import Expectation, JobKind, JsonValue
from workers.jobs.presence import HostService
from workers.jobs.queue import JobInfo
from workers.observation import UNREAD_TABLE, ObservedState, RunningConfig
from workers.tune.outcome import TuneOutcome
from workers.tune.report import outcome_text


@dataclass(frozen=True)
class HostStatus:
    """One host in ``/status``: a fresh observation, else the last stored one, and the job holding it."""

    host: str
    port: int
    fresh: RunningConfig | None = None
    last: RunningConfig | None = None
    running_job: JobInfo | None = None
    service: HostService | None = None  # who serves the host: no worker, or one that cannot reach it
    #: Past this age (the config's ``observation_stale_s``) the stored observation is shown as stale.
    stale_after_s: float | None = None
    #: The groups the host is in and the gang job holding it, if any (bot/group_status.py); "" for most hosts.
    group_line: str = ""

    @property
    def stale(self) -> bool:
        """No fresh answer and the stored observation is older than the bound (or has no time)."""
        if self.fresh is not None or self.last is None or self.stale_after_s is None:
            return False
        return not self.last.observed_at or time.time() - self.last.observed_at > self.stale_after_s

    def to_dict(self) -> dict[str, JsonValue]:
        """The ``--json`` shape (``data.hosts[]``)."""
        return {
            "host": self.host,
            "port": self.port,
            "service": self.service.to_dict() if self.service is not None else None,
            "fresh": self.fresh.to_dict() if self.fresh is not None else None,
            "last": self.last.to_dict() if self.last is not None else None,
            "running_job": asdict(self.running_job) if self.running_job is not None else None,
            "age_s": self.age_s,
            "stale": self.stale,
            "group": self.group_line or None,
        }

    @property
    def age_s(self) -> float | None:
        """How old the observation shown is (0-ish when fresh); None when never observed."""
        seen = self.fresh or self.last
        return round(max(0.0, time.time() - seen.observed_at), 3) if seen and seen.observed_at else None


def ago(ts: float | None, now: float | None = None) -> str:
    """``"3 min ago"`` for a unix time."""
    if not ts:
        return "at an unknown time"
    seconds = max(0, int((now or time.time()) - ts))
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min ago"
    return f"{seconds // 86400} d ago"


def queued_text(data: Mapping[str, object]) -> str:
    """``@alice: launch nextn cudnn on gpu-1, queued #17, 2 ahead``; a bench or eval adds what it measures."""
    ahead = data.get("ahead")
    line = job_line(
        PLAIN,
        user=str(data["user"]),
        summary=str(data["summary"]),
        host=str(data["host"]),
        job_id=data["job_id"],
        ahead=ahead if isinstance(ahead, int) else 0,
    )
    wait_s = data.get("eta_s")
    if isinstance(wait_s, int | float) and isinstance(ahead, int) and ahead > 0:
        line += f", {eta.eta_words(wait_s)}"
    measures = data.get("measures")
    if isinstance(measures, Mapping):
        expect = measures.get("expect")
        line += "\n" + measures_words(PLAIN, Expectation.from_dict(expect if isinstance(expect, Mapping) else None))
    return line


def _gib(mib: float) -> str:
    return f"{mib / 1024:.0f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def _gpu_lines(config: RunningConfig) -> list[str]:
    gpus = config.gpus
    if not gpus:
        return []
    used = sum(g.memory_used_mib or 0 for g in gpus)
    total = sum(g.memory_total_mib or 0 for g in gpus)
    line = f"GPUs: {len(gpus)} x {gpus[0].name}, memory {used / 1024:.0f}/{total / 1024:.0f} GiB"
    return [line]


def config_lines(config: RunningConfig) -> list[str]:
    """What runs, as observed: the server's own config, process, instance, GPUs."""
    state = config.state
    port = config.port
    process = config.process
    if state == ObservedState.NONE or process is None:
        unread = config.extra.get(UNREAD_TABLE)
        lines = [
            f"nothing listens on port {port}, but the host's process table could not be read ({unread}): "
            "an engine still loading would not show"
            if unread is not None
            else f"nothing on port {port}"
        ]
        held = config.gpu_processes
        if held:
            pids = ", ".join(str(p) for p in list(held)[:6])
            lines.append(f"GPU memory still held by other processes: {_gib(sum(held.values()))} (pids {pids})")
        return lines + _gpu_lines(config)
    server = config.server
    argv = " ".join(process.argv)
    owner = f" as {config.owner_user}" if config.owner_user else ""
    if not config.engine_kind and state != ObservedState.RUNNING:
        return [
            f"port {port} is held by pid {process.pid}{owner}, which is not an engine benchbot can "
            f"identify ({state}): {argv[:300]}",
            *_gpu_lines(config),
        ]
    lines = []
    if config.managed and config.launched_by is not None:
        lines.append(f"{launched_by_words(PLAIN, config.launched_by)} {ago(config.launched_by.at)}")
    elif config.managed is False:
        lines.append(unmanaged_words(PLAIN))
    if state == ObservedState.LOADING:
        lines.append(
            f"LOADING: an engine bound for port {port} is starting up and does not listen yet "
            f"(pid {process.pid}{owner}, started {ago(process.start_time)}); it owns "
            "the port: no other engine will be started over it"
        )
    elif state == ObservedState.UNRESPONSIVE:
        lines.append(
            f"NOT ANSWERING: pid {process.pid}{owner} holds port {port} but did not answer"
            f"{' (' + config.detail + ')' if config.detail else ''}: it may be stopped, hung or overloaded; "
            "its config cannot be read now"
        )
    else:
        lines.append(f"config: {config.summary or 'unknown'}")
        if state == ObservedState.STARTING:  # answers, not ready: SGLang's warm-up until /health passes
            lines.append(
                f"WARMING UP: pid {process.pid}{owner} answers on port {port} but is not ready yet"
                f"{' (' + config.detail + ')' if config.detail else ''}; nothing is benchmarked on it until "
                "its health check passes"
            )
        elif state != ObservedState.RUNNING:
            lines.append(f"state: {state}")
    version = (server.version if server else None) or config.engine_version or "?"
    model = (
        (server.model_path if server else None)
        or config.launch_args.get("--model-path")
        or config.launch_args.get("--model")
        or "?"
    )
    kind = registry.family(config.engine_kind)  # the observed process's engine (vllm-sim: vllm)
    lines.append(f"engine: {kind} {version}, model {model}")
    cache = config.extra.get("cache_config")
    if isinstance(cache, dict) and cache.get("num_gpu_blocks"):
        lines.append(f"KV cache (the server's own): {_kv_cache(cache)}")
    if state != ObservedState.LOADING:
        lines.append(f"fingerprint {config.fingerprint or '-'}, instance {config.instance_id or '-'}")
    lines.append(f"pid {process.pid}{owner} started {ago(process.start_time)}: {argv[:400]}")
    if config.owner_gpu_mib is not None:
        lines.append(f"GPU memory held by this engine: {_gib(config.owner_gpu_mib)}")
    return lines + _gpu_lines(config)


def _kv_cache(cache: Mapping[str, object]) -> str:
    """``32,768 blocks of 16 tokens (524,288 tokens), auto dtype, prefix caching on`` from vLLM's cache info."""
    blocks, size = str(cache.get("num_gpu_blocks")), str(cache.get("block_size"))
    text = f"{blocks} blocks"
    if blocks.isdigit() and size.isdigit():
        text = f"{int(blocks):,} blocks of {size} tokens ({int(blocks) * int(size):,} tokens)"
    if cache.get("cache_dtype"):
        text += f", {cache['cache_dtype']} dtype"
    if cache.get("enable_prefix_caching") in ("True", "False"):
        text += f", prefix caching {'on' if cache['enable_prefix_caching'] == 'True' else 'off'}"
    return text


def service_line(host: str, service: HostService | None) -> str | None:
    """What is wrong with who serves ``host`` (no worker, or a worker that cannot reach it); None when fine."""
    if service is None:
        return None
    if not service.served:
        return f"no worker is serving {host}: its jobs wait until one starts (`benchbot worker --host {host}`)"
    if service.connect_error:
        return f"the worker serving {host} cannot reach it ({ago(service.error_at)}): {service.connect_error}"
    return None


#: Jobs that stop the host's engine and start another: while one runs, "nothing on port" may be the moment
#: between the two (the long soak saw it: docs/reliability.md section 8).
ENGINE_STARTING_KINDS = frozenset({JobKind.LAUNCH, JobKind.SWEEP, JobKind.TUNE})


def _between_engines(seen: RunningConfig | None, running: JobInfo) -> bool:
    """True when ``seen`` shows nothing on the port while ``running`` is a job that replaces the engine."""
    empty = seen is not None and (seen.state == ObservedState.NONE or seen.process is None)
    return empty and running.kind in ENGINE_STARTING_KINDS


def status_text(views: Iterable[HostStatus]) -> str:
    """``/status``: per host, the fresh observation, or the last one with its age."""
    blocks = []
    for view in views:
        head = f"{view.host} (port {view.port})"
        running = view.running_job
        job_line = f"  running job: #{running.job_id} {running.summary} (@{running.user})" if running else ""
        if running is not None and _between_engines(view.fresh or view.last, running):
            job_line += ": it stops and starts this host's engine, so the port is empty between one and the next"
        problem = service_line(view.host, view.service)
        if view.fresh is not None:
            body = [f"  {line}" for line in config_lines(view.fresh)]
        elif view.last is not None and view.stale_after_s is not None and not view.stale and not problem:
            # Kept fresh by the host's observer: answered from Redis, with its age (never passed off as new).
            body = [f"  observed {ago(view.last.observed_at)}:"] + [f"    {line}" for line in config_lines(view.last)]
        elif view.last is not None:
            last = view.last
            why = problem or "no worker answered now (the host or its engine may not be answering)"
            stale = "STALE: " if view.stale else ""
            body = [f"  {stale}{why}; as last observed {ago(last.observed_at)}, which may no longer hold:"]
            body += [f"    {line}" for line in config_lines(last)]
        elif problem:
            body = [f"  {problem}; never observed"]
        else:
            body = [
                "  no worker is serving this host and it was never observed: start `benchbot worker --host "
                f"{view.host}`"
            ]
        extra = [line for line in (job_line, f"  {view.group_line}" if view.group_line else "") if line]
        blocks.append("\n".join([head, *body, *extra]))
    return "\n\n".join(blocks)


def queue_text(
    listing: Mapping[str, list[JobInfo]],
    services: Mapping[str, HostService] | None = None,
    etas: Mapping[str, float] | None = None,
) -> str:
    """``/queue``: running and queued jobs per host (and, given ``services``, a host nobody can serve; given
    ``etas``, when each waiting job should start: :func:`workers.jobs.eta.waits_s`)."""
    out = []
    for host, jobs in listing.items():
        problem = service_line(host, (services or {}).get(host))
        if not jobs:
            out.append(f"{host}: idle, nothing queued" + (f"; {problem}" if problem else ""))
            continue
        out.append(f"{host}:" + (f" {problem}" if problem else ""))
        for job in jobs:
            ahead = int(job.position or 1) - 1  # as enqueue counts: every unfinished job before it
            if job.state == JobState.RUNNING:
                where = "running"
            elif job.state == JobState.WAITING:
                where = "next, waiting for the host"
            else:
                where = "queued, next in line" if ahead == 0 else f"queued, {ahead} ahead"
            if job.state != JobState.RUNNING and etas and job.job_id in etas:
                where += f", {eta.eta_words(etas[job.job_id])}"
            out.append(f"  #{job.job_id} {where}: {job.summary} (@{job.user})")
    return "\n".join(out)


def diagnosis_lines(diagnosis: Mapping[str, object] | None) -> list[str]:
    """A failed launch, explained: category, the line that says so, what to try."""
    if not diagnosis:
        return []
    category, summary = str(diagnosis.get("category", "unknown")), str(diagnosis.get("summary", ""))
    lines = [f"diagnosis: {diagnosis_words(PLAIN, category, summary)}"]
    if diagnosis.get("evidence_line"):
        lines.append(f"  log: {diagnosis['evidence_line']}")
    return lines


def event_text(event: Event) -> str:
    """One job event as a line (or a few), for ``say --wait`` and the console."""
    kind = event.type
    data = event.data
    job = event.job
    if kind == EventType.QUEUED:
        queued = QueuedData.from_dict(data)
        return f"[#{job}] queued: {queued.summary} ({queued.ahead} ahead)"
    if kind == EventType.STARTED:
        return f"[#{job}] started on {StartedData.from_dict(data).worker or 'a worker'}"
    if kind == EventType.PROGRESS:
        progress = ProgressData.from_dict(data)
        return f"[#{job}] {progress.phase}: {progress.message}"
    if kind == EventType.READY:
        ready = ReadyData.from_dict(data)
        lines = [f"[#{job}] READY. Verified running config:"]
        if ready is None:
            return lines[0]
        lines += [f"    {line}" for line in config_lines(ready.config)]
        for diff in ready.diff:
            lines.append(f"    ! {diff_words(PLAIN, diff)}")
        if ready.replaced is not None:
            lines.append(f"    replaced: {ready.replaced.config.summary} ({ready.replaced.how})")
        return "\n".join(lines)
    if kind == EventType.SUCCEEDED:
        return f"[#{job}] done. " + succeeded_text(data)
    if kind == EventType.FAILED:
        failed = FailedData.from_dict(data)
        lines = [f"[#{job}] FAILED: {failed.message}"]
        lines += [f"    {line}" for line in diagnosis_lines(failed.diagnosis)]
        tail = failed.log_tail
        if tail:
            lines.append("    last log lines:")
            lines += [f"      {line}" for line in tail[-8:]]
        return "\n".join(lines)
    if kind == EventType.CANCELLED:
        cancelled = CancelledData.from_dict(data)
        return f"[#{job}] {cancelled_words(PLAIN, cancelled.by or '?', cancelled.done)}"
    return f"[#{job}] {kind}: {data}"


def eval_lines(outcome: EvalOutcome) -> list[str]:
    """An accuracy check: the verdict (``!`` before a red flag), how it was decided, the first wrong answers."""
    lines = [("! " if outcome.flagged else "") + outcome.summary]
    if outcome.detail:
        lines.append(f"  {outcome.detail}")
    for wrong in outcome.wrong:
        reply = f": {wrong.reply[:80]!r}" if wrong.reply else ""
        lines.append(f"  wrong {wrong.id}: {wrong.reason}{reply}")
    return lines


def succeeded_text(data: Mapping[str, object]) -> str:
    """The closing summary of a job (its result, read through its typed shape)."""
    outcome = parse_outcome(data)
    if isinstance(outcome, TuneOutcome):
        return outcome_text(outcome)
    if isinstance(outcome, StopOutcome):
        return outcome.message or "stopped"
    if isinstance(outcome, EvalOutcome):
        text = run_words(PLAIN, outcome.run_id)
        if not outcome.valid:
            text += f" ({invalid_words(PLAIN, outcome.invalid_reason)})"
        return "\n".join([text, *eval_lines(outcome)])
    if isinstance(outcome, LaunchOutcome) and outcome.bench is None:
        text = f"launched: {outcome.config.summary}"
        if outcome.eval is not None:
            text += f"; {run_words(PLAIN, outcome.eval.run_id)}\n" + "\n".join(eval_lines(outcome.eval))
        return text
    if isinstance(outcome, (BenchOutcome, LaunchOutcome)):
        bench = outcome if isinstance(outcome, BenchOutcome) else outcome.bench
        assert bench is not None
        text = run_words(PLAIN, bench.run_id)
        if not bench.valid:
            text += f" ({invalid_words(PLAIN, bench.invalid_reason)})"
        if bench.table:
            text += "\n" + bench.table
        if isinstance(outcome, LaunchOutcome) and outcome.eval is not None:
            text += "\n" + "\n".join(eval_lines(outcome.eval))
        return text
    if isinstance(outcome, SweepOutcome):
        lines = [f"sweep {outcome.sweep_id}:"]
        for cell in outcome.cells:
            if cell.ok:
                line = f"  {cell.label}: {run_words(PLAIN, cell.run_id or '?')}"
                if cell.eval is not None:
                    line += f"; {'! ' if cell.eval.flagged else ''}{cell.eval.summary}"
                elif cell.eval_error:
                    line += f"; the eval failed: {cell.eval_error}"
                lines.append(line)
            else:
                category = (cell.diagnosis or {}).get("category", "failed")
                lines.append(f"  {cell.label}: FAILED ({category}) {cell.message}")
        if outcome.table:
            lines.append(outcome.table)
        return "\n".join(lines)
    return str(data)
