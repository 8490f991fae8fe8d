"""``/launch ... on GROUP [then bench ...]``: every rank started on its member, ready, watched and stopped together.

Under every member's lease (:class:`~workers.gang.context.GangJobContext`): each rank is compiled for the
release its host runs (``ranks.compile_rank``: nothing is touched when one is refused), each member's port
is freed, every rank is spawned, and the launch is ready only when the head answers (the engine's own wait
and smoke test, on the head) **and** every rank is alive. A rank that dies, or never joins before the
group's launch deadline, ends the launch with a diagnosis naming the rank, its host and its last log
lines. The verified config is read from the head, and every rank's command line is checked to run the same
model and flags apart from its rank's (and its own host's port). ``then bench`` measures through the head
while every rank is watched: a rank that dies mid-bench ends the job, naming it. On every failure and on
cancel, every rank this job started is stopped by identity and each member is shown free.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

from workers import observer
from workers.config import Config, GroupConfig
from workers.engines import multinode
from workers.engines.diagnosis import Diagnosis
from workers.engines.registry import driver_for
from workers.errors import BenchbotError
from workers.gang import fingerprints as gang_fingerprints
from workers.gang import telemetry as gang_telemetry
from workers.gang.context import GangJobContext
from workers.gang.hosts import rank_host
from workers.gang.members import open_ranks, prove_free, stop_ranks
from workers.gang.ranks import Rank, compile_rank, has_joined, is_alive, rank_diagnosis, spawn_rank
from workers.jobs import faults
from workers.jobs.bench_run import run_bench_measured
from workers.jobs.engine_launch import LaunchFailed, diagnosis_dict
from workers.jobs.events import ProgressPhase
from workers.jobs.outcomes import BenchOutcome, LaunchOutcome, ReadyData
from workers.jobs.payloads import Expectation, LaunchPayload
from workers.jobs.port_owner import free_port, who_else_listens
from workers.json_value import JsonValue
from workers.observation import diff_requested
from workers.results import store
from workers.telemetry import fingerprint
from workers.telemetry import run as run_telemetry

#: How often every rank is looked at while the head loads and while the gang benches.
WATCH_S = 0.5
#: Flags that are each host's own, so they may differ between ranks (the engine's HTTP port and bind address).
PER_HOST_FLAGS = frozenset({"--port", "--host"})


async def gang_launch(ctx: GangJobContext, config: Config, group: GroupConfig, payload: LaunchPayload) -> LaunchOutcome:
    """The gang's launch (and bench); the outcome is committed here, while the ranks can still be stopped."""
    if payload.eval is not None:
        raise BenchbotError(f"/launch ... on {group.name} then eval is not built yet (issue 38): bench it instead")
    head_host = rank_host(config, group, group.head)
    async with open_ranks(ctx, config, group) as ranks:
        try:
            for rank in ranks:
                await compile_rank(rank, config, group, payload.launch, head_host)
            for rank in ranks:  # a follower never listens: "loading" is its steady state, stopped like a server
                await free_port(rank.ctx, ctx.redis, rank.host, rank.transport, stop_loading=rank.rank > 0)
            for rank in ranks:
                await spawn_rank(rank)
            ready = await _wait_gang_ready(ctx, ranks)
            bench = await _bench_watched(ctx, config, ranks, payload) if payload.bench is not None else None
            if bench is not None:
                await store_members(ctx, group, ranks, bench.run_id)
            outcome = LaunchOutcome(config=ready.config, diff=ready.diff, bench=bench)
            ctx.commit(outcome.to_dict())  # `succeeded` unless a cancel came first
            return outcome
        except BaseException as exc:
            await stop_ranks(ranks)
            freed = await asyncio.gather(*(_free_words(r, group) for r in ranks if r.spawned is not None))
            if isinstance(exc, LaunchFailed) and freed and isinstance(exc.diagnosis, dict):
                exc.diagnosis["summary"] = (
                    f"{exc.diagnosis.get('summary')}. benchbot stopped every rank: {'; '.join(freed)}"
                )
            raise


async def store_members(ctx: GangJobContext, group: GroupConfig, ranks: list[Rank], run_id: str) -> None:
    """Every member's host fingerprint on the stored run (the run's own is the head's, where it was measured)."""
    prints = await asyncio.gather(
        *(run_telemetry.host_extra(r.host, r.transport, r.facts.version if r.facts else None) for r in ranks)
    )
    members = [(r.rank, r.host.name, fp.get(fingerprint.EXTRA_KEY)) for r, fp in zip(ranks, prints, strict=True)]
    record = store.get_run(ctx.redis, run_id)
    extra = {**record.extra, **gang_fingerprints.members_extra(group.name, members)}
    store.save_run(ctx.redis, dataclasses.replace(record, extra=extra))


async def _free_words(rank: Rank, group: GroupConfig) -> str:
    extra = (group.port,) if rank.rank == 0 else ()
    with contextlib.suppress(Exception):
        return await prove_free(rank.host, rank.transport, extra)
    return f"{rank.host.name}: not shown free (its transport failed)"


async def watch_ranks(ranks: list[Rank], what: str) -> None:
    """Return never; raise LaunchFailed naming the first rank found dead (``what``: when it died)."""
    while True:
        for rank in ranks:
            rank.ctx.check()  # the gang's fence and the cancel flag, before looking
            if not await is_alive(rank):
                if rank.spawned is not None:
                    await rank.transport.wait_log_written(rank.spawned)
                diagnosis = await rank_diagnosis(rank, f"died {what}", "rank_died")
                raise LaunchFailed(str(diagnosis["summary"]), diagnosis)
        await asyncio.sleep(WATCH_S)


async def race_watched(main: asyncio.Future, watch: asyncio.Future) -> object:
    """``main``'s result, unless ``watch`` raised first (then ``main`` is cancelled and that error raised)."""
    try:
        done, _ = await asyncio.wait({main, watch}, return_when=asyncio.FIRST_COMPLETED)
        if main in done:
            return main.result()
        watch.result()  # raises: the watcher only ever ends by raising
        raise AssertionError("the rank watcher ended without a reason")
    finally:
        for task in (main, watch):
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


async def _wait_gang_ready(ctx: GangJobContext, ranks: list[Rank]) -> ReadyData:
    """The head's own readiness wait and smoke test, while every other rank is watched."""
    head = ranks[0]
    host, transport, spec, facts = head.host, head.transport, head.spec, head.facts
    spawned = head.spawned
    assert spec is not None and facts is not None and spawned is not None
    driver = driver_for(host.engine.kind)
    contract = facts.contract
    log_offset = 0

    async def head_alive() -> bool:
        if await is_alive(head):
            return True
        await transport.wait_log_written(spawned)
        return False

    async def read_new_log() -> str:
        nonlocal log_offset
        text, log_offset = await transport.read_log(head.log_path, log_offset)
        return text

    async def foreign_listener() -> str | None:
        return await who_else_listens(transport, host.port, spawned.pgid)

    ctx.progress(ProgressPhase.WATCH, f"waiting for {host.base_url}/health on the head; watching every rank")
    waited = await race_watched(
        asyncio.ensure_future(
            head.ctx.guard(
                driver.wait_ready(
                    host.base_url,
                    deadline_s=host.engine.launch_timeout_s,
                    is_alive=head_alive,
                    read_new_log=read_new_log,
                    api_key=host.engine.api_key(),
                    gate=head.ctx.check_fence,
                    foreign_listener=foreign_listener,
                    contract=contract,
                )
            )
        ),
        asyncio.ensure_future(watch_ranks(ranks[1:], "before the gang was ready")),
    )
    if isinstance(waited, Diagnosis):
        raise await blame_head_failure(ranks, waited)
    ctx.progress(ProgressPhase.SMOKE, "checking a generation from the head is not garbage")
    head.ctx.check(faults.BEFORE_SMOKE)
    smoke = await head.ctx.guard(driver.smoke_test(host.base_url, host.engine.api_key()))
    if not smoke.ok:
        tail = await transport.tail(head.log_path, 40)
        diagnosis = diagnosis_dict(driver.smoke_diagnosis(smoke, "\n".join(tail)))
        raise LaunchFailed(f"{spec.label} answers garbage on the head ({smoke.reason})", diagnosis)
    ctx.progress(ProgressPhase.OBSERVE, "reading the config the head reports, and every rank's command line")
    running = await observer.observe_host(ctx.redis, host, transport)
    await check_ranks_match(ranks)
    ready = ReadyData(
        config=running,
        diff=tuple(diff_requested(driver.requested_args(dict(spec.flags), contract), running.args)),
        launch=spec.to_dict(),
        smoke_text=smoke.text,
        smoke_completion_tokens=smoke.completion_tokens,
        engine_version=facts.version,
        checked_against=facts.source,
    )
    ranks_data: list[JsonValue] = [
        {"rank": r.rank, "host": r.host.name, "pid": r.spawned.pid if r.spawned else None} for r in ranks
    ]
    ctx.ready({**ready.to_dict(), "gang": {"group": ctx.group.name, "ranks": ranks_data}})
    return ready


async def blame_head_failure(ranks: list[Rank], head_diagnosis: Diagnosis) -> LaunchFailed:
    """The head never served: a rank that died or never joined is the cause to name; else the head's own."""
    for rank in ranks[1:]:
        if not await is_alive(rank):
            d = await rank_diagnosis(rank, "died before the gang was ready", "rank_died")
            return LaunchFailed(str(d["summary"]), d)
        if await has_joined(rank) is False:
            what = f"never joined the head ({ranks[0].name}) before the launch deadline"
            d = await rank_diagnosis(rank, what, "rank_never_joined")
            return LaunchFailed(str(d["summary"]), d)
    d = diagnosis_dict(head_diagnosis)
    d.update(rank=0, host=ranks[0].host.name, summary=f"{ranks[0].name} (the head): {head_diagnosis.summary}")
    return LaunchFailed(str(d["summary"]), d)


async def check_ranks_match(ranks: list[Rank]) -> None:
    """Every rank runs the head's model and flags, apart from its rank's flags and its own host's port."""
    head = ranks[0]
    driver = driver_for(head.host.engine.kind)
    form = multinode.form_for(head.host.engine.kind, driver.name)

    async def flags_of(rank: Rank) -> dict[str, object]:
        info = await rank.transport.process_info(rank.spawned.pid) if rank.spawned else None
        if info is None:
            raise LaunchFailed(f"{rank.name} is gone", await rank_diagnosis(rank, "is gone", "rank_died"))
        args = multinode.without_rank_flags(form, dict(driver.launch_args(info.argv)))
        return {flag: value for flag, value in args.items() if flag not in PER_HOST_FLAGS}

    want = await flags_of(head)
    for rank in ranks[1:]:
        got = await flags_of(rank)
        if got != want:
            differ = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
            words = ", ".join(f"{k}: head {want.get(k)!r}, this rank {got.get(k)!r}" for k in differ[:5])
            d = await rank_diagnosis(rank, f"does not run the head's config ({words})", "rank_mismatch")
            raise LaunchFailed(str(d["summary"]), d)


async def _bench_watched(
    ctx: GangJobContext, config: Config, ranks: list[Rank], payload: LaunchPayload
) -> BenchOutcome:
    """``then bench`` through the head, every rank watched: a rank that dies ends the bench, named. Every
    member's GPUs are sampled and summed per level (:mod:`workers.gang.telemetry`)."""
    head = ranks[0]
    assert payload.bench is not None and head.spec is not None
    bench = asyncio.ensure_future(
        run_bench_measured(
            head.ctx,
            ctx.redis,
            head.host,
            head.transport,
            payload.bench,
            expect=Expectation(after_job=ctx.job_id),
            label=head.spec.label,
            config=config,
            sampler=gang_telemetry.for_gang([(r.rank, r.host, r.transport) for r in ranks]),
        )
    )
    result = await race_watched(bench, asyncio.ensure_future(watch_ranks(ranks, "during the bench")))
    assert isinstance(result, BenchOutcome)
    return result
