"""A name in a command as the hosts a job uses: a group's rank order, each rank's host, a gang job's queue."""

from __future__ import annotations

import dataclasses

from workers.config import Config, GroupConfig, HostConfig


def rank_order(group: GroupConfig) -> tuple[str, ...]:
    """The hosts by rank: the head is rank 0, then the other members in the config's order."""
    return (group.head, *(h for h in group.hosts if h != group.head))


def rank_host(config: Config, group: GroupConfig, name: str) -> HostConfig:
    """Member ``name`` as its rank runs: its own host (transport, port, GPUs, log dir) with the group's engine;
    the member's own engine ``env`` goes over the group's (a host's settings, e.g. the simulator's faults)."""
    host = config.host(name)
    engine = dataclasses.replace(group.engine, env={**group.engine.env, **host.engine.env})
    return dataclasses.replace(host, engine=engine)


def launch_host(config: Config, name: str) -> HostConfig:
    """What a launch ``on NAME`` is compiled for: a group's head as its ranks run, else the host itself."""
    group = config.groups.get(name)
    return rank_host(config, group, group.head) if group is not None else config.host(name)


def queue_host(config: Config, name: str) -> str:
    """The queue a job ``on NAME`` waits in: a group's first member in lease order (docs/queue.md, "Gangs")."""
    group = config.groups.get(name)
    return group.members[0] if group is not None else name
