"""Starting an engine under the lease: compile its argv against the engine the host really runs, free the port,
spawn it fenced, watch it to ready, smoke-test, observe.

The job carries only the intent (presets and raw flags); :func:`learn_engine` asks the host which engine
version it runs and its real options, and :func:`compile_launch` builds the argv from this worker's own
config and refuses, before anything on the host is stopped or started, what that version would refuse.
Ready means the process answering on the port is in the process group this job spawned and a generation
is not garbage; a launch that dies, hangs or answers garbage is stopped again and diagnosed from its log.
"""

from __future__ import annotations

import contextlib
import time

import redis

from workers import observer
from workers.config import Config, HostConfig
from workers.engines.diagnosis import Diagnosis, without_satisfied_hints
from workers.engines.probe import EngineFacts, engine_facts, is_simulator
from workers.engines.registry import driver_for
from workers.engines.version_spread import unknown_version_problems
from workers.errors import BenchbotError, EngineError
from workers.host import engine_env
from workers.host.transport import Transport
from workers.jobs import faults, job_metrics
from workers.jobs.context import JobContext
from workers.jobs.events import ProgressPhase
from workers.jobs.host_job import JobState, host_fence, kill_started
from workers.jobs.outcomes import ReadyData
from workers.jobs.port_owner import free_port, who_else_listens
from workers.json_value import JsonObject
from workers.observation import diff_requested
from workers.presets import LaunchIntent, LaunchSpec, build_launch, check_launch
from workers.reserved_flags import unrecorded_version_problems


class LaunchFailed(EngineError):
    """The engine did not become ready; ``diagnosis`` says why (category, evidence, log tail)."""

    def __init__(self, message: str, diagnosis: JsonObject | None) -> None:
        super().__init__(message)
        self.diagnosis = diagnosis


def diagnosis_dict(diagnosis: Diagnosis) -> JsonObject:
    """The event/result shape of a diagnosis: the log tail as a list of lines (at most 40)."""
    data = diagnosis.to_dict()
    data["log_tail"] = diagnosis.log_tail.splitlines()[-40:]
    return data


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
    private = engine_env.private_options(host.engine, spec)  # the API key: a 0600 file named by --config, never argv
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
        settings=engine_env.kept_settings(spec, private),  # no secret in them: kept while it runs, to read back
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
        diagnosis["summary"] = f"{diagnosis.get('summary') or ''} benchbot stopped it so nobody benchmarks garbage."
        job_metrics.record_launch_failure(r, host.name, host.engine.kind, str(diagnosis.get("category") or ""))
        raise LaunchFailed(f"{spec.label} answers garbage ({smoke.reason})", diagnosis)
    ctx.progress(ProgressPhase.OBSERVE, "reading the config the server reports")
    running = await observer.observe_host(r, host, transport)
    requested = driver.requested_args(dict(spec.flags), contract)
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
