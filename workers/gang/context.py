"""A gang job's context: every member's lease (workers/jobs/gang_lease.py), and one view of it per member.

:class:`GangJobContext` is the ordinary :class:`~workers.jobs.context.JobContext` (events, cancel, one
ending) whose lease step takes the whole gang: it returns only holding every member, in the one global
order, and releases them together. Its own ``host`` is the first member (the queue the job came from).

A job body's toolkit (``free_port``, ``launch``'s pieces, ``kill_started``, the bench) acts on one host
through a context's ``check``/``check_fence``/``fenced_set`` and its fence. :meth:`GangJobContext.member`
gives each member such a context: the same job (its events, cancel flag and record of what was done are
shared), with that member's lease and fence, and a fence check that passes only while **every** member's
lease is ours (``GangLease.check``), so every side effect on every member is preceded by its own member's
fence check and stops when any member is lost.
"""

from __future__ import annotations

from collections.abc import Callable

from workers.config import GroupConfig
from workers.errors import LeaseLostError
from workers.jobs import faults, gang_lease, waiting_line
from workers.jobs.context import LEASE_LOST_MESSAGE, JobContext
from workers.jobs.events import ProgressPhase
from workers.jobs.lease_holder import LeaseHolder
from workers.json_value import JsonObject


class GangJobContext(JobContext):
    """A JobContext that holds every member of ``group`` (or none), checked and released together."""

    def __init__(self, group: GroupConfig, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.group = group
        self.gang: gang_lease.GangLease | None = None
        self._members: dict[str, MemberContext] = {}

    def __enter__(self) -> GangJobContext:
        super().__enter__()
        return self

    def _take_lease(self) -> None:
        self.gang = gang_lease.acquire_gang(
            self.redis,
            self.group.members,
            job=self.job_id,
            user=self.user,
            seq=self.seq,
            abort=self._abort_if_needed,
            on_wait=self._on_member_wait,
            worker=self.worker,
            ttl_s=self.lease_ttl_s,
            margin_s=self.lease_margin_s,
            outage=self._outage,
        )
        self.lease = self.gang.leases[self.host]
        self.fence = self.lease.fence

    def _give_back_lease(self) -> None:
        if self.gang is not None:
            self.gang.release()
        else:  # acquire_gang left every line it joined; the first member's place came with the enqueue
            waiting_line.remove_waiter(self.redis, self.host, self.job_id)

    def _on_member_wait(self, host: str, kind: str, blocker: str) -> None:
        if kind == "lease":
            holder = LeaseHolder.from_json(blocker)
            message = f"waiting for {host} (member of {self.group.name}): job {holder.job} ({holder.user}) holds it"
        else:
            message = f"waiting for {host} (member of {self.group.name}): job {blocker} is ahead in line"
        self.progress(ProgressPhase.WAITING, message)

    def check_fence(self, point: str | None = None) -> None:
        """Every member's lease, together (the gang may touch none once one is lost)."""
        if point is not None:
            faults.pause_at(point, self.job_id)
        if self.gang is None:
            raise LeaseLostError(LEASE_LOST_MESSAGE)
        self.gang.check(self.host)

    def member(self, host: str) -> MemberContext:
        """The context to act on member ``host`` with (made once per member)."""
        if host not in self._members:
            self._members[host] = MemberContext(self, host)
        return self._members[host]


class MemberContext(JobContext):
    """One member's view of a gang job: that member's host, lease and fence; the job's events and cancel.

    Never entered (the gang's context owns the job's lifecycle): it shares the gang context's state,
    so a cancel seen by either is seen by both, and what one member's stop did is in the job's ending.
    """

    def __init__(self, gang_ctx: GangJobContext, host: str) -> None:
        self.__dict__.update(gang_ctx.__dict__)
        if gang_ctx.gang is None:
            raise LeaseLostError(LEASE_LOST_MESSAGE)
        self.gang_ctx = gang_ctx
        self.host = host
        self.lease = gang_ctx.gang.leases[host]
        self.fence = self.lease.fence

    def check_fence(self, point: str | None = None) -> None:
        """This member's check: passes only while every member's lease is ours."""
        if point is not None:
            faults.pause_at(point, self.job_id)
        assert self.gang_ctx.gang is not None
        self.gang_ctx.gang.check(self.host)

    def request_gate(self, point: str = faults.BEFORE_BENCH_REQUEST) -> Callable[[], None]:
        """The hot path's gate on this member: every member's lease, clock comparisons while proven."""
        assert self.gang_ctx.gang is not None
        return faults.PausingGate(point, self.gang_ctx.gang.checker(self.host), self.job_id)

    def commit(self, payload: JsonObject) -> None:
        raise RuntimeError("a member's context never ends the job: the gang's context commits")
