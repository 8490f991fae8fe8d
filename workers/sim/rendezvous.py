"""A simulated gang's rendezvous: ``--nnodes N --node-rank R --dist-init-addr HEAD:PORT`` across simulated hosts.

Real SGLang ranks meet in ``torch.distributed.init_process_group`` at ``--dist-init-addr`` (rank 0's
TCPStore), between its log lines ``Init torch distributed begin.`` and ``Init torch distributed ends.``;
no rank loads weights before every rank is there, and only rank 0 (the head) serves HTTP (a rank above 0
runs its schedulers and waits). The simulator imitates that with one TCP socket: the head listens on the
rendezvous port and answers ``go`` once all ``N - 1`` other ranks have said ``rank R``; each other rank
connects (retrying, as the TCPStore client does) until it is let in or its time runs out.

Faults to inject (docs/sim.md): ``--sim-join-delay-s`` (``BENCHBOT_SIM_JOIN_DELAY_S``) makes a rank slow to
join; ``--sim-join-timeout-s`` (``BENCHBOT_SIM_JOIN_TIMEOUT_S``, default ``--dist-timeout`` or 60 s) bounds
every rank's wait; a rank killed is a rank killed (its process, by its pid in the sim registry).

**No recorded text.** No recorded contract (``workers/engines/contracts/``) holds what a real rank prints when
it cannot reach the head: that is torch.distributed's TCPStore error, outside the SGLang sources the
contracts are recorded from. So the two failure lines here are the simulator's own words, marked
``[sim]`` so that nobody mistakes them for SGLang's; benchbot's diagnosis does not match on them (it
names the rank from what it watched: the process died, or never logged ``Init torch distributed ends.``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

#: The simulator's own line for a rank that could not reach the head (no recorded text exists; see above).
UNREACHABLE_HEAD = "[sim] rank {rank} could not reach the head at {addr} within {timeout:g} s; exiting"
#: The simulator's own line for a head that waited in vain for ranks (no recorded text exists either).
RANKS_MISSING = "[sim] the head waited {timeout:g} s at {addr} for rank(s) {missing} of {nnodes}; exiting"
#: The simulator's own line for a head whose rendezvous port is taken (torch's own error is not recorded either).
HEAD_PORT_TAKEN = "[sim] the head cannot listen at {addr} for the other ranks ({error}); exiting"
RETRY_S = 0.2


@dataclass(frozen=True)
class Gang:
    """This process's place in a gang: how many ranks, which one it is, and where they meet."""

    nnodes: int
    rank: int
    host: str
    port: int

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_head(self) -> bool:
        return self.rank == 0


class JoinFailed(Exception):
    """The rendezvous did not complete in time; ``line`` is what the rank logs before it exits."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


def gang_of(nnodes: int, node_rank: int, dist_init_addr: str | None) -> Gang | None:
    """The gang an SGLang launch names, None for a one-node launch (``--nnodes 1``, the default)."""
    if nnodes <= 1:
        return None
    host, _, port = (dist_init_addr or "127.0.0.1:0").rpartition(":")
    return Gang(nnodes=nnodes, rank=node_rank, host=host or "127.0.0.1", port=int(port or 0))


async def join(gang: Gang, *, delay_s: float, timeout_s: float, stop: asyncio.Event) -> float:
    """Meet the other ranks; return the seconds it took, raise :class:`JoinFailed` past ``timeout_s``.

    Returns early (0) when ``stop`` is set: a stopped rank just exits."""
    t0 = time.monotonic()
    if gang.is_head:
        await _host_rendezvous(gang, timeout_s, stop)
    else:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay_s)  # the fault: a rank slow to join
        if not stop.is_set():
            await _reach_head(gang, timeout_s, stop)
    return time.monotonic() - t0


async def _host_rendezvous(gang: Gang, timeout_s: float, stop: asyncio.Event) -> None:
    joined: dict[int, asyncio.StreamWriter] = {}
    everyone = asyncio.Event()

    async def on_peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await asyncio.wait_for(reader.readline(), 5.0)).decode().split()
        except (TimeoutError, OSError, UnicodeDecodeError):
            writer.close()
            return
        if len(line) == 2 and line[0] == "rank" and line[1].isdigit() and 0 < int(line[1]) < gang.nnodes:
            joined[int(line[1])] = writer
            if len(joined) == gang.nnodes - 1:
                everyone.set()
        else:
            writer.close()

    try:
        server = await asyncio.start_server(on_peer, gang.host, gang.port, reuse_address=True)
    except OSError as exc:
        raise JoinFailed(HEAD_PORT_TAKEN.format(addr=gang.addr, error=exc.strerror or exc)) from exc
    try:
        waiters = {asyncio.ensure_future(everyone.wait()), asyncio.ensure_future(stop.wait())}
        _, pending = await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if not everyone.is_set() and not stop.is_set():
            missing = ", ".join(str(r) for r in range(1, gang.nnodes) if r not in joined)
            raise JoinFailed(
                RANKS_MISSING.format(timeout=timeout_s, addr=gang.addr, missing=missing, nnodes=gang.nnodes)
            )
        for writer in joined.values():
            with contextlib.suppress(OSError):
                writer.write(b"go\n")
                await writer.drain()
    finally:
        for writer in joined.values():
            writer.close()
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()


async def _reach_head(gang: Gang, timeout_s: float, stop: asyncio.Event) -> None:
    until = time.monotonic() + timeout_s
    while not stop.is_set():
        left = until - time.monotonic()
        if left <= 0:
            break
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(gang.host, gang.port), min(left, 2.0))
        except (OSError, TimeoutError):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(RETRY_S, max(0.0, until - time.monotonic())))
            continue
        try:
            writer.write(f"rank {gang.rank}\n".encode())
            await writer.drain()
            answer = await asyncio.wait_for(reader.readline(), max(0.1, until - time.monotonic()))
        except (OSError, TimeoutError):
            answer = b""
        finally:
            writer.close()
        if answer.strip() == b"go":
            return
    if not stop.is_set():
        raise JoinFailed(UNREACHABLE_HEAD.format(rank=gang.rank, addr=gang.addr, timeout=timeout_s))
