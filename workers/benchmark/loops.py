"""The two loops a shard runs its measured requests in: closed (exactly C in flight) or open (on a schedule).

A closed loop answers "what does the server do with C users who never think"; an open loop sends each
request at its precomputed time whatever is in flight (``workers.benchmark.schedule``), so a slow server
shows as a growing queue instead of a slower sender. Both run an optional ``gate()`` before each send (a
job passes its lease fence check): what it raises cancels the other requests in flight and propagates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from workers.benchmark import schedule as arrivals_schedule

#: Called before each request is sent; raises (e.g. LeaseLostError) to abort the bench. Picklable when
#: the level runs in several processes.
Gate = Callable[[], None]
#: What a sender's ``send`` returns (a raw response, decoded after the level).
Item = TypeVar("Item")


async def closed_loop(
    send: Callable[[bytes], Awaitable[Item]], bodies: Sequence[bytes], concurrency: int, gate: Gate | None = None
) -> list[Item]:
    """Exactly ``concurrency`` requests in flight: each worker sends its next request when one ends.

    ``gate()`` runs before each send, outside any error handling: if it raises (the lease is gone), the
    other workers are cancelled, in-flight requests included, and the exception propagates as it is.
    """
    results: list[Item | None] = [None] * len(bodies)
    todo = iter(range(len(bodies)))

    async def worker() -> None:
        for i in todo:  # one shared iterator: next() never awaits, so no index is taken twice
            if gate is not None:
                gate()
            results[i] = await send(bodies[i])

    tasks = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, len(bodies)))]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return [r for r in results if r is not None]


async def open_loop(
    send: Callable[[bytes], Awaitable[Item]],
    bodies: Sequence[bytes],
    offsets_ns: Sequence[int],
    gate: Gate | None = None,
) -> tuple[list[Item], list[int], str | None]:
    """Send request ``i`` at ``offsets_ns[i]`` from now, whatever is in flight; wait for all to end.

    The gate runs in the pacer before each send (so what it raises stops the sending at once and the
    in-flight requests are cancelled). Returns the responses and their due times, in schedule order.
    A pacer that falls a whole minute behind gives up: the level would measure the client.
    """
    results: list[Item | None] = [None] * len(bodies)
    tasks: list[asyncio.Task[None]] = []

    async def one(i: int) -> None:
        results[i] = await send(bodies[i])

    def fire(i: int) -> None:
        if gate is not None:
            gate()
        tasks.append(asyncio.ensure_future(one(i)))

    schedule = arrivals_schedule.ArrivalSchedule(0.0, "given", None, tuple(o / 1e9 for o in offsets_ns))
    try:
        paced = await arrivals_schedule.pace(schedule, fire, give_up_lag_s=60.0)
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    sent = [(results[i], due) for i, due in zip(paced.indices, paced.scheduled_ns, strict=True)]
    return [r for r, _ in sent if r is not None], [d for r, d in sent if r is not None], paced.stopped
