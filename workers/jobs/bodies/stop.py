"""``/stop``: stop whatever engine owns the engine port (one still loading too)."""

from __future__ import annotations

from workers.jobs.bodies.base import JobBody
from workers.jobs.host_job import HostJob
from workers.jobs.outcomes import StopOutcome, Stopped
from workers.jobs.payloads import StopPayload
from workers.jobs.port_owner import free_port


def stop_message(stopped: Stopped) -> str:
    """``stopped <what>``, with how only when it says more than "stopped" (never "stopped X (stopped)")."""
    what = stopped.config.summary or "the server"
    how = stopped.how.removeprefix("stopped").lstrip("; ")
    return f"stopped {what}" + (f" ({how})" if how else "")


class StopBody(JobBody[StopPayload, StopOutcome]):
    async def run(self, job: HostJob, payload: StopPayload) -> StopOutcome:
        host = job.host
        # `force` is an admin's word: asked again here, by this worker's own access list
        force = payload.force and job.config.access.is_admin(job.ctx.user)
        stopped = await free_port(job.ctx, job.ctx.redis, host, job.transport, stop_loading=True, force=force)
        if stopped is None:
            return StopOutcome(stopped=None, message=f"nothing on port {host.port} of {host.name}")
        return StopOutcome(stopped=stopped, message=stop_message(stopped))


#: The ``stop`` job.
stop_job = StopBody()
