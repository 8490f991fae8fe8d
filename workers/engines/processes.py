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
from collections.abc import Sequence

from workers.engines import registry
from workers.engines.python_argv import RunMode, is_python, python_run

__all__ = ["is_python", "python_run"]


def module_after_m(items: Sequence[str], names: Sequence[str]) -> str | None:
    """The one of ``names`` that argv's Python runs as ``-m NAME`` (read as CPython reads it:
    :mod:`workers.engines.python_argv`), else None: ``python3 -c CODE -m NAME`` runs CODE."""
    run = python_run(items)
    return run.module(names) if run is not None else None


def module_args(items: Sequence[str], names: Sequence[str]) -> list[str] | None:
    """The program's own words after ``-m NAME`` (NAME one of ``names``), else None."""
    run = python_run(items)
    return list(run.args) if run is not None and run.module(names) is not None else None


def split_module(command: Sequence[str]) -> tuple[list[str], str | None]:
    """(interpreter part, module) of ``python [opts] -m module ...``; module None when not that shape."""
    run = python_run(command)
    if run is None or run.mode is not RunMode.MODULE:
        return list(command), None
    return list(run.interpreter), run.target


def console_script_args(argv: Sequence[str], script: str) -> list[str] | None:
    """The words after console script ``script`` in ``argv``, or None when argv does not run it.

    Two shapes: the script as the program (``/venv/bin/sglang serve ...``, as typed), and the script run
    by its interpreter, which is how the kernel shows a shebang script once it runs it
    (``/venv/bin/python3 /venv/bin/sglang serve ...``; ``#!/usr/bin/env python3`` gives ``python3 ...``).
    Only the program's basename, or the script the Python runs (after its options, as CPython reads
    them) counts: a file named like the script anywhere else in argv (an editor's, a grep's, the
    ``sys.argv`` of ``python3 -c CODE``) is not the script.
    """
    items = list(argv)
    if not items:
        return None
    if os.path.basename(items[0]) == script:
        return items[1:]
    run = python_run(items)
    return list(run.args) if run is not None and run.script(script) else None


#: Where benchbot's simulator of engine ``K`` lives: ``workers.sim.K`` (a convention, never imported here).
SIM_PACKAGE = "workers.sim"
SIM_SUFFIX = "-sim"


def simulator_kind(argv: Sequence[str]) -> str | None:
    """``K-sim`` when argv runs benchbot's simulator of registered engine ``K`` (``-m workers.sim.K``, or
    the console script ``benchbot sim K``: typed, or as the kernel shows it, ``python3 .../bin/benchbot
    sim K``), else None."""
    items = list(argv)
    known = registry.kinds()
    module = module_after_m(items, [f"{SIM_PACKAGE}.{kind}" for kind in known])
    if module is not None:
        return module.rsplit(".", 1)[1] + SIM_SUFFIX
    rest = simulator_args(items)
    return rest[0] + SIM_SUFFIX if rest is not None else None


def simulator_args(argv: Sequence[str], kind: str | None = None) -> list[str] | None:
    """The words after ``benchbot sim`` (the engine's kind first) when argv runs the console script
    ``benchbot sim K`` of a registered engine (``kind``: only that one), else None."""
    rest = console_script_args(argv, "benchbot")
    if rest is None or len(rest) < 2 or rest[0] != "sim":
        return None
    wanted = (kind,) if kind is not None else tuple(registry.kinds())
    return rest[1:] if rest[1] in wanted else None


def without_simulator_flags(argv: Sequence[str]) -> list[str]:
    """argv without the simulator's own ``--sim-*`` options (and their values): no engine's parser knows them."""
    out: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            if not token.startswith("--"):
                continue
        if token.startswith("--sim-"):
            skip = "=" not in token
            continue
        out.append(token)
    return out


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
    Python and its options (:func:`runs_command`).
    """
    if not argv:
        return None
    found = recognised_kind(argv)
    if found is not None:
        return found
    for command in commands:
        if command and runs_command(argv, command):
            return command_kind or registry.DEFAULT_KIND
    return None


def runs_command(argv: Sequence[str], command: Sequence[str]) -> bool:
    """Does ``argv`` run the configured ``command`` (as a prefix)? A Python command must run the same
    module or script as argv does (``python3`` alone, or ``python3 -u``, runs nothing of its own); a
    wrapper run by its shebang shows as ``python3 /srv/bin/wrapper ...`` and counts when its interpreter
    runs that very file."""
    items, wanted = tuple(argv), tuple(command)
    if is_python(wanted[0]):
        ours, theirs = python_run(wanted), python_run(items)
        if ours is None or theirs is None or ours.mode not in (RunMode.MODULE, RunMode.SCRIPT):
            return False
        same = (ours.mode, ours.target, ours.interpreter) == (theirs.mode, theirs.target, theirs.interpreter)
        return same and theirs.args[: len(ours.args)] == ours.args
    if items[: len(wanted)] == wanted:
        return True
    run = python_run(items)
    return (
        run is not None
        and run.mode is RunMode.SCRIPT
        and run.target == wanted[0]
        and (run.args[: len(wanted) - 1] == wanted[1:])
    )


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
        if value is not None and value.isascii() and value.isdigit():  # int("²") raises
            port = int(value)
    return port
