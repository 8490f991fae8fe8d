"""RQ job functions: launch, stop, bench and sweep, each under the host's exclusive lease.

``execute(payload)`` is what RQ runs. It builds a :class:`JobContext` (lease in queue order,
heartbeat, cancel flag, exactly one terminal event) and runs the job body in an event loop. The
bodies follow DESIGN.md's one idea: every launch ends with an observation of what really runs,
and every bench observes before and after and refuses to measure under a wrong label.

Fenced side effects (docs/reliability.md): every action on the host (a signal, the spawn, the smoke
request, each bench request) is preceded by ``ctx.check(point)`` / ``ctx.check_fence(point)``, a
lease check against Redis with a margin (a clock comparison while the last proof holds); a launch is
ready only when the process answering on the port is in the process group it spawned; and each body
ends with ``ctx.commit(result)``, which publishes ``succeeded`` unless a cancel came first, in which
case the body stops what it started and the job ends ``cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import redis

from workers import observer
from workers.benchmark.client import BenchParams, run_bench
from workers.benchmark.spec import BenchSpec
from workers.config import Config, HostConfig, load_config
from workers.engines.probe import EngineFacts, engine_facts, is_simulator
from workers.engines.sglang.diagnosis import Diagnosis, smoke_diagnosis, without_satisfied_hints
from workers.engines.sglang.flags import requested_args
from workers.engines.sglang.readiness import smoke_test, wait_ready
from workers.errors import BenchbotError, EngineError, LeaseLostError
from workers.host import engine_env, engine_stop
from workers.host.connect import open_transport
from workers.host.transport import HostFence, Transport, describe_argv
from workers.jobs import events, faults
from workers.jobs.context import JobCancelled, JobContext
from workers.presets import LaunchIntent, LaunchSpec, build_launch, check_launch
from workers.results import store, tables
from workers.results.labels import bench_label
from workers.results.record import RunRecord

T = TypeVar("T")


class LaunchFailed(EngineError):
    """The engine did not become ready; ``diagnosis`` says why (category, evidence, log tail)."""

    def __init__(self, message: str, diagnosis: dict[str, Any] | None) -> None:
        super().__init__(message)
        self.diagnosis = diagnosis


def diagnosis_dict(diagnosis: Diagnosis) -> dict[str, Any]:
    """The event/result shape of a diagnosis: the log tail as a list of lines (at most 40)."""
    data = diagnosis.to_dict()
    tail = data.get("log_tail") or ""
    data["log_tail"] = (tail.splitlines() if isinstance(tail, str) else list(tail))[-40:]
    return data


@dataclass
class JobState:
    """What this job started on the host, so a cancel or failure can clean it up."""

    started_pgid: int | None = None
    started_instance: str | None = None
    started_ticks: int = 0  # with the pid, what the host checks before signalling it
    fence: HostFence | None = None  # the claim it was started under


# ------------------------------------------------------------------ entry point


def execute(payload: dict[str, Any]) -> dict[str, Any]:
    """The RQ job: run ``payload['kind']`` under the lease; the body commits its own ``succeeded``."""
    config = load_config()
    with JobContext(lease_ttl_s=config.limits.lease_ttl_s, lease_margin_s=config.limits.lease_margin_s) as ctx:
        body = {"launch": launch_job, "bench": bench_job, "stop": stop_job, "sweep": sweep_job}[payload["kind"]]
        return asyncio.run(body(ctx, config, payload))


# ------------------------------------------------------------------ host operations


def host_fence(ctx: JobContext, host: HostConfig) -> HostFence:
    """This job's claim on the host, as the host-side actuator checks it before every side effect."""
    if ctx.fence is None:
        raise LeaseLostError("this job holds no lease on the host")
    return HostFence.for_port(host.log_dir, host.port, ctx.fence)


def owner_words(observed: dict[str, Any]) -> str:
    """``pid 123 (alice, job 17)`` / ``pid 123 (user bob, not started by benchbot)``: who owns the port."""
    process = observed.get("process") or {}
    who = observed.get("launched_by") or {}
    if observed.get("managed") and who:
        owner = f"started by {who.get('user')} with job {who.get('job')}"
    else:
        owner = f"user {observed.get('owner_user') or '?'}, not started by benchbot"
    since = process.get("start_time")
    age = f", up {max(0, int(time.time() - since)) // 60} min" if since else ""
    gpu = observed.get("owner_gpu_mib")
    held = f", holding {gpu / 1024:.0f} GiB of GPU memory" if gpu else ""
    return f"pid {process.get('pid')} ({owner}{age}{held})"


def refuse_foreign_owner(host: HostConfig, observed: dict[str, Any]) -> None:
    """A process benchbot cannot identify as an engine is never signalled: say who it is, change nothing."""
    process = observed.get("process") or {}
    argv = " ".join(process.get("argv") or [])[:200]
    raise BenchbotError(
        f"port {host.port} on {host.name} is held by {owner_words(observed)}, running `{argv}`, which is not an "
        "engine benchbot can identify, so benchbot will not stop it. Free the port (ask whoever runs it), or "
        "give the host another port in the config."
    )


async def free_port(
    ctx: JobContext,
    r: redis.Redis,
    host: HostConfig,
    transport: Transport,
    *,
    stop_loading: bool = False,
) -> dict[str, Any] | None:
    """Stop the engine that owns the engine port; return what it was (observed) or None when the port was free.

    Only an engine is stopped (benchbot's own, or an unmanaged one identified from its argv); anything else
    on the port is a refusal naming the process. An engine still loading (no listener yet) owns the port
    too: a launch refuses to start a second engine over it, ``/stop`` (``stop_loading``) stops it.
    """
    ctx.progress("observe", f"looking at what owns port {host.port} on {host.name}")
    before = await observer.observe_host(r, host, transport)
    process = before.get("process")
    if not process:
        return None
    if not before.get("engine_kind"):
        refuse_foreign_owner(host, before)
    if before.get("state") == "loading" and not stop_loading:
        raise BenchbotError(
            f"an engine is loading on {host.name} for port {host.port}: {owner_words(before)}. It owns the port "
            f"and the GPUs, so benchbot will not start a second engine over it. Wait until it is ready (then "
            f"/launch replaces it), or /stop {host.name} to stop it first."
        )
    owner = "benchbot's" if before.get("managed") else "an unmanaged"
    what = "loading engine" if before.get("state") == "loading" else "server"
    ctx.check(faults.BEFORE_SIGNAL)
    ctx.progress(
        "stop",
        f"stopping {owner} {what} on port {host.port} (pid {process['pid']}): "
        f"{before.get('summary') or 'unknown config'}",
    )
    pid = int(process["pid"])
    # its group only if benchbot created it (our launch record's instance); anyone else's engine: its pid
    how = await engine_stop.stop_engine(
        transport,
        host_fence(ctx, host),
        pid,
        int(process["start_ticks"]),
        group=bool(before.get("managed")) and process.get("pgid") == pid,
        before_signal=ctx.check_fence,
    )
    await wait_port_free(transport, host.port)
    return {"config": before, "how": how}


async def wait_port_free(transport: Transport, port: int, timeout_s: float = 15.0) -> None:
    """Wait until nobody listens on ``port`` (a dying server may hold it a moment longer)."""
    deadline = time.monotonic() + timeout_s
    while await transport.listener_pid(port) is not None:
        if time.monotonic() > deadline:
            raise EngineError(f"port {port} is still taken after stopping its server")
        await asyncio.sleep(0.1)


async def learn_engine(ctx: JobContext, host: HostConfig, transport: Transport) -> EngineFacts:
    """Which SGLang the host runs and its real options (recorded, cached, or dumped from the host), asked
    with the command of the engine this worker's config gives the host."""
    ctx.progress("engine", f"asking {host.name} which SGLang it runs")
    engine = host.engine
    facts = await engine_facts(
        ctx.redis,
        transport,
        host.name,
        engine.command,
        version_command=engine.version_command,
        engine=engine.kind,
        # The engine's configured env (PYTHONPATH, the simulator's version...), never the worker's secrets:
        # over SSH a command's env is on its command line, and pass_env may name a token.
        env=dict(engine.env),
    )
    if facts.note:
        ctx.progress("engine", facts.note)
    return facts


def compile_launch(
    ctx: JobContext, config: Config, host: HostConfig, intent: LaunchIntent, facts: EngineFacts
) -> LaunchSpec:
    """The argv for what the host really runs, refused now if that SGLang would refuse it.

    ``config`` is this worker's own: its presets, and ``host.engine`` (command, model, base flags) and
    ``host.port`` from its host table. The job carried only the intent, so a bot whose copy of the
    config differs cannot make the engine listen anywhere but where this worker will look for it.

    Each preset emits its block for the host's version; the result is checked against that version's
    real options (unknown flags, ambiguous prefixes, bad choices, reserved or admin-only flags) before
    anything on the host is stopped or started, so a bad flag costs a second, not a model load.
    """
    spec = build_launch(config, host, intent.presets, intent.raw_flags, version=facts.version)
    if facts.contract is None:
        return spec
    simulated = is_simulator(host.engine.command)
    problems = check_launch(
        spec,
        facts.contract,
        admin=config.access.is_admin(ctx.user),
        ignore=lambda flag: simulated and flag.startswith("--sim-"),
    )
    if problems:
        summary = f"{spec.label} cannot start on {host.name}: {' '.join(problems)} Nothing was stopped or started."
        raise LaunchFailed(
            summary, {"category": "config_error", "summary": summary, "evidence_line": problems[0], "log_tail": []}
        )
    return spec


async def launch_engine(
    ctx: JobContext,
    r: redis.Redis,
    host: HostConfig,
    transport: Transport,
    spec: LaunchSpec,
    state: JobState,
    log_tag: str = "",
    facts: EngineFacts | None = None,
) -> dict[str, Any]:
    """Free the port, spawn the engine detached, watch it to ready, smoke-test it, observe it."""
    contract = facts.contract if facts is not None else None
    replaced = await free_port(ctx, r, host, transport)
    ctx.check()
    log_path = f"{host.log_dir.rstrip('/')}/engine-{host.name}-job{ctx.job_id}{log_tag}.log"
    fence = host_fence(ctx, host)
    private = engine_env.private_options(host.engine)  # the API key: a 0600 file named by --config, never argv
    ctx.progress("spawn", f"starting {spec.label} on {host.name} (log {log_path})")
    ctx.check(faults.BEFORE_SPAWN)
    faults.pause_at(faults.SPAWN_AFTER_CHECK, ctx.job_id)  # a pause here outlives the Redis check's proof
    env = engine_env.engine_env(host, spec)
    spawned = await transport.spawn_engine(
        engine_env.engine_argv(spec, fence, private),
        log_path=log_path,
        fence=fence,
        env=env,
        private_options=private,
        secrets=engine_env.log_secrets(host.engine),
    )
    state.started_pgid, state.started_ticks, state.fence = spawned.pgid, spawned.start_ticks, fence
    state.started_instance = f"{host.name}:{spawned.pid}:{spawned.start_ticks}"
    observer.record_launched(
        r,
        host.name,
        ctx.fence,
        {
            "instance_id": state.started_instance,
            "pid": spawned.pid,
            "user": ctx.user,
            "job": ctx.job_id,
            "at": time.time(),
            "label": spec.label,
            "log_path": log_path,
            "argv_flags": spec.to_dict()["flags"],
        },
    )
    ctx.progress("watch", f"waiting for {host.base_url}/health (pid {spawned.pid})")
    log_offset = 0

    async def is_alive() -> bool:
        if await transport.is_alive(spawned.pid):
            return True
        await transport.wait_log_written(spawned)  # its last words reach the log through the scrubber
        return False

    async def read_new_log() -> str:
        nonlocal log_offset
        text, log_offset = await transport.read_log(log_path, log_offset)
        return text

    async def foreign_listener() -> str | None:
        return await who_else_listens(transport, host.port, spawned.pgid)

    try:
        outcome = await ctx.guard(
            wait_ready(
                host.base_url,
                deadline_s=host.engine.launch_timeout_s,
                is_alive=is_alive,
                read_new_log=read_new_log,
                api_key=host.engine.api_key(),
                gate=ctx.check_fence,
                foreign_listener=foreign_listener,
                contract=contract,
            )
        )
    finally:
        if private:  # ready or dead: it has read its options, and the key must not wait on disk
            with contextlib.suppress(BenchbotError):
                await transport.remove_engine_config(fence)
    if isinstance(outcome, Diagnosis):
        await kill_started(ctx, transport, state)
        outcome = without_satisfied_hints(outcome, env)
        raise LaunchFailed(f"{spec.label} failed to start: {outcome.summary}", diagnosis_dict(outcome))
    ctx.progress("smoke", "checking a generation is not garbage")
    ctx.check(faults.BEFORE_SMOKE)
    smoke = await ctx.guard(smoke_test(host.base_url, api_key=host.engine.api_key()))
    if not smoke.ok:
        tail = await transport.tail(log_path, 40)
        await kill_started(ctx, transport, state)
        diagnosis = diagnosis_dict(smoke_diagnosis(smoke, "\n".join(tail)))
        diagnosis["summary"] += " benchbot stopped it so nobody benchmarks garbage."
        raise LaunchFailed(f"{spec.label} answers garbage ({smoke.reason})", diagnosis)
    ctx.progress("observe", "reading the config the server reports")
    running = await observer.observe_host(r, host, transport)
    requested = requested_args(dict(spec.flags))
    observed_args = (running.get("server") or {}).get("args") or {}
    from workers.observation import diff_requested

    diff = [asdict(d) for d in diff_requested(requested, observed_args)]
    ready = {
        "config": running,
        "diff": diff,
        "replaced": replaced,
        "launch": spec.to_dict(),
        "smoke": {"text": smoke.text, "completion_tokens": smoke.completion_tokens},
        "engine": {"version": facts.version if facts else None, "checked_against": facts.source if facts else "none"},
    }
    ctx.ready(ready)
    return ready


async def who_else_listens(transport: Transport, port: int, our_pgid: int) -> str | None:
    """None when the process listening on ``port`` is in our spawned process group; else who it is."""
    pid = await transport.listener_pid(port)
    if pid is None:
        return "a process benchbot cannot see (another user's?)"
    info = await transport.process_info(pid)
    if info is not None and info.pgid == our_pgid:
        return None
    argv = describe_argv(info.argv) if info is not None and info.argv else "argv unknown"
    return f"another process (pid {pid}: {argv})"


async def kill_started(ctx: JobContext, transport: Transport, state: JobState) -> None:
    """Stop the server this job started (after a failure or a cancel), if the host is still ours.

    Without the lease it sends nothing: the next holder finds the server through the launch record
    (``stop_half_started``) or on the port.
    """
    if state.started_pgid is None or state.fence is None:
        return
    pgid, state.started_pgid = state.started_pgid, None
    try:
        ctx.check_fence(faults.BEFORE_SIGNAL)
    except LeaseLostError:
        return
    with contextlib.suppress(Exception):
        if await transport.is_alive(pgid):
            await engine_stop.stop_engine(
                transport, state.fence, pgid, state.started_ticks, group=True, grace_s=5, before_signal=ctx.check_fence
            )


# ------------------------------------------------------------------ benchmarks


def check_expectation(
    expect: dict[str, Any] | None, observed: dict[str, Any], launched: dict[str, Any] | None
) -> str | None:
    """Why the running server is not the one the requester meant, or None when it is."""
    if not expect:
        return None
    label = observed.get("summary") or "an unknown config"
    if expect.get("nothing_running"):
        return f"nothing was running when you asked, and now {label} runs: it is not the server you meant to measure"
    if expect.get("after_job"):
        if (
            not launched
            or launched.get("job") != expect["after_job"]
            or launched.get("instance_id") != observed.get("instance_id")
        ):
            return (
                f"you asked to bench after your launch (job {expect['after_job']}), but the server now on "
                f"the port is {label}, not the one that job started"
            )
        return None
    if expect.get("fingerprint") and expect["fingerprint"] != observed.get("fingerprint"):
        return (
            f"the server changed since you asked: you asked while {expect.get('label') or 'another config'} "
            f"({expect['fingerprint']}) was running; now it is {label} ({observed.get('fingerprint')})"
        )
    return None


async def run_bench_measured(
    ctx: JobContext,
    r: redis.Redis,
    host: HostConfig,
    transport: Transport,
    spec: BenchSpec,
    *,
    expect: dict[str, Any] | None,
    label: str | None = None,
    kind: str = "bench",
    sweep_id: str | None = None,
) -> dict[str, Any]:
    """Observe, check it's the config meant, bench every level, observe again, store the run."""
    ctx.progress("observe", "observing the server before the bench")
    before = await observer.observe_host(r, host, transport)
    if before.get("state") == "loading":
        raise BenchbotError(
            f"the engine on {host.name}:{host.port} is still loading ({owner_words(before)}): "
            "bench it once it is ready (/status shows when)"
        )
    if before.get("state") != "running":
        raise BenchbotError(
            f"nothing is serving on {host.name}:{host.port} ({before.get('state')}): "
            "/launch first, or /status to see what is there"
        )
    mismatch = check_expectation(expect, before, observer.launched_record(r, host.name))
    if mismatch:
        raise BenchbotError(
            f"refusing to benchmark under a wrong label: {mismatch}. "
            "Run /bench again, or add 'any' to measure whatever runs."
        )
    params = BenchParams(
        levels=spec.levels,
        input_len=spec.input_len,
        output_len=spec.output_len,
        num_requests=spec.num_requests,
        warmup=spec.warmup,
        api_key=host.engine.api_key(),
    )

    def on_progress(message: str) -> None:
        ctx.progress("bench", message)

    ctx.check(faults.BEFORE_BENCH)
    levels = await ctx.guard(run_bench(host.base_url, params, on_progress=on_progress, gate=ctx.request_gate()))
    ctx.progress("observe", "observing the server after the bench")
    after = await observer.observe_host(r, host, transport)
    valid, reason = True, None
    if after.get("instance_id") != before.get("instance_id"):
        valid = False
        reason = (
            f"the server changed during the bench: instance {before.get('instance_id')} became "
            f"{after.get('instance_id') or 'nothing'}"
        )
    elif after.get("fingerprint") != before.get("fingerprint"):
        valid = False
        reason = "the server's config changed during the bench"
    record = RunRecord(
        id=store.new_run_id(r),
        job_id=ctx.job_id,
        user=ctx.user,
        host=host.name,
        created_at=time.time(),
        label=label or bench_label(before, store.baseline_for(r, host.name)),
        tags=(),
        kind=kind,
        sweep_id=sweep_id,
        config=before,
        config_after=after,
        valid=valid,
        invalid_reason=reason,
        params=spec.to_dict(),
        levels=tuple(level.metrics.to_dict() for level in levels),
        status="ok",
        diagnosis=None,
    )
    ctx.check()  # a cancelled (or no longer fenced) bench stores nothing
    run_id = store.save_run(r, record)
    return {"run_id": run_id, "valid": valid, "invalid_reason": reason, "table": tables.format_levels_table(record)}


# ------------------------------------------------------------------ job bodies


def _reached_ready(r: redis.Redis, job_id: str, instance: str | None) -> bool:
    """True if ``job_id`` published ``ready`` for ``instance`` (its smoke test passed)."""
    return any(
        e.type == events.READY and (e.data.get("config") or {}).get("instance_id") == instance
        for e in events.job_events(r, job_id)
    )


async def stop_half_started(ctx: JobContext, config: Config, host: HostConfig, transport: Transport) -> None:
    """Stop a server whose launching job ended before it was ready (its worker was killed, it timed out).

    Nobody verified such a server, so nobody may measure it; and only the next job on the host, under
    the lease, can safely touch it. Found through the launch record (pid + start tick, so a reused pid
    is never hit), whether or not it listens on the port yet.
    """
    r = ctx.redis
    record = observer.launched_record(r, host.name)
    if not record or str(record.get("job")) == ctx.job_id:
        return
    job, instance = str(record.get("job")), record.get("instance_id")
    ending = events.terminal_type(r, job)
    if ending in (None, events.SUCCEEDED) or _reached_ready(r, job, instance):
        return
    pid = int(record.get("pid") or 0)
    info = await transport.process_info(pid) if pid and await transport.is_alive(pid) else None  # not a zombie
    if info is None or f"{host.name}:{info.pid}:{info.start_ticks}" != instance:
        return
    ctx.check(faults.BEFORE_SIGNAL)
    ctx.progress(
        "cleanup",
        f"found the server job {job} left half-started (pid {pid}; the job {ending} before "
        "the server was ready): stopping it, nobody verified it",
    )
    await engine_stop.stop_engine(
        transport,
        host_fence(ctx, host),
        pid,
        info.start_ticks,
        group=info.pgid == pid,
        grace_s=5,
        before_signal=ctx.check_fence,
    )
    ctx.fenced_set(observer.LAUNCHED_FIELD, None)


async def with_transport(
    host: HostConfig,
    body: Callable[[Transport], Awaitable[T]],
    *,
    ctx: JobContext | None = None,
    config: Config | None = None,
) -> T:
    """Open the host's transport for the job's duration (first clearing what a dead launch left)."""
    transport = open_transport(host)
    try:
        if ctx is not None and config is not None:
            await transport.claim_host(host_fence(ctx, host))  # the host now refuses older jobs' actions
            await stop_half_started(ctx, config, host, transport)
        return await body(transport)
    finally:
        with contextlib.suppress(Exception):
            await transport.close()


async def launch_job(ctx: JobContext, config: Config, payload: dict[str, Any]) -> dict[str, Any]:
    """``/launch``: launch, verify, and (``then bench``) benchmark under the same lease."""
    host = config.host(payload["host"])
    intent = LaunchIntent.from_dict(payload["launch"])
    state = JobState()

    async def body(transport: Transport) -> dict[str, Any]:
        try:
            facts = await learn_engine(ctx, host, transport)
            spec = compile_launch(ctx, config, host, intent, facts)
            ready = await launch_engine(ctx, ctx.redis, host, transport, spec, state, facts=facts)
            result: dict[str, Any] = {"kind": "launch", "config": ready["config"], "diff": ready["diff"]}
            if payload.get("bench"):
                expect = {"after_job": ctx.job_id}
                result["bench"] = await run_bench_measured(
                    ctx,
                    ctx.redis,
                    host,
                    transport,
                    BenchSpec.from_dict(payload["bench"]),
                    expect=expect,
                    label=spec.label,
                )
                result["kind"] = "launch+bench"
                result["run_id"] = result["bench"]["run_id"]
            ctx.commit(result)  # `succeeded` unless a cancel came first (JobCancelled: stop what we started)
            state.started_pgid = None  # success: the server stays up for the team
            return result
        except JobCancelled:
            await kill_started(ctx, transport, state)
            raise

    return await with_transport(host, body, ctx=ctx, config=config)


async def bench_job(ctx: JobContext, config: Config, payload: dict[str, Any]) -> dict[str, Any]:
    """``/bench``: benchmark what runs, if it is what the requester meant."""
    host = config.host(payload["host"])
    spec = BenchSpec.from_dict(payload["bench"])
    expect = None if payload.get("any") else payload.get("expect")

    async def body(transport: Transport) -> dict[str, Any]:
        measured = await run_bench_measured(ctx, ctx.redis, host, transport, spec, expect=expect)
        result = {"kind": "bench", **measured}
        ctx.commit(result)
        return result

    return await with_transport(host, body, ctx=ctx, config=config)


def stop_message(stopped: dict[str, Any]) -> str:
    """``stopped <what>``, with how only when it says more than "stopped" (never "stopped X (stopped)")."""
    what = stopped["config"].get("summary") or "the server"
    how = str(stopped.get("how") or "").removeprefix("stopped").lstrip("; ")
    return f"stopped {what}" + (f" ({how})" if how else "")


async def stop_job(ctx: JobContext, config: Config, payload: dict[str, Any]) -> dict[str, Any]:
    """``/stop``: stop whatever owns the engine port."""
    host = config.host(payload["host"])

    async def body(transport: Transport) -> dict[str, Any]:
        stopped = await free_port(ctx, ctx.redis, host, transport, stop_loading=True)
        if stopped is None:
            result = {"kind": "stop", "stopped": None, "message": f"nothing on port {host.port} of {host.name}"}
        else:
            result = {
                "kind": "stop",
                "stopped": stopped,
                "message": stop_message(stopped),
            }
        ctx.commit(result)
        return result

    return await with_transport(host, body, ctx=ctx, config=config)


async def sweep_cell(
    ctx: JobContext,
    config: Config,
    host: HostConfig,
    transport: Transport,
    launch: LaunchIntent,
    spec: BenchSpec,
    state: JobState,
    sweep_id: str,
    index: int,
    facts: EngineFacts,
) -> dict[str, Any]:
    """One config of a sweep: launch + bench. A failed launch or bench is a failed cell, not a failed sweep."""
    try:
        compiled = compile_launch(ctx, config, host, launch, facts)
        await launch_engine(ctx, ctx.redis, host, transport, compiled, state, log_tag=f"-cell{index}", facts=facts)
        measured = await run_bench_measured(
            ctx,
            ctx.redis,
            host,
            transport,
            spec,
            expect={"after_job": ctx.job_id},
            label=launch.label,
            kind="sweep-cell",
            sweep_id=sweep_id,
        )
    except (JobCancelled, LeaseLostError):
        raise
    except BenchbotError as exc:
        diagnosis = getattr(exc, "diagnosis", None) or {"category": "bench_failed", "summary": str(exc)}
        record = store.failed_run(
            ctx.redis,
            job_id=ctx.job_id,
            user=ctx.user,
            host=host.name,
            label=launch.label,
            sweep_id=sweep_id,
            params=spec.to_dict(),
            diagnosis=diagnosis,
        )
        ctx.progress("sweep", f"{launch.label}: failed ({diagnosis.get('category')}); going on")
        return {
            "label": launch.label,
            "status": "failed",
            "run_id": record.id,
            "diagnosis": diagnosis,
            "message": str(exc),
        }
    return {"label": launch.label, "status": "ok", **measured}


async def sweep_job(ctx: JobContext, config: Config, payload: dict[str, Any]) -> dict[str, Any]:
    """``/sweep``: launch + bench per config; a failed launch is a failed cell and the sweep goes on."""
    host = config.host(payload["host"])
    spec = BenchSpec.from_dict(payload["bench"])
    sweep_id = f"s{ctx.job_id}"
    configs = [LaunchIntent.from_dict(c) for c in payload["configs"]]

    async def body(transport: Transport) -> dict[str, Any]:
        cells: list[dict[str, Any]] = []
        state = JobState()  # the current cell's server: each launch stops the previous cell's
        try:
            facts = await learn_engine(ctx, host, transport)
            for index, launch in enumerate(configs, 1):
                ctx.progress("sweep", f"config {index}/{len(configs)}: {launch.label}")
                state = JobState()
                cells.append(
                    await sweep_cell(ctx, config, host, transport, launch, spec, state, sweep_id, index, facts)
                )
            run_ids = [c["run_id"] for c in cells if c.get("run_id")]
            table = tables.compare_table(store.get_runs(ctx.redis, run_ids)) if run_ids else ""
            result = {"kind": "sweep", "sweep_id": sweep_id, "cells": cells, "run_ids": run_ids, "table": table}
            ctx.commit(result)
            return result
        except JobCancelled:
            await kill_started(ctx, transport, state)
            raise

    return await with_transport(host, body, ctx=ctx, config=config)
