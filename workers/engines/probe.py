"""Which engine version a host runs, and its real launch options: learnt from the host, cached per version.

A launch that names a flag the host's engine does not accept (or accepts only as an ambiguous prefix)
fails after the engine has spent minutes starting Python and CUDA; so before spawning, the worker asks
the host which version it runs and checks the launch against that version's contract. How to ask is the
engine's own knowledge (its folder's ``version_argv``: the engine's interpreter's package metadata, or
its CLI), asked of each registered engine in turn; benchbot's simulator answers ``--version``. The
contract is the one recorded in the package for that version; for a version nobody recorded, the worker
dumps the option list from the host's installed engine once (its folder's ``option_dump_argv``, where it
has one) and keeps it in Redis, keyed by version, for every host.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from workers import keys
from workers.engines import processes, registry
from workers.engines.contract import Contract, UnknownVersion, load_contract, recorded_versions
from workers.redis_conn import text_client

log = logging.getLogger(__name__)

#: A version alone on its line, or after ``<engine> version:`` (what ``sglang version`` prints).
_VERSION_RE = re.compile(r"^\s*(?:[\w.-]+ version:\s*)?v?(\d+(?:\.\d+)+[0-9A-Za-z.+-]*)\s*$")
PROBE_TIMEOUT_S = 60.0
DUMP_TIMEOUT_S = 180.0  # importing an engine's server args pulls in torch on a real host


_contract_key = keys.engine_contract
#: Where the last version probed on ``host`` is kept (shown by /status while an engine loads).
host_version_key = keys.host_engine_version


class _Runner(Protocol):
    async def run(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None) -> Any: ...


@dataclass(frozen=True)
class EngineFacts:
    """What the host runs: the version (None when it could not be learnt) and its contract, if any."""

    version: str | None
    contract: Contract | None
    source: str  # "recorded" | "host" | "cached" | "none"
    note: str = ""


def is_simulator(command: Sequence[str]) -> bool:
    """True when the engine command runs benchbot's simulator of a registered engine (not imported: the
    convention ``-m workers.sim.KIND`` / ``benchbot sim KIND`` of :func:`workers.engines.processes.simulator_kind`)."""
    return processes.simulator_kind(command) is not None


def version_argv(command: Sequence[str], version_command: Sequence[str] | None = None) -> list[str] | None:
    """The argv that prints the engine's version on the host, or None when benchbot cannot tell how.

    ``version_command`` (the host's config) wins; benchbot's simulator answers ``--version`` (the simulated
    ``vllm serve`` before its sub-command, as ``vllm --version`` does); otherwise each registered engine is
    asked whether the command is its own (``sglang serve`` or ``-m sglang.launch_server``, ``vllm serve``...).
    """
    if version_command:
        return list(version_command)
    if is_simulator(command):
        items = list(command)
        return [*(items[:-1] if items[-1:] == ["serve"] else items), "--version"]
    for engine in registry.engines():
        argv = engine.version_argv(command)
        if argv is not None:
            return argv
    return None


def dump_argv(command: Sequence[str], engine: str | None = None) -> list[str] | None:
    """The argv that prints the host's launch options of ``engine`` as JSON, or None when it cannot be asked."""
    dump = registry.engine(engine).option_dump_argv
    return dump(command) if dump is not None else None


def parse_version_output(text: str) -> str | None:
    """The first line of ``text`` that is a version number."""
    for line in text.splitlines():
        m = _VERSION_RE.match(line)
        if m:
            return m.group(1)
    return None


async def probe_version(
    transport: _Runner,
    command: Sequence[str],
    version_command: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> str | None:
    """Ask the host which version the engine command runs; None when it cannot say.

    ``env`` is the engine's configured env (over the host's): what picks the interpreter's packages
    (``PYTHONPATH``) or the simulator's imitated version must be what the engine itself will see.
    Never secrets: over SSH a command's env travels on its command line.
    """
    argv = version_argv(command, version_command)
    if argv is None:
        return None
    try:
        result = await transport.run(argv, timeout=PROBE_TIMEOUT_S, env=env)
    except Exception as exc:  # a host that cannot answer is reported, not fatal
        log.warning("engine version probe failed: %s", exc)
        return None
    if getattr(result, "returncode", 1) != 0:
        return None
    return parse_version_output(getattr(result, "stdout", "") or "")


def _dump_payload(data: dict[str, Any], engine: str, version: str) -> dict[str, Any]:
    """A host's option dump in the recorded contracts' shape (no texts: those come from wheels)."""
    parser = dict(data["parser"])  # its ``prog`` as the engine's messages name it (the engine's dump sets it)
    return {
        "schema": 1,
        "engine": engine,
        "version": version,
        "recorded_from": {"host_dump": True},
        "parser": parser,
        "server_info": {"fields": data.get("server_args_fields") or [], "extra": []},
        "texts": {},
    }


async def engine_facts(
    r: redis.Redis,
    transport: _Runner,
    host: str,
    command: Sequence[str],
    *,
    version_command: Sequence[str] | None = None,
    engine: str = registry.DEFAULT_KIND,
    env: Mapping[str, str] | None = None,
) -> EngineFacts:
    """The host's engine version and contract: recorded in the package, cached in Redis, or dumped now.

    ``env``: the engine's env, for the probe and the option dump (see :func:`probe_version`).
    """
    version = await probe_version(transport, command, version_command, env)
    if version is None:
        return EngineFacts(None, None, "none", "benchbot could not learn the engine version on this host")
    r.set(host_version_key(host), version)
    try:
        return EngineFacts(version, load_contract(engine, version), "recorded")
    except UnknownVersion:
        pass
    cached = text_client(r).get(_contract_key(engine, version))
    if cached:
        return EngineFacts(version, Contract.from_dict(json.loads(cached)), "cached")
    argv = dump_argv(command, engine)  # the engine's own option dump, where it has one
    known = ", ".join(recorded_versions(engine))
    if argv is not None:
        try:
            result = await transport.run(argv, timeout=DUMP_TIMEOUT_S, env=env)
            if getattr(result, "returncode", 1) == 0:
                data = json.loads((getattr(result, "stdout", "") or "").strip().splitlines()[-1])
                payload = _dump_payload(data, engine, version)
                contract = Contract.from_dict(payload)
                r.set(_contract_key(engine, version), json.dumps(payload))
                return EngineFacts(version, contract, "host")
        except Exception as exc:  # an old or odd release: launch unchecked rather than not at all
            log.warning("dumping the launch options of %s %s failed: %s", engine, version, exc)
    return EngineFacts(
        version,
        None,
        "none",
        f"no recorded contract for {registry.display_name(engine)} {version} (recorded: {known}) and the host "
        "could not list its options: the launch is not checked before it starts",
    )


def last_probed_version(r: redis.Redis, host: str) -> str | None:
    """The version the last probe of ``host`` found (may be stale)."""
    version: str | None = text_client(r).get(host_version_key(host))
    return version
