"""What ``/status`` says of host groups (issue 38): a group's own header, and on each member the groups it is
in and the gang job holding it, read from the members' lease records (a gang lease names its gang there); and
the refusal of a ``/bench`` or ``/eval`` of one member of a running gang (benched through its group instead)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import redis

from workers import keys
from workers.config import Config
from workers.errors import BenchbotError
from workers.gang.bench import running_gang_job
from workers.gang.hosts import rank_order
from workers.jobs.lease_holder import LeaseHolder
from workers.redis_conn import text_client


def holders(r: redis.Redis, hosts: Iterable[str]) -> dict[str, LeaseHolder | None]:
    """Who holds each host now (None: free), in one round trip however many hosts."""
    names = list(hosts)
    pipe = text_client(r).pipeline(transaction=False)
    for host in names:
        pipe.get(keys.lease(host))
    raws = pipe.execute() if names else []
    return {host: LeaseHolder.from_json(raw) if raw else None for host, raw in zip(names, raws, strict=True)}


def member_line(config: Config, host: str, holder: LeaseHolder | None) -> str:
    """``member of group pair (pair-a, pair-b); held by gang job #17 ...`` for a group's member, else ""."""
    groups = config.groups_of(host)
    if not groups:
        return ""
    line = "member of group " + "; of group ".join(f"{g.name} ({', '.join(g.hosts)})" for g in groups)
    if holder is not None and holder.gang:
        line += f"; held by gang job #{holder.job} (@{holder.user}) across {', '.join(holder.gang)}"
    return line


def group_header(config: Config, name: str, held: Mapping[str, LeaseHolder | None]) -> str:
    """A group's first lines in ``/status NAME``: its members, head and port, and any gang holding them."""
    group = config.groups[name]
    lines = [
        f"group {name}: {', '.join(group.hosts)} (head {group.head}, rendezvous port {group.port})"
        + (f": {group.description}" if group.description else "")
    ]
    gangs = {h.job: h for h in held.values() if h is not None and h.gang}
    for job, holder in gangs.items():
        mine = [host for host in group.members if (h := held.get(host)) is not None and h.job == job]
        rest = [host for host in holder.gang if host not in mine and host in group.members]
        waiting = f", waiting for {', '.join(rest)}" if rest else ""
        lines.append(f"  gang job #{job} (@{holder.user}) holds {', '.join(mine)}{waiting}")
    if not gangs:
        lines.append("  no gang job holds it")
    return "\n".join(lines)


def refuse_gang_member(r: redis.Redis, config: Config, host: str, command: str) -> None:
    """BenchbotError when ``host`` serves as a rank of a running gang: ``/bench`` or ``/eval`` of one member alone
    would measure the head without its gang's fingerprint, or a follower rank that serves nothing."""
    if not config.groups_of(host):
        return
    found = running_gang_job(r, host)
    if found is None:
        return
    rank, job = found
    groups = [g.name for g in config.groups_of(host) if host in rank_order(g)[rank : rank + 1]]
    group = groups[0] if groups else config.groups_of(host)[0].name
    role = "its head" if rank == 0 else "a rank that serves no requests itself"
    raise BenchbotError(
        f"{host} is rank {rank} of the gang job #{job} runs on {group} ({role}): /{command} it as one, "
        f"with /{command} ... on {group}"
    )
