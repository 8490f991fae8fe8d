"""Which engine a process is, from its argv alone: the registered engines' recognisers, asked in turn.

A process benchbot cannot identify as an engine is never signalled, so what counts is deliberately
short: each engine's real entry points (its folder's ``recognise``: ``workers/engines/<kind>/processes.py``),
benchbot's simulator of it, and the command a host's config names for its engine. Pure apart from the
registry (no drivers), so the host-side process table can use it.

The simulator of engine ``K`` is, by convention, the module ``workers.sim.K`` (``python -m workers.sim.K``)
or ``benchbot sim K``; its processes are of kind ``K-sim``. This module knows the convention, not the
simulator (nothing here imports ``workers.sim``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from workers.engines import registry


def module_after_m(items: Sequence[str], names: Sequence[str]) -> str | None:
    """The first of ``names`` that argv runs as ``-m NAME``, else None."""
    for i, token in enumerate(items):
        if token in names and i > 0 and items[i - 1] == "-m":
            return token
    return None


def is_python(program: str) -> bool:
    """``python``, ``python3``, ``python3.11`` (any path): an interpreter running a script."""
    return re.fullmatch(r"python[0-9.]*", os.path.basename(program)) is not None


def split_module(command: Sequence[str]) -> tuple[list[str], str | None]:
    """(interpreter part, module) of ``python [opts] -m module ...``; module None when not that shape."""
    items = list(command)
    if "-m" in items:
        i = items.index("-m")
        if i + 1 < len(items):
            return items[:i], items[i + 1]
    return items, None


#: Interpreter options that may sit between a Python and the console script it runs: switches without a
#: value (``python3 -u -E script``), and ``-X``/``-W`` with theirs (``-X dev``). Nothing else is skipped.
_PYTHON_SWITCH = re.compile(r"-[bBdEiIOPqsSuv]+")
_PYTHON_OPTION_WITH_VALUE = ("-X", "-W")


def console_script_args(argv: Sequence[str], script: str) -> list[str] | None:
    """The words after console script ``script`` in ``argv``, or None when argv does not run it.

    Two shapes: the script as the program (``/venv/bin/sglang serve ...``, as typed), and the script run
    by its interpreter, which is how the kernel shows a shebang script once it runs it
    (``/venv/bin/python3 /venv/bin/sglang serve ...``; ``#!/usr/bin/env python3`` gives ``python3 ...``).
    Only the program's basename, or the first word after a Python and its no-value switches, counts:
    a file named like the script anywhere else in argv (an editor's, a grep's) is not the script.
    """
    items = list(argv)
    if not items:
        return None
    if os.path.basename(items[0]) == script:
        return items[1:]
    if not is_python(items[0]):
        return None
    i = 1
    while i < len(items):
        if _PYTHON_SWITCH.fullmatch(items[i]):
            i += 1
        elif items[i] in _PYTHON_OPTION_WITH_VALUE:
            i += 2
        else:
            break
    if i < len(items) and os.path.basename(items[i]) == script:
        return items[i + 1 :]
    return None


#: Where benchbot's simulator of engine ``K`` lives: ``workers.sim.K`` (a convention, never imported here).
SIM_PACKAGE = "workers.sim"
SIM_SUFFIX = "-sim"


def simulator_kind(argv: Sequence[str]) -> str | None:
    """``K-sim`` when argv runs benchbot's simulator of registered engine ``K`` (``-m workers.sim.K`` or
    ``benchbot sim K``), else None."""
    items = list(argv)
    known = registry.kinds()
    module = module_after_m(items, [f"{SIM_PACKAGE}.{kind}" for kind in known])
    if module is not None:
        return module.rsplit(".", 1)[1] + SIM_SUFFIX
    if len(items) > 2 and os.path.basename(items[0]) == "benchbot" and items[1] == "sim" and items[2] in known:
        return items[2] + SIM_SUFFIX
    return None


def recognised_kind(argv: Sequence[str]) -> str | None:
    """The kind of engine ``argv`` runs by its real entry points (each registered engine asked in turn) or
    benchbot's simulator of one, else None."""
    for engine in registry.engines():
        found = engine.recognise(argv)
        if found is not None:
            return found
    return simulator_kind(argv)


def engine_kind(
    argv: Sequence[str], commands: Sequence[Sequence[str]] = (), command_kind: str | None = None
) -> str | None:
    """The engine ``argv`` runs (``sglang``, ``sglang-sim``, ``vllm``, ``vllm-sim``, ...), else None.

    ``commands`` are configured engine commands recognised as a prefix, as engines of ``command_kind``
    (the host's engine kind; None: the default engine), for wrappers the recognisers do not know; a Python
    wrapper run by its shebang shows as ``python3 /srv/bin/wrapper ...``, so the prefix may also follow a
    Python and its switches (:func:`console_script_args`).
    """
    if not argv:
        return None
    found = recognised_kind(argv)
    if found is not None:
        return found
    items = tuple(argv)
    for command in commands:
        if not command:
            continue
        if items[: len(command)] == tuple(command):
            return command_kind or registry.DEFAULT_KIND
        rest = console_script_args(items, os.path.basename(command[0]))
        if rest is not None and is_python(items[0]) and not is_python(command[0]):
            script = items[len(items) - len(rest) - 1]
            if script == command[0] and tuple(rest[: len(command) - 1]) == tuple(command[1:]):
                return command_kind or registry.DEFAULT_KIND
    return None


def engine_family(kind: str | None) -> str | None:
    """``vllm-sim`` -> ``vllm``: the driver a process kind belongs to."""
    return registry.family(kind) if kind else None


def engine_port(argv: Sequence[str], kind: str | None = None) -> int:
    """The port an engine's argv binds (``--port N`` or ``--port=N``, the last one wins), else its default."""
    ports = registry.DEFAULT_PORTS
    port = ports.get(registry.family(kind)) or ports[registry.DEFAULT_KIND]
    items = list(argv)
    for i, token in enumerate(items):
        value: str | None = None
        if token == "--port" and i + 1 < len(items):
            value = items[i + 1]
        elif token.startswith("--port="):
            value = token.split("=", 1)[1]
        if value is not None and value.isdigit():
            port = int(value)
    return port
