"""``/eval``: check the accuracy of what runs, if it is what the requester meant."""

from __future__ import annotations

from workers.jobs.bodies.base import JobBody
from workers.jobs.eval_run import run_eval_measured
from workers.jobs.expectation import expectation_of
from workers.jobs.host_job import HostJob
from workers.jobs.outcomes import EvalOutcome
from workers.jobs.payloads import EvalPayload


class EvalBody(JobBody[EvalPayload, EvalOutcome]):
    async def run(self, job: HostJob, payload: EvalPayload) -> EvalOutcome:
        expect = expectation_of(payload.any_config, payload.expect)
        return await run_eval_measured(
            job.ctx, job.ctx.redis, job.config, job.host, job.transport, payload.eval, expect=expect
        )


#: The ``eval`` job.
eval_job = EvalBody()
