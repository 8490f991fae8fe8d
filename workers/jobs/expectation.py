"""Is the server running now the one the requester meant? Checked before a bench or an eval measures it.

The expectation is stamped on the job when it is queued (``workers.jobs.payloads.Expectation``); a
server that is not the one meant is refused rather than measured under a wrong label.
"""

from __future__ import annotations

from workers.jobs.payloads import Expectation
from workers.observation import RunningConfig
from workers.observer import LaunchRecord


def check_expectation(expect: Expectation | None, observed: RunningConfig, launched: LaunchRecord | None) -> str | None:
    """Why the running server is not the one the requester meant, or None when it is.

    ``None`` means ``any`` (measure whatever runs); an expectation nobody could establish refuses.
    """
    if expect is None:
        return None
    label = observed.summary or "an unknown config"
    if expect.unknown is not None:
        return (
            f"benchbot could not tell which server you meant when you asked ({expect.unknown}), and now "
            f"{label} runs: it will not measure a server nobody chose"
        )
    if expect.nothing_running:
        return f"nothing was running when you asked, and now {label} runs: it is not the server you meant to measure"
    if expect.after_job:
        if launched is None or launched.job != expect.after_job or launched.instance_id != observed.instance_id:
            return (
                f"you asked to bench after your launch (job {expect.after_job}), but the server now on "
                f"the port is {label}, not the one that job started"
            )
        return None
    if expect.fingerprint and expect.fingerprint != observed.fingerprint:
        return (
            f"the server changed since you asked: you asked while {expect.label or 'another config'} "
            f"({expect.fingerprint}) was running; now it is {label} ({observed.fingerprint})"
        )
    if expect.pinned and expect.instance_id and expect.instance_id != observed.instance_id:
        return (
            f"the server you meant ({expect.label or 'the one running'}, instance {expect.instance_id}) was "
            f"replaced by a job queued ahead of yours; now {label} runs (instance {observed.instance_id})"
        )
    return None


def expectation_of(any_config: bool, expect: Expectation | None) -> Expectation | None:
    """What a queued bench or eval must find: nothing for ``any``; a job queued without one (an older bot,
    or a payload built by hand) refuses, as one whose expectation could not be established does."""
    if any_config:
        return None
    return expect or Expectation(unknown="no expectation was recorded when it was queued")
