"""A failed sweep cell or tune trial is stored only while its host is still the job's.

A launch that fails because the job's lease was lost (the worker paused past its TTL, the reaper reported it
"worker died" and the host passed on) is not the config's failure: stored, it would be a run of a job already
reported dead, and for /tune a config marked crashed and never proposed again. The soak's ``times_are_true``
property found such a run (docs/reliability.md, section 8). Every other store of a run follows a fence check
(``bench_run``, ``eval_run``); this is the one for failed runs.
"""

from __future__ import annotations

from collections.abc import Mapping

from workers.jobs.context import JobContext
from workers.results import store
from workers.results.record import RunRecord


def store_failed_run(
    ctx: JobContext,
    *,
    host: str,
    label: str,
    params: Mapping[str, object],
    diagnosis: Mapping[str, object],
    sweep_id: str | None,
    kind: str,
) -> RunRecord:
    """:func:`workers.results.store.failed_run` after the fence check (LeaseLostError: nothing stored)."""
    ctx.check_fence()
    return store.failed_run(
        ctx.redis,
        job_id=ctx.job_id,
        user=ctx.user,
        host=host,
        label=label,
        sweep_id=sweep_id,
        params=params,
        diagnosis=diagnosis,
        kind=kind,
    )
