"""Which SGLang a host runs, and its real launch options: learnt from the host, cached per version.

A launch that names a flag the host's SGLang does not accept (or accepts only as an ambiguous prefix)
fails after the engine has spent minutes starting Python and CUDA; so before spawning, the worker asks
the host which version it runs and checks the launch against that version's contract. The version comes
from the engine's own interpreter (``importlib.metadata``, which reads the package metadata and imports
nothing) or, for benchbot's simulator, from ``--version``. The contract is the one recorded in the
package for that version; for a version nobody recorded, the worker dumps the option list from the
host's installed SGLang once (``option_dump``) and keeps it in Redis, keyed by version, for every host.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from workers import keys
from workers.engines import option_dump, processes
from workers.engines.contract import ENGINE_NAMES, Contract, UnknownVersion, load_contract, recorded_versions
from workers.redis_conn import text_client

log = logging.getLogger(__name__)

VERSION_SCRIPT = "import importlib.metadata as m; print(m.version('sglang'))"
VLLM_VERSION_SCRIPT = "import importlib.metadata as m; print(m.version('vllm'))"
#: A version alone on its line, or after ``sglang version:`` (what ``sglang version`` prints).
_VERSION_RE = re.compile(r"^\s*(?:sglang version:\s*)?v?(\d+(?:\.\d+)+[0-9A-Za-z.+-]*)\s*$")
SIM_MODULE = "workers.sim.sglang"
SIM_MODULES = (SIM_MODULE, "workers.sim.vllm")
PROBE_TIMEOUT_S = 60.0
DUMP_TIMEOUT_S = 180.0  # importing SGLang's server args pulls in torch on a real host


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


def _split_module(command: Sequence[str]) -> tuple[list[str], str | None]:
    """(interpreter part, module) of ``python [opts] -m module ...``; module None when not that shape."""
    items = list(command)
    if "-m" in items:
        i = items.index("-m")
        if i + 1 < len(items):
            return items[:i], items[i + 1]
    return items, None


def is_simulator(command: Sequence[str]) -> bool:
    """True when the engine command runs benchbot's simulator (of SGLang or of vLLM)."""
    _, module = _split_module(command)
    items = [os.path.basename(c) for c in command]
    return module in SIM_MODULES or items[:2] == ["benchbot", "sim"]


def _sglang_console_script(command: Sequence[str]) -> tuple[list[str], str] | None:
    """(interpreter words, script) of a ``sglang serve`` command run as SGLang's console script, else None.

    The interpreter words are empty when the script is the program (``/venv/bin/sglang serve``); they are
    the Python and its switches when the command names it (``/venv/bin/python3 /venv/bin/sglang serve``).
    """
    items = list(command)
    rest = processes.console_script_args(items, "sglang")
    if rest is None or rest[:1] != ["serve"]:
        return None
    head = items[: len(items) - len(rest)]
    return head[:-1], head[-1]


def version_argv(command: Sequence[str], version_command: Sequence[str] | None = None) -> list[str] | None:
    """The argv that prints the engine's version on the host, or None when benchbot cannot tell how.

    ``sglang serve`` run by a named Python asks that Python's package metadata, as ``-m
    sglang.launch_server`` does; the bare console script (whose interpreter only its shebang names) is
    asked ``sglang version``, SGLang's own sub-command (``sglang/cli/main.py``), which prints
    ``sglang version: X``.
    """
    if version_command:
        return list(version_command)
    script = _sglang_console_script(command)
    if script is not None:
        interpreter_words, program = script
        return [*interpreter_words, "-c", VERSION_SCRIPT] if interpreter_words else [program, "version"]
    interpreter, module = _split_module(command)
    if is_simulator(command):
        # the simulated `vllm serve` answers --version before its sub-command, as `vllm --version` does
        items = list(command)
        return [*(items[:-1] if items[-1:] == ["serve"] else items), "--version"]
    if module and module.split(".")[0] == "sglang" and interpreter:
        return [*interpreter, "-c", VERSION_SCRIPT]
    if module and module.split(".")[0] == "vllm" and interpreter:
        return [*interpreter, "-c", VLLM_VERSION_SCRIPT]
    if command and os.path.basename(command[0]) == "vllm":
        return [command[0], "--version"]
    return None


def dump_argv(command: Sequence[str]) -> list[str] | None:
    """The argv that prints the host's SGLang launch options as JSON (``option_dump``), or None."""
    interpreter, module = _split_module(command)
    script = _sglang_console_script(command)
    if script is not None and script[0]:
        interpreter, module = script[0], "sglang.cli.main"  # the console script's Python, named in the command
    if not module or module.split(".")[0] != "sglang" or not interpreter:
        return None
    source = inspect.getsource(option_dump) + "\nprint(json.dumps(dump_sglang()))\n"
    return [*interpreter, "-c", source]


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
    """Ask the host which SGLang version the engine command runs; None when it cannot say.

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
    parser = dict(data["parser"])
    parser["prog"] = "launch_server.py"  # the dump ran under `python -c`; argparse's messages name the script
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
    engine: str = "sglang",
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
    argv = dump_argv(command) if engine == "sglang" else None  # the option dump reads SGLang's ServerArgs
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
        except Exception as exc:  # an old or odd SGLang: launch unchecked rather than not at all
            log.warning("dumping the launch options of sglang %s failed: %s", version, exc)
    return EngineFacts(
        version,
        None,
        "none",
        f"no recorded contract for {ENGINE_NAMES.get(engine, engine)} {version} (recorded: {known}) and the host "
        "could not list its options: the launch is not checked before it starts",
    )


def last_probed_version(r: redis.Redis, host: str) -> str | None:
    """The version the last probe of ``host`` found (may be stale)."""
    version: str | None = text_client(r).get(host_version_key(host))
    return version
