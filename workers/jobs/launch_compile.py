"""A launch's argv, compiled on the worker and checked against the engine the host really runs.

The job carries only the intent (presets and raw flags); :func:`learn_engine` asks the host which engine
version it runs and its real options, and :func:`compile_launch` builds the argv from this worker's own
config and refuses, before anything on the host is stopped or started, what that version would refuse.
"""

from __future__ import annotations

from workers.config import Config, HostConfig
from workers.engines.diagnosis import Diagnosis
from workers.engines.probe import EngineFacts, engine_facts, is_simulator
from workers.engines.registry import driver_for
from workers.engines.version_spread import unknown_version_problems
from workers.errors import EngineError
from workers.host.transport import Transport
from workers.jobs.context import JobContext
from workers.jobs.events import ProgressPhase
from workers.json_value import JsonObject
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
