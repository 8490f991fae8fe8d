"""A gang's ranks: each member's argv (the group's launch plus its rank's flags), its spawn, and watching it.

Rank ``i`` runs on the ``i``-th host of the group's rank order (the head first, then the other members in
the config's order). Every rank is compiled by this worker from the group's engine and the engine's
recorded contract, exactly as a one-host launch is (``engine_launch.compile_launch``), and then given its
rank's flags from the data table ``workers/engines/multinode.py``, each checked to be a recorded option of
the release that host runs. A rank is *alive* while its spawned process is (its pid and start tick); a
rank has *joined* once its log shows the engine's joined line (SGLang: ``Init torch distributed ends.``),
where the engine records one.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from workers import observer
from workers.config import Config, GroupConfig, HostConfig
from workers.engines import multinode, registry
from workers.engines.probe import EngineFacts
from workers.gang.context import MemberContext
from workers.host import engine_env
from workers.host.transport import SpawnedProcess, Transport
from workers.jobs import faults, job_metrics
from workers.jobs.engine_launch import LaunchFailed, compile_launch, learn_engine
from workers.jobs.events import ProgressPhase
from workers.jobs.host_job import JobState, host_fence
from workers.json_value import JsonObject
from workers.presets import LaunchIntent, LaunchSpec

#: Log lines a diagnosis quotes from a rank.
TAIL_LINES = 20


@dataclass
class Rank:
    """One rank of the gang: where, as what, and what was started for it."""

    rank: int
    host: HostConfig
    ctx: MemberContext
    transport: Transport
    facts: EngineFacts | None = None
    spec: LaunchSpec | None = None
    state: JobState = field(default_factory=JobState)
    spawned: SpawnedProcess | None = None
    log_path: str = ""

    @property
    def name(self) -> str:
        """``rank 1 on pair-b`` (how every message names it)."""
        return f"rank {self.rank} on {self.host.name}"


async def compile_rank(rank: Rank, config: Config, group: GroupConfig, intent: LaunchIntent, head: HostConfig) -> None:
    """The rank's argv for the release its host runs, refused before anything is stopped or started."""
    ctx, host = rank.ctx, rank.host
    rank.facts = await learn_engine(ctx, host, rank.transport)
    spec = compile_launch(ctx, config, host, intent, rank.facts)
    form = multinode.form_for(host.engine.kind, registry.display_name(host.engine.kind))
    problems: list[str] = []
    taken = {flag for flag, _ in spec.flags} & set(form.names())
    if taken:
        problems.append(f"{', '.join(sorted(taken))} is the gang's to set (one per rank), not a launch's")
    if rank.facts.contract is not None:
        missing = multinode.unrecorded(form, rank.facts.contract)
        if missing:
            problems.append(f"{rank.facts.contract.label()} on {host.name} records no {', '.join(missing)}")
    if problems:
        summary = f"{spec.label} cannot start as {rank.name}: {'; '.join(problems)}. Nothing was stopped or started."
        raise LaunchFailed(summary, {"category": "config_error", "summary": summary, "evidence_line": problems[0]})
    driver = registry.driver_for(host.engine.kind)
    flags = driver.multinode_flags(nnodes=len(group.hosts), node_rank=rank.rank, head=head.http_host, port=group.port)
    argv = [*spec.argv]
    for flag, value in flags:
        argv += [flag] if value is True else [flag, str(value)]
    rank.spec = dataclasses.replace(spec, flags=(*spec.flags, *flags), argv=tuple(argv))


async def spawn_rank(rank: Rank) -> None:
    """Start the rank detached under its member's fence, and record it as that host's launch."""
    ctx, host, transport, spec = rank.ctx, rank.host, rank.transport, rank.spec
    assert spec is not None
    rank.log_path = f"{host.log_dir.rstrip('/')}/engine-{host.name}-job{ctx.job_id}-rank{rank.rank}.log"
    fence = host_fence(ctx, host)
    private = engine_env.private_options(host.engine, spec)
    ctx.progress(ProgressPhase.SPAWN, f"starting {spec.label} as {rank.name} (log {rank.log_path})")
    ctx.check(faults.BEFORE_SPAWN)
    spawned = await transport.spawn_engine(
        engine_env.engine_argv(spec, fence, private),
        log_path=rank.log_path,
        fence=fence,
        env=engine_env.engine_env(host, spec),
        private_options=private,
        secrets=engine_env.log_secrets(host.engine),
        settings=engine_env.kept_settings(spec, private),
    )
    rank.spawned = spawned
    rank.state.started_pgid, rank.state.started_ticks, rank.state.fence = spawned.pgid, spawned.start_ticks, fence
    rank.state.started_instance = f"{host.name}:{spawned.pid}:{spawned.start_ticks}"
    job_metrics.record_launch(ctx.redis, host.name, host.engine.kind)
    observer.record_launched(
        ctx.redis,
        host.name,
        fence.token,
        observer.LaunchRecord(
            instance_id=rank.state.started_instance,
            pid=spawned.pid,
            user=ctx.user,
            job=ctx.job_id,
            at=time.time(),
            label=f"{spec.label} ({rank.name})",
            log_path=rank.log_path,
            argv_flags=spec.flags,
        ),
    )


async def is_alive(rank: Rank) -> bool:
    """The rank's own process (pid and start tick) still runs."""
    if rank.spawned is None:
        return False
    if await rank.transport.is_alive(rank.spawned.pid):
        info = await rank.transport.process_info(rank.spawned.pid)
        return info is not None and info.start_ticks == rank.spawned.start_ticks
    return False


async def has_joined(rank: Rank) -> bool | None:
    """Has the rank met the others (its log shows the engine's joined line)? None: the engine records no such line."""
    form = multinode.FORMS.get(rank.host.engine.kind)
    if form is None or form.joined_line is None or not rank.log_path:
        return None
    return any(form.joined_line in line for line in await rank.transport.tail(rank.log_path, 400))


async def rank_diagnosis(rank: Rank, what: str, category: str) -> JsonObject:
    """A diagnosis naming the rank, its host and its last log lines (``what`` happened to it)."""
    tail = await rank.transport.tail(rank.log_path, TAIL_LINES) if rank.log_path else []
    last = next((line for line in reversed(tail) if line.strip()), "")
    summary = f"{rank.name} {what}"
    return {
        "category": category,
        "summary": summary,
        "evidence_line": last[:300],
        "log_tail": list(tail),
        "rank": rank.rank,
        "host": rank.host.name,
    }
