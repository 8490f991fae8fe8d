"""Who may still run a queued job, decided again when its turn comes (issue 25 item 7).

The bot checks ``[access]`` when a job is queued; a person removed from the list afterwards (or from a
command's list) must not have their queued jobs run on the shared box. The worker reads its own config
for every job, so the check here, at the start of the job body and before any host action, uses the
list as it is now. The channel is not checked again: it was where the request was made, not who made
it. Cancelling one's own job stays open to a removed user (the bot allows it): it only takes work away.
"""

from __future__ import annotations

from workers.config import AccessConfig


def run_time_denial(access: AccessConfig, user: str, kind: str) -> str | None:
    """Why ``user``'s queued job of ``kind`` (its access action) may not run now, or None when it may."""
    if access.is_admin(user):
        return None
    if access.users and user not in access.users:
        return (
            f"{user} is no longer on this benchbot's access list, so their queued {kind} job was not run "
            "(nothing on the host was touched); ask an admin to add them back, then queue it again"
        )
    allowed = access.commands.get(kind)
    if allowed is not None and user not in allowed:
        return (
            f"only {', '.join(allowed) or 'admins'} may {kind} on this benchbot now, so {user}'s queued job "
            "was not run (nothing on the host was touched)"
        )
    return None
