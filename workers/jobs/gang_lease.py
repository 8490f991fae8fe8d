"""All-or-nothing leases on several hosts: a gang job holds every member's lease, or none, and checks them together.

A model served across boxes (issue 38) must not start a rank until every box is its own: a gang takes each
member's ordinary lease (:mod:`workers.jobs.lease`: the same key, fence, heartbeat and FIFO line as a
one-host job), and nothing here replaces them. What this module adds:

* **One global order.** Members are taken in sorted name order, each by waiting in that host's line like
  any job (:func:`workers.jobs.lease.acquire`, with the gang's one sequence number). A gang joins a
  member's line only once it holds every member before it; until then that host's line runs as if the gang
  were not there. The deadlock and starvation argument is in docs/queue.md ("Gangs"): in short, a job
  that waits is only ever blocked by a holder of its current host (who waits, if at all, on a later host)
  or by an earlier waiter in that host's line (who waits on that same host), so no chain of waits can
  close into a circle, and every wait is bounded by jobs that were ahead of it.
* **Nothing starts until all are held.** :func:`acquire_gang` returns only with every lease; on any
  exit without them (cancel, timeout, a held member lost while waiting for the next) it gives back what
  it held and leaves every line.
* **One fencing story.** :meth:`GangLease.check` before a side effect on a member passes only while
  *every* member's lease is proven ours with the margin (each a clock comparison while its last proof
  holds, one Redis round trip after: :class:`~workers.jobs.fence_check.FenceCheck`); a member whose
  heartbeat finds its lease gone marks every member lost, so the gang's next check fails whichever
  member it is for. :meth:`GangLease.checker` hands out one member's check as an object (picklable,
  like a FenceCheck) for code that takes one.
* **Released together**, in reverse order, each member's release tried even when another's fails.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import TypedDict, Unpack

import redis

from workers.errors import BenchbotError, LeaseLostError
from workers.jobs import lease
from workers.jobs.fence_check import FenceCheck
from workers.redis_conn import REDIS_DOWN, RedisOutage

log = logging.getLogger(__name__)


def gang_order(hosts: Iterable[str]) -> tuple[str, ...]:
    """The one order every gang takes its members in (sorted names); two or more distinct hosts."""
    members = tuple(hosts)
    if len(set(members)) != len(members):
        raise BenchbotError(f"a gang names each host once, not {', '.join(members)}")
    if len(members) < 2:
        raise BenchbotError("a gang needs at least two hosts (one host takes its own lease)")
    return tuple(sorted(members))


class GangFenceCheck:
    """One member's fence check in a gang: it passes only while every member's lease passes its own check.

    Holds the members' :class:`FenceCheck` objects themselves (the heartbeats extend and mark those), so a
    check is as cheap as theirs: clock comparisons while each last proof holds. A copy in another process
    (a bench shard) checks its own copies, each sound until its own deadline.
    """

    def __init__(self, host: str, members: tuple[FenceCheck, ...]) -> None:
        self.host = host
        self.members = members
        self.own = next(m for m in members if m.host == host)

    @property
    def fence(self) -> int:
        """This member's fence (read through: a re-fence of the member's lease moves it)."""
        return self.own.fence

    @property
    def lost_reason(self) -> str | None:
        """Why the gang can no longer touch this member (its own loss first), or None."""
        return self.own.lost_reason or next((m.lost_reason for m in self.members if m.lost_reason), None)

    def __call__(self) -> None:
        self.check()

    def check(self) -> None:
        """Return if every member's lease is ours with the margin; LeaseLostError (naming the member) otherwise."""
        self._each(FenceCheck.check)

    def verify(self) -> None:
        """Ask Redis for every member now, whatever the local deadlines say."""
        self._each(FenceCheck.verify)

    def deadline(self) -> float:
        """Until when (``time.monotonic()``) every member is proven ours with the margin: the earliest of theirs."""
        return min(m.deadline() for m in self.members)

    def _each(self, check: Callable[[FenceCheck], object]) -> None:
        for member in self.members:
            try:
                check(member)
            except LeaseLostError as exc:
                if member is self.own:
                    raise
                hosts = ", ".join(m.host for m in self.members)
                raise LeaseLostError(
                    f"lost the lease on {member.host}, a member of this gang ({hosts}): {exc}; stopped touching "
                    f"every member, {self.host} included"
                ) from exc


class GangLease:
    """Every member's lease, held together: check a member before touching it, release them all at once."""

    def __init__(self, r: redis.Redis, members: tuple[str, ...], job: str) -> None:
        self.redis = r
        self.hosts = members
        self.job = str(job)
        self.leases: dict[str, lease.Lease] = {}
        self._checkers: dict[str, GangFenceCheck] = {}
        self._on_lost: Callable[[str], None] | None = None

    @property
    def complete(self) -> bool:
        """True once every member's lease is held."""
        return len(self.leases) == len(self.hosts)

    @property
    def fences(self) -> dict[str, int]:
        """Each member's fence (what the host-side fence of that member compares with)."""
        return {host: held.fence for host, held in self.leases.items()}

    @property
    def lost(self) -> bool:
        """True once any member's lease was found gone: no member may be touched any more."""
        return any(held.lost for held in self.leases.values())

    def checker(self, host: str) -> GangFenceCheck:
        """The check to run before every side effect on member ``host`` (all members' leases, together)."""
        if not self.complete:
            raise LeaseLostError(
                f"the gang does not hold every member yet ({', '.join(self.leases)} of "
                f"{', '.join(self.hosts)}): not touching {host}"
            )
        if host not in self._checkers:
            if host not in self.leases:
                raise BenchbotError(f"{host} is not a member of this gang ({', '.join(self.hosts)})")
            members = tuple(self.leases[h].checker for h in self.hosts)
            self._checkers[host] = GangFenceCheck(host, members)
        return self._checkers[host]

    def check(self, host: str) -> None:
        """Raise LeaseLostError unless every member is still ours with the margin (before touching ``host``)."""
        self.checker(host).check()

    def check_all(self) -> None:
        """Ask Redis for every member's lease now (a round trip each): proof that the whole gang is still ours."""
        self.checker(self.hosts[0]).verify()

    def add(self, held: lease.Lease) -> None:
        """One more member's lease: its heartbeat starts now (it must live while the gang waits for the next)."""
        self.leases[held.host] = held
        held.start_heartbeat(on_lost=functools.partial(self._member_lost, held.host))

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(host)`` (from a heartbeat thread) when a member's lease is found gone."""
        self._on_lost = callback

    def _member_lost(self, host: str) -> None:
        why = self.leases[host].checker.lost_reason or "it was lost"
        for other, held in self.leases.items():
            if other != host:
                held.checker.lose(f"the gang's lease on {host} was lost ({why})")
        log.warning("gang job %s: lease on %s lost; every member stops (%s)", self.job, host, ", ".join(self.hosts))
        if self._on_lost is not None:
            self._on_lost(host)

    def release(self) -> dict[str, bool]:
        """Give every member back (last taken first); per member, False if it was no longer ours."""
        released: dict[str, bool] = {}
        for host in reversed(list(self.leases)):
            try:
                released[host] = self.leases[host].release()
            except REDIS_DOWN:
                log.warning(
                    "gang job %s: could not release %s (Redis unreachable); it expires in one TTL", self.job, host
                )
                released[host] = False
        return released

    def __enter__(self) -> GangLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class MemberWait(TypedDict, total=False):
    """How each member is waited for, passed through to :func:`workers.jobs.lease.acquire` as given."""

    worker: str | None
    ttl_s: float
    margin_s: float | None
    poll_s: float
    outage: RedisOutage | None


def acquire_gang(
    r: redis.Redis,
    hosts: Iterable[str],
    *,
    job: str,
    user: str,
    seq: int | None = None,
    timeout_s: float | None = None,
    abort: Callable[[], None] | None = None,
    on_wait: Callable[[str, str, str], None] | None = None,
    **options: Unpack[MemberWait],
) -> GangLease:
    """Wait for every member of the gang, in :func:`gang_order`, and return them held (heartbeats running).

    Each member is waited for in its own line with the gang's ``seq`` (:func:`workers.jobs.lease.acquire`, which
    gets ``options``: worker, TTL, margin, poll interval, Redis outage policy),
    joined only once every earlier member is held. ``abort`` is called every poll and may raise (a cancel);
    ``on_wait(host, kind, blocker)`` whenever what blocks the gang changes; ``timeout_s`` bounds the whole
    wait. Any exit without every lease gives back those held and leaves the lines; a held member whose
    lease is lost while the gang waits for a later one ends the wait with LeaseLostError.
    """
    members = gang_order(hosts)
    gang = GangLease(r, members, str(job))
    until = None if timeout_s is None else time.monotonic() + timeout_s

    def still_holding() -> None:
        for held in gang.leases.values():
            if held.lost:
                raise LeaseLostError(
                    f"lost the lease on {held.host} while the gang waited for its next member: "
                    f"{held.checker.lost_reason}; giving back every member"
                )
        if abort is not None:
            abort()

    try:
        for host in members:
            waited = None if on_wait is None else _on_wait_for(on_wait, host)
            gang.add(
                lease.acquire(
                    r,
                    host,
                    job=str(job),
                    user=user,
                    seq=seq,
                    timeout_s=None if until is None else max(0.0, until - time.monotonic()),
                    abort=still_holding,
                    on_wait=waited,
                    gang=members,
                    **options,
                )
            )
        still_holding()  # the last grant may have come just as an earlier member was lost
    except BaseException:
        with contextlib.suppress(*REDIS_DOWN):
            gang.release()
        raise
    return gang


def _on_wait_for(on_wait: Callable[[str, str, str], None], host: str) -> Callable[[str, str], None]:
    """``lease.acquire``'s ``on_wait(kind, blocker)`` for one member, as the gang's ``on_wait(host, kind, blocker)``."""
    return lambda kind, blocker: on_wait(host, kind, blocker)
