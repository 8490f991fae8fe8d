"""``/stop GROUP``: stop the engine on every member (by identity, as a one-host ``/stop`` does) and prove each free."""

from __future__ import annotations

from workers.config import Config, GroupConfig
from workers.gang.context import GangJobContext
from workers.gang.members import open_ranks, prove_free
from workers.jobs.bodies.stop import stop_message
from workers.jobs.outcomes import StopOutcome, Stopped
from workers.jobs.payloads import StopPayload
from workers.jobs.port_owner import free_port


async def gang_stop(ctx: GangJobContext, config: Config, group: GroupConfig, payload: StopPayload) -> StopOutcome:
    """Every member's engine stopped (a follower rank is a loading engine to the port's observer: stopped too),
    each member then shown free; the outcome names what each member had."""
    force = payload.force and config.access.is_admin(ctx.user)
    said: list[str] = []
    first: Stopped | None = None
    async with open_ranks(ctx, config, group) as ranks:
        for rank in ranks:
            stopped = await free_port(rank.ctx, ctx.redis, rank.host, rank.transport, stop_loading=True, force=force)
            first = first or stopped
            said.append(
                f"{rank.host.name}: " + (stop_message(stopped) if stopped else f"nothing on port {rank.host.port}")
            )
        proofs = [await prove_free(r.host, r.transport, (group.port,) if r.rank == 0 else ()) for r in ranks]
    outcome = StopOutcome(stopped=first, message=f"{group.name}: {'; '.join(said)}. {'; '.join(proofs)}")
    ctx.commit(outcome.to_dict())
    return outcome
