"""``[groups.NAME]``: hosts that serve one model together, validated with errors that name the key and the fix.

A group is what a model bigger than one box runs on (issue 38): ``hosts`` (two or more configured
hosts, all running one engine kind), ``head`` (where the ranks rendezvous and the server answers;
default the first host), ``port`` (the rendezvous port on the head) and ``[groups.NAME.engine]``, the
head's engine with the group's keys over it, key by key as a host's table is over ``[engine]``
(``flags = { "--tp-size" = 16 }`` replaces the head's flags whole). A group's name is a name commands
take where they take a host's, so it may not be a host's too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from workers.config.checks import _Checks
from workers.config.schema import DEFAULT_RENDEZVOUS_PORT, ENGINE_KEYS, NAME_RE, EngineConfig, GroupConfig, HostConfig
from workers.engines import registry

#: The keys of one ``[groups.NAME]`` table.
GROUP_KEYS = frozenset({"hosts", "head", "port", "engine", "description"})

#: Builds an engine from a raw table; the second argument names a key in messages (``_Validator.engine``).
EngineBuilder = Callable[[dict[str, object], Callable[[str], str]], EngineConfig]


def groups_section(
    checks: _Checks,
    table: dict[str, object],
    hosts: Mapping[str, HostConfig],
    engine_tables: Mapping[str, Mapping[str, object]],
    build_engine: EngineBuilder,
) -> dict[str, GroupConfig]:
    """Every ``[groups.NAME]``; ``engine_tables`` are each host's effective raw engine table (its own keys
    over ``[engine]``), which the group's ``[groups.NAME.engine]`` goes over in turn."""
    return {
        name: _group(checks, name, checks.table(value, f"groups.{name}"), hosts, engine_tables, build_engine)
        for name, value in table.items()
    }


def _group(
    checks: _Checks,
    name: str,
    t: dict[str, object],
    hosts: Mapping[str, HostConfig],
    engine_tables: Mapping[str, Mapping[str, object]],
    build_engine: EngineBuilder,
) -> GroupConfig:
    key = f"groups.{name}"
    if not NAME_RE.match(name):
        raise checks.fail(key, "group names are lower-case letters, digits, '-', '_' or '.'; rename the group")
    if name in hosts:
        raise checks.fail(
            key,
            f"{name!r} is also a host's name, and a command's 'on {name}' must mean one thing: rename the group",
        )
    checks.only(t, key, GROUP_KEYS)
    members = _members(checks, key, t, hosts)
    head = checks.string(t.get("head", members[0]), f"{key}.head")
    if head not in members:
        raise checks.fail(
            f"{key}.head",
            f"{head!r} is not one of the group's hosts ({', '.join(members)}): name one of them, or leave head out "
            "for the first",
        )
    port = checks.integer(t.get("port", DEFAULT_RENDEZVOUS_PORT), f"{key}.port", 1, 65535)
    if port == hosts[head].port:
        raise checks.fail(
            f"{key}.port",
            f"{port} is the engine port of the head {head!r}, so the ranks would rendezvous on the server's own "
            "port: give the group another port",
        )
    return GroupConfig(
        name=name,
        hosts=members,
        head=head,
        port=port,
        engine=_engine(checks, key, t.get("engine"), hosts[head], engine_tables[head], build_engine),
        description=str(t.get("description", "")),
    )


def _members(checks: _Checks, key: str, t: dict[str, object], hosts: Mapping[str, HostConfig]) -> tuple[str, ...]:
    """``hosts``: two or more configured hosts, none twice, all of one engine kind."""
    if "hosts" not in t:
        raise checks.fail(key, 'a group names its hosts: add hosts = ["gpu-a", "gpu-b"]')
    members = checks.strings(t["hosts"], f"{key}.hosts")
    if len(members) < 2:
        raise checks.fail(
            f"{key}.hosts",
            "a group needs at least two hosts (one host is used by its own name): add another or remove the group",
        )
    for i, member in enumerate(members):
        where = f"{key}.hosts[{i}]"
        if member not in hosts:
            raise checks.fail(
                where, f"{member!r} is not one of the hosts ({', '.join(hosts)}): add [hosts.{member}] or drop it here"
            )
        if member in members[:i]:
            raise checks.fail(where, f"{member!r} is listed twice: name each host once")
        first, kind = hosts[members[0]].engine.kind, hosts[member].engine.kind
        if kind != first:
            raise checks.fail(
                where,
                f"{member!r} runs {registry.display_name(kind)} but {members[0]!r} runs "
                f"{registry.display_name(first)}, and a gang's ranks run one engine: give every member the same "
                "engine kind",
            )
    return members


def _engine(
    checks: _Checks,
    key: str,
    value: object,
    head: HostConfig,
    head_table: Mapping[str, object],
    build_engine: EngineBuilder,
) -> EngineConfig:
    """``[groups.NAME.engine]`` over the head's engine, key by key (``flags`` is the group's whole table)."""
    own = checks.table(value, f"{key}.engine")
    if not own:
        return head.engine
    checks.only(own, f"{key}.engine", ENGINE_KEYS)
    kind = own.get("kind", head.engine.kind)
    if kind != head.engine.kind:
        raise checks.fail(
            f"{key}.engine.kind",
            f"{kind!r} is not the engine the group's hosts run ({head.engine.kind}): leave kind out of the group's "
            "engine",
        )
    return build_engine(
        {**head_table, **own}, lambda k: f"{key}.engine.{k}" if k in own else f"hosts.{head.name}.engine.{k}"
    )
