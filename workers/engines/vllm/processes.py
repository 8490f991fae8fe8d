"""Which processes are vLLM servers, from their argv alone (pure: the host-side process table uses it).

vLLM's entry points: ``vllm serve`` (also as ``python .../bin/vllm serve``), ``python -m
vllm.entrypoints.cli.main serve``, ``python -m vllm.entrypoints.openai.api_server``. Its engine-core and
worker processes (``VLLM::EngineCore``, ``VLLM::Worker_TP<r>``) are children in the server's tree, found
through it; they are not servers of their own.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.engines.processes import console_script_args, module_after_m, module_args

KIND = "vllm"
#: The port vLLM listens on when no ``--port`` is given.
DEFAULT_PORT = 8000
#: Process titles vLLM gives its children (setproctitle); part of a vLLM server's tree.
CHILD_TITLES = ("VLLM::EngineCore", "VLLM::Worker", "VLLM::")
#: What the host-side scan looks for in a command line to send it back (its children's titles included).
NEEDLES = ("vllm", "VLLM::")


def recognise(argv: Sequence[str]) -> str | None:
    """``vllm`` when argv runs ``vllm serve`` (any of its entry points), else None."""
    items = list(argv)
    if module_after_m(items, ("vllm.entrypoints.openai.api_server",)):
        return KIND
    # `python -m vllm.entrypoints.cli.main serve`, `vllm serve ...`, or the console script run by its
    # interpreter (`python3 /venv/bin/vllm serve ...`): read as CPython reads the interpreter's options
    rest = module_args(items, ("vllm.entrypoints.cli.main",))
    if rest is None:
        rest = console_script_args(items, "vllm")
    return KIND if rest is not None and rest[:1] == ["serve"] else None
