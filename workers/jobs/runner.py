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
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import redis

from workers import observer
from workers.benchmark import slo
from workers.benchmark.client import run_bench
from workers.benchmark.settings import ClientSettings, client_settings
from workers.benchmark.spec import DEFAULT_API, BenchSpec
from workers.benchmark.stats import combine_repeats
from workers.config import Config, HostConfig, load_config
from workers.engines.driver import driver_for
from workers.engines.probe import EngineFacts, engine_facts, is_simulator
from workers.engines.sglang.diagnosis import Diagnosis, without_satisfied_hints
from workers.engines.version_spread import unknown_version_problems
from workers.errors import BenchbotError, EngineError, LeaseLostError
from workers.evaluation.spec import EvalSpec
from workers.host import engine_env, engine_stop
from workers.host.connect import open_transport
from workers.host.transport import HostFence, NewerClaimError, Transport, describe_argv
from workers.jobs import events, faults, job_metrics, profile_capture
from workers.jobs.access import run_time_denial
from workers.jobs.context import JobCancelled, JobContext
from workers.jobs.events import ProgressPhase
from workers.jobs.outcomes import (
    BenchOutcome,
    EvalOutcome,
    LaunchOutcome,
    ReadyData,
    StopOutcome,
    Stopped,
    SweepCell,
    SweepOutcome,
)
from workers.jobs.payloads import (
    BenchPayload,
    EvalPayload,
    Expectation,
    JobPayload,
    LaunchPayload,
    StopPayload,
    SweepPayload,
    parse_payload,
)
from workers.observation import ObservedState, RunningConfig
from workers.observer import LaunchRecord
from workers.presets import LaunchIntent, LaunchSpec, build_launch, check_launch
from workers.redis_conn import REDIS_DOWN
from workers.reserved_flags import unrecorded_version_problems
from workers.results import store, tables
from workers.results.labels import bench_label
from workers.results.record import RunRecord, mostly_failed
from workers.telemetry import run as telemetry

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
    """The RQ job: run ``payload['kind']`` under the lease; the body commits its own ``succeeded``.

    The payload is JSON here (RQ's edge) and typed from here on; the result goes back as JSON.
    """
    config = load_config()
    with JobContext(lease_ttl_s=config.limits.lease_ttl_s, lease_margin_s=config.limits.lease_margin_s) as ctx:
        job = parse_payload(payload)
        try:
            return asyncio.run(run_job(ctx, config, job)).to_dict()
        finally:
            # The job may have changed the host: its observer looks again now, for /status (issue 23).
            with contextlib.suppress(*REDIS_DOWN):
                observer.ask_observation(ctx.redis, job.host)


async def run_job(
    ctx: JobContext, config: Config, job: JobPayload
) -> LaunchOutcome | BenchOutcome | StopOutcome | SweepOutcome | EvalOutcome:
    """The body for the payload's kind, if its owner may still run it (access is checked again now)."""
    denial = run_time_denial(config.access, ctx.user, str(job.kind))
    if denial:
        raise BenchbotError(denial)
    if isinstance(job, EvalPayload):
        from workers.jobs.eval_job import eval_job  # its own module; it builds on this one's helpers

        return await eval_job(ctx, config, job)
    if isinstance(job, LaunchPayload):
        return await launch_job(ctx, config, job)
    if isinstance(job, BenchPayload):
        return await bench_job(ctx, config, job)
    if isinstance(job, StopPayload):
        return await stop_job(ctx, config, job)
    return await sweep_job(ctx, config, job)


# ------------------------------------------------------------------ host operations


def host_fence(ctx: JobContext, host: HostConfig) -> HostFence:
    """This job's claim on the host, as the host-side actuator checks it before every side effect: its
    token, and the lease's proven deadline (the host refuses an action that arrives after it)."""
    if ctx.fence is None or ctx.lease is None:
        raise LeaseLostError("this job holds no lease on the host")
    return HostFence.for_port(host.log_dir, host.port, ctx.fence, deadline=ctx.lease.checker.deadline)


def owner_words(observed: RunningConfig) -> str:
    """``pid 123 (alice, job 17)`` / ``pid 123 (user bob, not started by benchbot)``: who owns the port."""
    process = observed.process
    who = observed.launched_by
    if observed.managed and who:
        owner = f"started by {who.user} with job {who.job}"
    else:
        owner = f"user {observed.owner_user or '?'}, not started by benchbot"
    since = process.start_time if process is not None else None
    age = f", up {max(0, int(time.time() - since)) // 60} min" if since else ""
    gpu = observed.owner_gpu_mib
    held = f", holding {gpu / 1024:.0f} GiB of GPU memory" if gpu else ""
    return f"pid {process.pid if process is not None else None} ({owner}{age}{held})"


def refuse_foreign_owner(host: HostConfig, observed: RunningConfig) -> None:
    """A process benchbot cannot identify as an engine is never signalled: say who it is, change nothing."""
    argv = " ".join(observed.process.argv if observed.process is not None else ())[:200]
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
) -> Stopped | None:
    """Stop the engine that owns the engine port; return what it was (observed) or None when the port was free.

    Only an engine is stopped (benchbot's own, or an unmanaged one identified from its argv); anything else
    on the port is a refusal naming the process. An engine still loading (no listener yet) owns the port
    too: a launch refuses to start a second engine over it, ``/stop`` (``stop_loading``) stops it.
    """
    ctx.progress(ProgressPhase.OBSERVE, f"looking at what owns port {host.port} on {host.name}")
    before = await observer.observe_host(r, host, transport)
    process = before.process
    if process is None:
        return None
    if not before.engine_kind:
        refuse_foreign_owner(host, before)
    if before.state == ObservedState.LOADING and not stop_loading:
        raise BenchbotError(
            f"an engine is loading on {host.name} for port {host.port}: {owner_words(before)}. It owns the port "
            f"and the GPUs, so benchbot will not start a second engine over it. Wait until it is ready (then "
            f"/launch replaces it), or /stop {host.name} to stop it first."
        )
    owner = "benchbot's" if before.managed else "an unmanaged"
    what = "loading engine" if before.state == ObservedState.LOADING else "server"
    ctx.check(faults.BEFORE_SIGNAL)
    ctx.progress(
        ProgressPhase.STOP,
        f"stopping {owner} {what} on port {host.port} (pid {process.pid}): {before.summary or 'unknown config'}",
    )
    pid = process.pid
    # its group only if benchbot created it (our launch record's instance); anyone else's engine: its pid
    how = await engine_stop.stop_engine(
        transport,
        host_fence(ctx, host),
        pid,
        process.start_ticks,
        group=bool(before.managed) and process.pgid == pid,
        before_signal=ctx.check_fence,
    )
    await wait_port_free(transport, host.port)
    return Stopped(config=before, how=how)


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
    ctx.progress(ProgressPhase.ENGINE, f"asking {host.name} which {driver_for(host.engine.kind).name} it runs")
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
        ctx.progress(ProgressPhase.ENGINE, facts.note)
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
    simulated = is_simulator(host.engine.command)
    admin = config.access.is_admin(ctx.user)

    def ignore(flag: str) -> bool:
        return simulated and flag.startswith("--sim-")

    if facts.contract is None:  # a version without a contract: its raw flags judged in every recorded one
        raw = [(flag, value) for flag, value in intent.raw_flags if not ignore(flag)]
        problems = [f"{p}." for p in unrecorded_version_problems(raw, host.engine.kind, admin=admin)]
        if facts.version is None:  # nor which release: a flag some recorded release refuses is not guessed at
            problems += [f"{p}." for p in unknown_version_problems(spec.flags, host.engine.kind, ignore=ignore)]
    else:
        problems = check_launch(spec, facts.contract, admin=admin, ignore=ignore)
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
) -> ReadyData:
    """Free the port, spawn the engine detached, watch it to ready, smoke-test it, observe it."""
    contract = facts.contract if facts is not None else None
    driver = driver_for(host.engine.kind)
    replaced = await free_port(ctx, r, host, transport)
    ctx.check()
    log_path = f"{host.log_dir.rstrip('/')}/engine-{host.name}-job{ctx.job_id}{log_tag}.log"
    fence = host_fence(ctx, host)
    private = engine_env.private_options(host.engine)  # the API key: a 0600 file named by --config, never argv
    ctx.progress(ProgressPhase.SPAWN, f"starting {spec.label} on {host.name} (log {log_path})")
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
    job_metrics.record_launch(r, host.name, host.engine.kind)
    state.started_instance = f"{host.name}:{spawned.pid}:{spawned.start_ticks}"
    observer.record_launched(
        r,
        host.name,
        fence.token,
        observer.LaunchRecord(
            instance_id=state.started_instance,
            pid=spawned.pid,
            user=ctx.user,
            job=ctx.job_id,
            at=time.time(),
            label=spec.label,
            log_path=log_path,
            argv_flags=spec.flags,
        ),
    )
    ctx.progress(ProgressPhase.WATCH, f"waiting for {host.base_url}/health (pid {spawned.pid})")
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
            driver.wait_ready(
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
        job_metrics.record_launch_failure(r, host.name, host.engine.kind, outcome.category)
        raise LaunchFailed(f"{spec.label} failed to start: {outcome.summary}", diagnosis_dict(outcome))
    ctx.progress(ProgressPhase.SMOKE, "checking a generation is not garbage")
    ctx.check(faults.BEFORE_SMOKE)
    smoke = await ctx.guard(driver.smoke_test(host.base_url, host.engine.api_key()))
    if not smoke.ok:
        tail = await transport.tail(log_path, 40)
        await kill_started(ctx, transport, state)
        diagnosis = diagnosis_dict(driver.smoke_diagnosis(smoke, "\n".join(tail)))
        diagnosis["summary"] += " benchbot stopped it so nobody benchmarks garbage."
        job_metrics.record_launch_failure(r, host.name, host.engine.kind, str(diagnosis.get("category") or ""))
        raise LaunchFailed(f"{spec.label} answers garbage ({smoke.reason})", diagnosis)
    ctx.progress(ProgressPhase.OBSERVE, "reading the config the server reports")
    running = await observer.observe_host(r, host, transport)
    requested = driver.requested_args(dict(spec.flags), contract)
    from workers.observation import diff_requested

    ready = ReadyData(
        config=running,
        diff=tuple(diff_requested(requested, running.args)),
        replaced=replaced,
        launch=spec.to_dict(),
        smoke_text=smoke.text,
        smoke_completion_tokens=smoke.completion_tokens,
        engine_version=facts.version if facts else None,
        checked_against=facts.source if facts else "none",
    )
    ctx.ready(ready.to_dict())
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


def check_expectation(expect: Expectation | None, observed: RunningConfig, launched: LaunchRecord | None) -> str | None:
    """Why the running server is not the one the requester meant, or None when it is.

    ``None`` means ``any`` (measure whatever runs); an expectation nobody could establish refuses.
    """
    if expect is None:
        return None
    label = observed.summary or "an unknown config"
    if expect.unknown is not None:
        return (
            f"benchbot could not tell which server you meant when you asked ({expect.unknown}), and now "
            f"{label} runs: it will not measure a server nobody chose"
        )
    if expect.nothing_running:
        return f"nothing was running when you asked, and now {label} runs: it is not the server you meant to measure"
    if expect.after_job:
        if launched is None or launched.job != expect.after_job or launched.instance_id != observed.instance_id:
            return (
                f"you asked to bench after your launch (job {expect.after_job}), but the server now on "
                f"the port is {label}, not the one that job started"
            )
        return None
    if expect.fingerprint and expect.fingerprint != observed.fingerprint:
        return (
            f"the server changed since you asked: you asked while {expect.label or 'another config'} "
            f"({expect.fingerprint}) was running; now it is {label} ({observed.fingerprint})"
        )
    if expect.pinned and expect.instance_id and expect.instance_id != observed.instance_id:
        return (
            f"the server you meant ({expect.label or 'the one running'}, instance {expect.instance_id}) was "
            f"replaced by a job queued ahead of yours; now {label} runs (instance {observed.instance_id})"
        )
    return None


def expectation_of(any_config: bool, expect: Expectation | None) -> Expectation | None:
    """What a queued bench or eval must find: nothing for ``any``; a job queued without one (an older bot,
    or a payload built by hand) refuses, as one whose expectation could not be established does."""
    if any_config:
        return None
    return expect or Expectation(unknown="no expectation was recorded when it was queued")


async def run_bench_measured(
    ctx: JobContext,
    r: redis.Redis,
    host: HostConfig,
    transport: Transport,
    spec: BenchSpec,
    *,
    expect: Expectation | None,
    label: str | None = None,
    kind: str = "bench",
    sweep_id: str | None = None,
    config: Config | None = None,
) -> BenchOutcome:
    """Observe, check it's the config meant, bench every level, observe again, store the run.

    ``config`` is the worker's (dataset names resolve there); without it only a spec that names no
    dataset can run.
    """
    ctx.progress(ProgressPhase.OBSERVE, "observing the server before the bench")
    before = await observer.observe_host(r, host, transport)
    if before.state == ObservedState.LOADING:
        raise BenchbotError(
            f"the engine on {host.name}:{host.port} is still loading ({owner_words(before)}): "
            "bench it once it is ready (/status shows when)"
        )
    if before.state == ObservedState.STARTING:  # a warming server's numbers would be the warm-up's
        raise BenchbotError(
            f"the server on {host.name}:{host.port} is warming up ({before.detail or 'not ready yet'}): "
            "bench it once it is ready (/status shows when)"
        )
    if before.state != ObservedState.RUNNING:
        raise BenchbotError(
            f"nothing is serving on {host.name}:{host.port} ({before.state}): "
            "/launch first, or /status to see what is there"
        )
    mismatch = check_expectation(expect, before, observer.launched_record(r, host.name))
    if mismatch:
        raise BenchbotError(
            f"refusing to benchmark under a wrong label: {mismatch}. "
            "Run /bench again, or add 'any' to measure whatever runs."
        )
    ctx.check(faults.BEFORE_BENCH)
    spec = engine_bench_spec(host, spec)
    profiler = profile_capture.for_bench(
        driver_for(host.engine.kind),
        host,
        transport,
        spec,
        before.process.argv if before.process else (),
        ctx.job_id,
        functools.partial(ctx.check_fence, faults.BEFORE_BENCH_REQUEST),
    )
    host_facts = await telemetry.host_extra(host, transport, before.engine_version)  # read-only, best effort
    if spec.is_search:
        levels, search = await _search_levels(ctx, host, spec, config)
    else:
        tel = telemetry.for_host(host, transport)
        levels, search = await _bench_levels(ctx, host, spec, config, tel, profiler), None
    ctx.progress(ProgressPhase.OBSERVE, "observing the server after the bench")
    after = await observer.observe_host(r, host, transport)
    valid, reason = True, None
    if after.instance_id != before.instance_id:
        valid = False
        reason = (
            f"the server changed during the bench: instance {before.instance_id} became "
            f"{after.instance_id or 'nothing'}"
        )
    elif after.fingerprint != before.fingerprint:
        valid = False
        reason = "the server's config changed during the bench"
    elif failed := mostly_failed(levels):
        valid, reason = False, failed
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
        config=before.to_dict(),  # the stored run is JSON: the observation's edge
        config_after=after.to_dict(),
        valid=valid,
        invalid_reason=reason,
        params=spec.to_dict(),
        levels=levels,
        status="ok",
        diagnosis=None,
        extra={
            **({"slo": search.to_dict(), "slo_summary": _search_summary(spec, search)} if search else {}),
            **telemetry.run_extra(levels),
            **({"profile": profiler.result.to_dict()} if profiler and profiler.result else {}),
            **host_facts,
        },
    )
    ctx.check()  # a cancelled (or no longer fenced) bench stores nothing
    run_id = store.save_run(r, record)
    table = tables.format_levels_table(record)
    if search is not None:
        table += "\n" + _search_summary(spec, search)
    if profiler and profiler.result:
        table += "\n" + profile_capture.describe(profiler.result, bool(spec.rates))
    return BenchOutcome(run_id=run_id, valid=valid, invalid_reason=reason, table=table)


def engine_bench_spec(host: HostConfig, spec: BenchSpec) -> BenchSpec:
    """``spec`` in an API the host's engine serves: a plain ``/bench`` (api ``generate``, SGLang's native API)
    on vLLM, which has no ``/generate``, uses its OpenAI ``completions``; the stored params say so."""
    driver = driver_for(host.engine.kind)
    if spec.api == DEFAULT_API and driver.default_bench_api != DEFAULT_API:
        return replace(spec, api=driver.default_bench_api)
    return spec


async def _bench_levels(
    ctx: JobContext,
    host: HostConfig,
    spec: BenchSpec,
    config: Config | None,
    tel: telemetry.RunTelemetry | None = None,
    profiler: profile_capture.LevelProfile | None = None,
) -> tuple[dict[str, Any], ...]:
    """Every level of ``spec``, ``repeat`` times over (each sweep with fresh prompts): one dict per level.

    An engine that counts speculative decoding server-side (vLLM's ``vllm:spec_decode_*``) is benched one
    level at a time, its counters read around each, so each level reports its own acceptance length
    (warmup requests included); SGLang reports it per request and runs all levels in one go.
    """
    settings = client_settings(spec, config, api_key=host.engine.api_key())
    driver = driver_for(host.engine.kind)
    key = host.engine.api_key()

    on_progress = functools.partial(ctx.progress, ProgressPhase.BENCH)

    async def one_sweep(settings: ClientSettings) -> list[dict[str, Any]]:
        around = profile_capture.combine(tel.level if tel is not None else None, profiler.level if profiler else None)
        first = len(tel.levels) if tel is not None else 0
        if await driver.spec_decode(host.base_url, key) is None:
            done = await ctx.guard(
                run_bench(
                    host.base_url, settings, on_progress=on_progress, gate=ctx.request_gate(), around_level=around
                )
            )
            return telemetry.attach(tel, first, [level.metrics.to_dict() for level in done])
        out = []
        for load in spec.loads():
            one = replace(settings, spec=spec.at_load(load))
            before = await driver.spec_decode(host.base_url, key)
            (level,) = await ctx.guard(
                run_bench(host.base_url, one, on_progress=on_progress, gate=ctx.request_gate(), around_level=around)
            )
            after = await driver.spec_decode(host.base_url, key)
            data = level.metrics.to_dict()
            if data.get("spec_accept_length") is None and after is not None:
                data["spec_accept_length"] = after.accept_length_since(before)
            out.append(data)
        return telemetry.attach(tel, first, out)

    sweeps = []
    for number in range(1, spec.repeat + 1):
        if spec.repeat > 1:
            ctx.progress(ProgressPhase.BENCH, f"repeat {number} of {spec.repeat}")
        sweeps.append(await one_sweep(settings))
    return combine_repeats(sweeps)


async def _search_levels(
    ctx: JobContext, host: HostConfig, spec: BenchSpec, config: Config | None
) -> tuple[tuple[dict[str, Any], ...], slo.SloResult]:
    """``/bench slo ...``: measure the loads the knee search asks for, one level at a time.

    Each load is one bench level (its own prompts); a load measured twice (the knee's confirmation)
    keeps its last measurement in the stored levels, and both in the search's points.
    """
    limits = slo.Slo(spec.slo, spec.slo_errors_pct if spec.slo_errors_pct is not None else slo.DEFAULT_MAX_ERROR_PCT)
    if spec.search_rates is not None:
        loads = slo.geometric_loads(*spec.search_rates, integer=False)
    else:
        loads = slo.geometric_loads(1, spec.search_max or 1)
    measured: dict[float, dict[str, Any]] = {}

    on_progress = functools.partial(ctx.progress, ProgressPhase.BENCH)

    async def measure(load: float) -> slo.Measurement:
        one = replace(spec, slo=(), search_max=None, search_rates=None, repeat=1)
        one = replace(one, rates=(load,)) if spec.search_rates is not None else replace(one, levels=(int(load),))
        settings = client_settings(one, config, api_key=host.engine.api_key())
        unit = "rate" if spec.search_rates else "concurrency"
        ctx.progress(ProgressPhase.SLO, f"trying {unit} {load:g} ({limits.describe()})")
        (level,) = await ctx.guard(
            run_bench(host.base_url, settings, on_progress=on_progress, gate=ctx.request_gate(), keep_records=True)
        )
        data = level.metrics.to_dict()
        measured[load] = data
        return slo.measurement_from_level(data, limits, level.records)

    result = await slo.search_async(measure, loads, limits)
    return tuple(measured[load] for load in sorted(measured)), result


def _search_summary(spec: BenchSpec, result: slo.SloResult) -> str:
    return "SLO: " + result.summary("rate" if spec.search_rates else "concurrency")


# ------------------------------------------------------------------ job bodies


def _reached_ready(r: redis.Redis, job_id: str, instance: str | None) -> bool:
    """True if ``job_id`` published ``ready`` for ``instance`` (its smoke test passed)."""
    for e in events.job_events(r, job_id):
        ready = ReadyData.from_dict(e.data) if e.type == events.READY else None
        if ready is not None and ready.config.instance_id == instance:
            return True
    return False


async def stop_half_started(ctx: JobContext, config: Config, host: HostConfig, transport: Transport) -> None:
    """Stop a server whose launching job ended before it was ready (its worker was killed, it timed out).

    Nobody verified such a server, so nobody may measure it; and only the next job on the host, under
    the lease, can safely touch it. Found through the launch record (pid + start tick, so a reused pid
    is never hit), whether or not it listens on the port yet.
    """
    r = ctx.redis
    record = observer.launched_record(r, host.name)
    if record is None or str(record.job) == ctx.job_id:
        return
    job, instance = str(record.job), record.instance_id
    ending = events.terminal_type(r, job)
    if ending in (None, events.SUCCEEDED) or _reached_ready(r, job, instance):
        return
    pid = record.pid
    info = await transport.process_info(pid) if pid and await transport.is_alive(pid) else None  # not a zombie
    if info is None or f"{host.name}:{info.pid}:{info.start_ticks}" != instance:
        return
    ctx.check(faults.BEFORE_SIGNAL)
    ctx.progress(
        ProgressPhase.CLEANUP,
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


async def claim(ctx: JobContext, host: HostConfig, transport: Transport) -> None:
    """Claim the host for this job's fence; when the host holds a newer token although Redis granted no
    lease after ours, Redis lost its fence counter (an embedded Redis restarted): take a fence above the
    host's and claim again, instead of every job on the host failing as stale until someone removes the
    fence file (issue 25 item 7)."""
    try:
        await transport.claim_host(host_fence(ctx, host))
    except NewerClaimError as exc:
        if not ctx.refence_above(exc.stored):
            raise
        ctx.progress(
            ProgressPhase.CLEANUP,
            f"Redis had lost its fence counter ({host.name}'s fence file holds {exc.stored}): "
            f"this job now holds fence {ctx.fence}",
        )
        await transport.claim_host(host_fence(ctx, host))


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
            await claim(ctx, host, transport)  # the host now refuses older jobs' actions
            await stop_half_started(ctx, config, host, transport)
        return await body(transport)
    finally:
        with contextlib.suppress(Exception):
            await transport.close()


async def launch_job(ctx: JobContext, config: Config, payload: LaunchPayload) -> LaunchOutcome:
    """``/launch``: launch, verify, and (``then bench``) benchmark under the same lease."""
    host = config.host(payload.host)
    intent = payload.launch
    state = JobState()

    async def body(transport: Transport) -> LaunchOutcome:
        try:
            facts = await learn_engine(ctx, host, transport)
            spec = compile_launch(ctx, config, host, intent, facts)
            ready = await launch_engine(ctx, ctx.redis, host, transport, spec, state, facts=facts)
            bench = None
            if payload.bench is not None:
                bench = await run_bench_measured(
                    ctx,
                    ctx.redis,
                    host,
                    transport,
                    payload.bench,
                    expect=Expectation(after_job=ctx.job_id),
                    label=spec.label,
                    config=config,
                )
            evaluated = None
            if payload.eval is not None:  # `then eval`: with the bench's run when there was one
                from workers.jobs.eval_job import run_eval_measured

                evaluated = await run_eval_measured(
                    ctx,
                    ctx.redis,
                    config,
                    host,
                    transport,
                    payload.eval,
                    expect=Expectation(after_job=ctx.job_id),
                    label=spec.label,
                    attach_to=bench.run_id if bench is not None else None,
                )
            result = LaunchOutcome(config=ready.config, diff=ready.diff, bench=bench, eval=evaluated)
            ctx.commit(result.to_dict())  # `succeeded` unless a cancel came first (JobCancelled: stop what we started)
            state.started_pgid = None  # success: the server stays up for the team
            return result
        except JobCancelled:
            await kill_started(ctx, transport, state)
            raise

    return await with_transport(host, body, ctx=ctx, config=config)


async def bench_job(ctx: JobContext, config: Config, payload: BenchPayload) -> BenchOutcome:
    """``/bench``: benchmark what runs, if it is what the requester meant."""
    host = config.host(payload.host)
    expect = expectation_of(payload.any_config, payload.expect)

    async def body(transport: Transport) -> BenchOutcome:
        result = await run_bench_measured(ctx, ctx.redis, host, transport, payload.bench, expect=expect, config=config)
        ctx.commit(result.to_dict())
        return result

    return await with_transport(host, body, ctx=ctx, config=config)


def stop_message(stopped: Stopped) -> str:
    """``stopped <what>``, with how only when it says more than "stopped" (never "stopped X (stopped)")."""
    what = stopped.config.summary or "the server"
    how = stopped.how.removeprefix("stopped").lstrip("; ")
    return f"stopped {what}" + (f" ({how})" if how else "")


async def stop_job(ctx: JobContext, config: Config, payload: StopPayload) -> StopOutcome:
    """``/stop``: stop whatever owns the engine port."""
    host = config.host(payload.host)

    async def body(transport: Transport) -> StopOutcome:
        stopped = await free_port(ctx, ctx.redis, host, transport, stop_loading=True)
        if stopped is None:
            result = StopOutcome(stopped=None, message=f"nothing on port {host.port} of {host.name}")
        else:
            result = StopOutcome(stopped=stopped, message=stop_message(stopped))
        ctx.commit(result.to_dict())
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
    evaluate: EvalSpec | None = None,
) -> SweepCell:
    """One config of a sweep: launch + bench (+ eval). A failed launch or bench is a failed cell, not a failed
    sweep; a failed eval is a note on its cell."""
    try:
        compiled = compile_launch(ctx, config, host, launch, facts)
        await launch_engine(ctx, ctx.redis, host, transport, compiled, state, log_tag=f"-cell{index}", facts=facts)
        measured = await run_bench_measured(
            ctx,
            ctx.redis,
            host,
            transport,
            spec,
            expect=Expectation(after_job=ctx.job_id),
            label=launch.label,
            kind="sweep-cell",
            sweep_id=sweep_id,
            config=config,
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
        ctx.progress(ProgressPhase.SWEEP, f"{launch.label}: failed ({diagnosis.get('category')}); going on")
        return SweepCell(
            label=launch.label, status="failed", run_id=record.id, diagnosis=dict(diagnosis), message=str(exc)
        )
    evaluated, eval_error = None, ""
    if evaluate is not None:
        from workers.jobs.eval_job import run_eval_measured

        try:
            evaluated = await run_eval_measured(
                ctx,
                ctx.redis,
                config,
                host,
                transport,
                evaluate,
                expect=Expectation(after_job=ctx.job_id),
                label=launch.label,
                kind="sweep-cell",
                sweep_id=sweep_id,
                attach_to=measured.run_id,
            )
        except (JobCancelled, LeaseLostError):
            raise
        except BenchbotError as exc:
            eval_error = str(exc)
            ctx.progress(ProgressPhase.SWEEP, f"{launch.label}: the eval failed ({exc}); going on")
    return SweepCell(
        label=launch.label,
        status="ok",
        run_id=measured.run_id,
        valid=measured.valid,
        invalid_reason=measured.invalid_reason,
        table=measured.table,
        eval=evaluated,
        eval_error=eval_error,
    )


async def sweep_job(ctx: JobContext, config: Config, payload: SweepPayload) -> SweepOutcome:
    """``/sweep``: launch + bench per config; a failed launch is a failed cell and the sweep goes on."""
    host = config.host(payload.host)
    spec = payload.bench
    sweep_id = f"s{ctx.job_id}"
    configs = payload.configs

    async def body(transport: Transport) -> SweepOutcome:
        cells: list[SweepCell] = []
        state = JobState()  # the current cell's server: each launch stops the previous cell's
        try:
            facts = await learn_engine(ctx, host, transport)
            for index, launch in enumerate(configs, 1):
                ctx.progress(ProgressPhase.SWEEP, f"config {index}/{len(configs)}: {launch.label}")
                state = JobState()
                cells.append(
                    await sweep_cell(
                        ctx, config, host, transport, launch, spec, state, sweep_id, index, facts, payload.eval
                    )
                )
            run_ids = tuple(c.run_id for c in cells if c.run_id)
            table = tables.compare_table(store.get_runs(ctx.redis, list(run_ids))) if run_ids else ""
            result = SweepOutcome(sweep_id=sweep_id, cells=tuple(cells), run_ids=run_ids, table=table)
            ctx.commit(result.to_dict())
            return result
        except JobCancelled:
            await kill_started(ctx, transport, state)
            raise

    return await with_transport(host, body, ctx=ctx, config=config)
