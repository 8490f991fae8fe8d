"""``/bench``: benchmark what runs, if it is what the requester meant."""

from __future__ import annotations

from workers.jobs.bench_run import run_bench_measured
from workers.jobs.bodies.base import JobBody
from workers.jobs.expectation import expectation_of
from workers.jobs.host_job import HostJob
from workers.jobs.outcomes import BenchOutcome
from workers.jobs.payloads import BenchPayload


class BenchBody(JobBody[BenchPayload, BenchOutcome]):
    async def run(self, job: HostJob, payload: BenchPayload) -> BenchOutcome:
        expect = expectation_of(payload.any_config, payload.expect)
        return await run_bench_measured(
            job.ctx, job.ctx.redis, job.host, job.transport, payload.bench, expect=expect, config=job.config
        )


#: The ``bench`` job.
bench_job = BenchBody()
