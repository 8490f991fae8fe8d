"""The shape every job body shares, with one hook a kind overrides.

:meth:`JobBody.__call__` is the template: open the host's transport, claim the host for this job's fence
and clear what a dead launch left (``workers.jobs.host_job.with_transport``), run the kind's
:meth:`JobBody.run` over a :class:`~workers.jobs.host_job.HostJob`, and commit its outcome (``succeeded``
unless a cancel came first). On a cancel the body's started engine, if it did not hand it over, is
stopped again. A kind overrides ``run`` and nothing else, as rq's worker variants override one method.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from workers.config import Config
from workers.host.transport import Transport
from workers.jobs.context import JobCancelled, JobContext
from workers.jobs.host_job import HostJob, kill_started, with_transport
from workers.json_value import JsonValue


class _Payload(Protocol):
    @property
    def host(self) -> str: ...


class _Outcome(Protocol):
    def to_dict(self) -> dict[str, JsonValue]: ...


PayloadT = TypeVar("PayloadT", bound=_Payload)
OutcomeT = TypeVar("OutcomeT", bound=_Outcome)


class JobBody(Generic[PayloadT, OutcomeT]):
    """One kind of job; subclasses override :meth:`run`."""

    async def __call__(self, ctx: JobContext, config: Config, payload: PayloadT) -> OutcomeT:
        host = config.host(payload.host)

        async def on_host(transport: Transport) -> OutcomeT:
            job = HostJob(ctx, config, host, transport)
            try:
                outcome = await self.run(job, payload)
                ctx.commit(outcome.to_dict())  # `succeeded` unless a cancel came first (JobCancelled)
            except JobCancelled:
                await kill_started(ctx, transport, job.started)  # what it started and did not hand over
                raise
            return outcome

        return await with_transport(host, on_host, ctx=ctx, config=config)

    async def run(self, job: HostJob, payload: PayloadT) -> OutcomeT:
        """The kind's work on its claimed host; the outcome is committed by :meth:`__call__`."""
        raise NotImplementedError
