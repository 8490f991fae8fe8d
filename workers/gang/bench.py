"""``/bench ... on GROUP`` and ``/eval ... on GROUP``: measure a running gang through its head, every rank watched.

Under every member's lease (:class:`~workers.gang.context.GangJobContext`, the gang launch's lease path), the
gang is first verified as its members report it: each member's engine is the one the gang launch recorded
there as that rank (same job, same rank, same instance: pid and start tick, the observer's identity rules),
and every rank still runs the head's config. A gang that is not running, a member that now runs something
else, or a rank that died is refused naming the rank and its host, and no request is sent. Then the bench
(or eval) goes to the head only, each request behind its member's fence check (which passes only while every
member's lease is ours), while every rank is watched: a rank that dies ends the job, named. Power, PCIe and
J/token are summed over every member's GPUs (:mod:`workers.gang.telemetry`), as for a gang launch's bench.
The stored run's fingerprint lists every member. This job started nothing, so it stops nothing: a broken gang
is left for ``/stop GROUP``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine

import redis

from workers import observer
from workers.config import Config, GroupConfig
from workers.errors import BenchbotError
from workers.gang import telemetry as gang_telemetry
from workers.gang.context import GangJobContext
from workers.gang.launch import check_ranks_match, race_watched, store_members, watch_ranks
from workers.gang.members import open_ranks
from workers.gang.ranks import Rank
from workers.host.transport import SpawnedProcess
from workers.jobs.bench_run import run_bench_measured
from workers.jobs.eval_run import run_eval_measured
from workers.jobs.expectation import expectation_of
from workers.jobs.outcomes import BenchOutcome, EvalOutcome
from workers.jobs.payloads import BenchPayload, EvalPayload
from workers.observation import ObservedState, RunningConfig

#: How a gang launch labels each rank it records (``ranks.spawn_rank``: ``"LABEL (rank 1 on pair-b)"``).
_RANK_LABEL = re.compile(r"\(rank (\d+) on (\S+)\)$")


def recorded_rank(record: observer.LaunchRecord | None, host: str) -> int | None:
    """The rank a gang launch recorded on ``host`` (its launch record's label), or None: not a gang's rank."""
    match = _RANK_LABEL.search(record.label or "") if record is not None else None
    return int(match.group(1)) if match and match.group(2) == host else None


def running_gang_job(r: redis.Redis, host: str) -> tuple[int, str] | None:
    """``(rank, job)`` when the engine last seen on ``host`` is a gang launch's rank, else None (the bot's view:
    the last stored observation, which every job and the host's observer refresh)."""
    record = observer.launched_record(r, host)
    rank = recorded_rank(record, host)
    seen = observer.last_observation(r, host)
    if record is None or rank is None or seen is None or seen.instance_id is None:
        return None
    return (rank, str(record.job)) if seen.instance_id == record.instance_id else None


async def gang_measure(
    ctx: GangJobContext, config: Config, group: GroupConfig, payload: BenchPayload | EvalPayload
) -> BenchOutcome | EvalOutcome:
    """Verify the running gang, then bench (or eval) through its head with every rank watched; commit it here."""
    async with open_ranks(ctx, config, group) as ranks:
        await _verify_gang(ctx, group, ranks)
        head = ranks[0]
        expect = expectation_of(payload.any_config, payload.expect)
        measured: Coroutine[object, object, BenchOutcome | EvalOutcome]
        if isinstance(payload, BenchPayload):
            what = "bench"
            measured = run_bench_measured(
                head.ctx,
                ctx.redis,
                head.host,
                head.transport,
                payload.bench,
                expect=expect,
                config=config,
                sampler=gang_telemetry.for_gang([(r.rank, r.host, r.transport) for r in ranks]),
            )
        else:
            what = "eval"
            measured = run_eval_measured(
                head.ctx, ctx.redis, config, head.host, head.transport, payload.eval, expect=expect
            )
        watch = asyncio.ensure_future(watch_ranks(ranks, f"during the {what}"))
        outcome = await race_watched(asyncio.ensure_future(measured), watch)
        assert isinstance(outcome, BenchOutcome | EvalOutcome)
        await store_members(ctx, group, ranks, outcome.run_id)
        ctx.commit(outcome.to_dict())  # `succeeded` unless a cancel came first
        return outcome


async def _verify_gang(ctx: GangJobContext, group: GroupConfig, ranks: list[Rank]) -> None:
    """Every rank is the engine the gang launch recorded on its member, alive, and runs the head's config.

    Each rank found is given its recorded process (``Rank.spawned``: pid, start tick, log), so the watcher and
    the diagnosis see it as the launch did; its ``state`` stays empty: this job never stops what it did not start.
    """
    head = ranks[0]
    head_record = observer.launched_record(ctx.redis, head.host.name)
    if head_record is None or recorded_rank(head_record, head.host.name) != 0:
        seen = await observer.observe_host(ctx.redis, head.host, head.transport)
        raise BenchbotError(
            f"no gang runs on {group.name}: its head {head.host.name} {_runs(seen, head_record)}. "
            f"/launch ... on {group.name} first (/status {group.name} shows what its members run)"
        )
    job = head_record.job
    for rank in ranks:
        record = observer.launched_record(ctx.redis, rank.host.name)
        seen = await observer.observe_host(ctx.redis, rank.host, rank.transport)
        if record is None or record.job != job or recorded_rank(record, rank.host.name) != rank.rank:
            raise BenchbotError(
                f"the gang on {group.name} (launched by job #{job}) is broken: {rank.name} is not its rank any more "
                f"({rank.host.name} {_runs(seen, record)}). Nothing was sent: /stop {group.name}, then "
                f"/launch ... on {group.name}"
            )
        if seen.process is None or seen.instance_id != record.instance_id:
            raise BenchbotError(
                f"the gang on {group.name} (launched by job #{job}) is broken: {rank.name} is not running "
                f"(its engine, pid {record.pid}, is gone; {rank.host.name} {_runs(seen, None)}). Nothing was sent: "
                f"/stop {group.name}, then /launch ... on {group.name}"
            )
        process = seen.process
        rank.log_path = record.log_path or ""
        rank.spawned = SpawnedProcess(process.pid, process.pgid, rank.log_path, process.start_ticks)
    await check_ranks_match(ranks)


def _runs(seen: RunningConfig, record: observer.LaunchRecord | None) -> str:
    """What a member runs, in a refusal: ``runs nothing``, ``runs an engine benchbot did not launch`` ..."""
    if seen.process is None or seen.state == ObservedState.NONE:
        return f"runs nothing on port {seen.port}"
    if record is not None and seen.instance_id == record.instance_id:
        return f"runs {record.label or 'an engine'} from job #{record.job}, not this gang's rank"
    return f"runs pid {seen.process.pid} ({seen.state.value}), not what the gang launch started there"
