"""Which processes are TensorRT-LLM servers, from their argv alone (pure: the host-side process table uses it).

``trtllm-serve`` is a click group (``tensorrt_llm/commands/serve.py``: ``main = DefaultGroup(...)``) whose
first word picks a sub-command, and a first word that is none of them runs ``serve``: so ``trtllm-serve
serve MODEL ...`` and ``trtllm-serve MODEL ...`` are the same server. ``disaggregated`` (a router),
``disaggregated_mpi_worker`` and ``mm_embedding_serve`` (an encoder) are not model servers benchbot drives.
The kernel shows the console script as run by its interpreter (``/venv/bin/python3 /venv/bin/trtllm-serve
serve MODEL``); ``python -m tensorrt_llm.commands.serve serve MODEL`` runs the same group. With TP > 1 the
LLM API spawns its ranks with MPI (``mpi4py``'s pool, or ``mpirun ... trtllm-llmapi-launch trtllm-serve``
across nodes): those processes are in the server's tree or wrap it, never servers of their own.

benchbot's simulator of it (``-m workers.sim.trtllm``, ``benchbot sim trtllm``) is recognised by the
registry's convention (:func:`workers.engines.processes.simulator_kind`); :func:`serve_args` reads its words
too, so its launch args parse like the real server's.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.engines.processes import SIM_PACKAGE, console_script_args, module_args, simulator_args

KIND = "trtllm"
SCRIPT = "trtllm-serve"
MODULE = "tensorrt_llm.commands.serve"
SIM_MODULE = f"{SIM_PACKAGE}.{KIND}"
#: ``trtllm-serve``'s ``--port`` default (``serve``'s click option).
DEFAULT_PORT = 8000
#: The group's sub-commands (recorded: ``parser.subcommands``); only ``serve`` is a model server.
SUBCOMMANDS = ("serve", "disaggregated", "disaggregated_mpi_worker", "mm_embedding_serve")
#: Substrings that make a process-table line worth reading in full (the host's scan).
NEEDLES = (SCRIPT, "tensorrt_llm")


def _serve_words(rest: list[str]) -> list[str] | None:
    """The words ``serve`` reads, from the words after the group (``serve MODEL ...`` or ``MODEL ...``)."""
    if not rest:
        return None
    if rest[0] == "serve":
        return rest[1:]
    if rest[0] in SUBCOMMANDS or rest[0].startswith("-"):
        return None  # another sub-command, or an option the group itself refuses
    return rest


def _real_serve_args(items: list[str]) -> list[str] | None:
    rest = console_script_args(items, SCRIPT)
    if rest is None:
        rest = module_args(items, (MODULE,))
    return _serve_words(rest) if rest is not None else None


def serve_args(argv: Sequence[str]) -> list[str] | None:
    """The words after ``serve`` (MODEL first) when ``argv`` runs ``trtllm-serve``'s serve or its simulator,
    else None."""
    items = list(argv)
    found = _real_serve_args(items)
    if found is not None:
        return found
    rest = module_args(items, (SIM_MODULE,))
    if rest is None:
        sim = simulator_args(items, KIND)
        rest = sim[1:] if sim is not None else None
    return _serve_words(rest) if rest is not None else None


def recognise(argv: Sequence[str]) -> str | None:
    """``trtllm`` when argv runs ``trtllm-serve``'s serve (any of its entry points), else None."""
    return KIND if _real_serve_args(list(argv)) is not None else None
