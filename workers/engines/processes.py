"""Which engine a process is, from its argv alone: the recognisers of every engine benchbot drives.

A process benchbot cannot identify as an engine is never signalled, so this list is deliberately
short: each engine's real entry points, benchbot's simulator of it, and the command a host's config
names for its engine. Pure (no imports of the drivers), so the host-side process table can use it.

- SGLang: ``python -m sglang.launch_server``, ``.../sglang/launch_server.py``, ``sglang serve`` (also as
  the kernel shows the console script running: ``/venv/bin/python3 /venv/bin/sglang serve``), ``python -m
  sglang.cli.main serve``; the simulator ``-m workers.sim.sglang`` / ``benchbot sim sglang``.
- vLLM: ``vllm serve`` (also as ``python .../bin/vllm serve``), ``python -m vllm.entrypoints.cli.main
  serve``, ``python -m vllm.entrypoints.openai.api_server``; the simulator ``-m workers.sim.vllm``.
  vLLM's engine-core and worker processes (``VLLM::EngineCore``, ``VLLM::Worker_TP<r>``) are children in
  the server's tree, found through it; they are not servers of their own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

#: The port each engine listens on when no ``--port`` is given.
DEFAULT_PORTS = {"sglang": 30000, "vllm": 8000}

#: Process titles vLLM gives its children (setproctitle); part of a vLLM server's tree.
VLLM_CHILD_TITLES = ("VLLM::EngineCore", "VLLM::Worker", "VLLM::")


def _module_after_m(items: Sequence[str], names: Sequence[str]) -> str | None:
    for i, token in enumerate(items):
        if token in names and i > 0 and items[i - 1] == "-m":
            return token
    return None


def _is_python(program: str) -> bool:
    """``python``, ``python3``, ``python3.11`` (any path): an interpreter running a script."""
    return re.fullmatch(r"python[0-9.]*", os.path.basename(program)) is not None


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
    if not _is_python(items[0]):
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


def sglang_serve_args(argv: Sequence[str]) -> list[str] | None:
    """The words after ``serve`` when argv runs SGLang's ``sglang serve`` (its console script, or ``python
    -m sglang.cli.main serve``), else None. ``sglang version`` or ``sglang generate`` are not servers."""
    items = list(argv)
    rest = console_script_args(items, "sglang")
    if rest is None:
        module = _module_after_m(items, ("sglang.cli.main",))
        rest = items[items.index(module) + 1 :] if module is not None and _is_python(items[0]) else None
    return rest[1:] if rest is not None and rest[:1] == ["serve"] else None


def sglang_kind(argv: Sequence[str]) -> str | None:
    """``sglang`` / ``sglang-sim`` when argv runs an SGLang entry point or its simulator, else None."""
    items = list(argv)
    if _module_after_m(items, ("sglang.launch_server",)):
        return "sglang"
    if any(token.endswith("sglang/launch_server.py") for token in items):
        return "sglang"
    if sglang_serve_args(items) is not None:
        return "sglang"
    if _module_after_m(items, ("workers.sim.sglang",)):
        return "sglang-sim"
    base = os.path.basename(items[0]) if items else ""
    if base == "benchbot" and items[1:3] == ["sim", "sglang"]:
        return "sglang-sim"
    return None


def vllm_kind(argv: Sequence[str]) -> str | None:
    """``vllm`` / ``vllm-sim`` when argv runs ``vllm serve`` (any of its entry points) or the simulator."""
    items = list(argv)
    if _module_after_m(items, ("workers.sim.vllm",)):
        return "vllm-sim"
    if _module_after_m(items, ("vllm.entrypoints.openai.api_server",)):
        return "vllm"
    module = _module_after_m(items, ("vllm.entrypoints.cli.main",))
    if module is not None:
        rest = items[items.index(module) + 1 :]
        return "vllm" if rest[:1] == ["serve"] else None
    # `vllm serve ...`, or the console script run by its interpreter: `python3 /venv/bin/vllm serve ...`
    if len(items) > 1 and os.path.basename(items[0]) == "vllm" and items[1] == "serve":
        return "vllm"
    if len(items) > 2 and _is_python(items[0]) and os.path.basename(items[1]) == "vllm" and items[2] == "serve":
        return "vllm"
    if len(items) > 2 and os.path.basename(items[0]) == "benchbot" and items[1:3] == ["sim", "vllm"]:
        return "vllm-sim"
    return None


def engine_kind(
    argv: Sequence[str], commands: Sequence[Sequence[str]] = (), command_kind: str = "sglang"
) -> str | None:
    """The engine ``argv`` runs (``sglang``, ``sglang-sim``, ``vllm``, ``vllm-sim``), else None.

    ``commands`` are configured engine commands recognised as a prefix, as engines of ``command_kind``
    (the host's engine kind), for wrappers the recognisers do not know; a Python wrapper run by its
    shebang shows as ``python3 /srv/bin/wrapper ...``, so the prefix may also follow a Python and its
    switches (:func:`console_script_args`).
    """
    if not argv:
        return None
    found = sglang_kind(argv) or vllm_kind(argv)
    if found is not None:
        return found
    items = tuple(argv)
    for command in commands:
        if not command:
            continue
        if items[: len(command)] == tuple(command):
            return command_kind
        rest = console_script_args(items, os.path.basename(command[0]))
        if rest is not None and _is_python(items[0]) and not _is_python(command[0]):
            script = items[len(items) - len(rest) - 1]
            if script == command[0] and tuple(rest[: len(command) - 1]) == tuple(command[1:]):
                return command_kind
    return None


def engine_family(kind: str | None) -> str | None:
    """``vllm-sim`` -> ``vllm``: the driver a process kind belongs to."""
    return kind.split("-", 1)[0] if kind else None


def engine_port(argv: Sequence[str], kind: str | None = None) -> int:
    """The port an engine's argv binds (``--port N`` or ``--port=N``, the last one wins), else its default."""
    port = DEFAULT_PORTS.get(engine_family(kind) or "sglang", 30000)
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
