"""A gang run's members (issue 38 item 5, in part): each member's host fingerprint on the stored run, and
``/compare``'s word when two runs ran on different member hosts.

A gang's bench is measured through its head, so the run's own ``host_fingerprint`` is the head's; the run's
``extra["gang"]`` adds every member (rank, host, fingerprint). This module only reads and writes that shape:
it imports nothing of the results package, which calls :func:`compare_lines` from ``/compare``'s table.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Where a run record keeps its gang's members (``RunRecord.extra``).
EXTRA_KEY = "gang"


def members_extra(group: str, members: Sequence[tuple[int, str, object]]) -> dict[str, object]:
    """``{"gang": {"group", "members": [{"rank", "host", "fingerprint"}]}}`` for a run's ``extra``."""
    return {
        EXTRA_KEY: {
            "group": group,
            "members": [{"rank": rank, "host": host, "fingerprint": fp} for rank, host, fp in members],
        }
    }


def member_hosts(host: str, extra: object) -> tuple[str, ...]:
    """The hosts a run ran on, by rank: its gang's members, or its one host."""
    gang = extra.get(EXTRA_KEY) if isinstance(extra, dict) else None
    members = gang.get("members") if isinstance(gang, dict) else None
    if isinstance(members, list):
        hosts = tuple(str(m.get("host")) for m in members if isinstance(m, dict) and m.get("host"))
        if hosts:
            return hosts
    return (host,)


def compare_lines(runs: Sequence[tuple[str, str, object]]) -> list[str]:
    """For ``(run id, host, extra)`` first run first: each run whose member hosts differ from the first run's."""
    if len(runs) < 2 or all(len(member_hosts(h, e)) == 1 for _, h, e in runs):
        return []  # one-host runs only: the fingerprint lines already say when hosts differ
    base_id, base_host, base_extra = runs[0]
    base = member_hosts(base_host, base_extra)
    lines = []
    for rid, host, extra in runs[1:]:
        hosts = member_hosts(host, extra)
        if hosts != base:
            lines.append(f"different member hosts: {rid} ran on {', '.join(hosts)}, {base_id} on {', '.join(base)}")
    return lines
