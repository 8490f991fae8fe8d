"""How to ask a host which TensorRT-LLM it runs, from the engine's command alone: the package metadata of
the interpreter that runs ``trtllm-serve`` (``trtllm-serve`` has no version sub-command)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from workers.engines.processes import python_run
from workers.engines.trtllm.processes import MODULE, SCRIPT

#: Asks the engine's interpreter for the installed package's version; imports nothing of it.
VERSION_SCRIPT = "import importlib.metadata as m; print(m.version('tensorrt_llm'))"


def version_argv(command: Sequence[str]) -> list[str] | None:
    """The argv printing the version of the TensorRT-LLM ``command`` runs, or None when it is not one.

    A named interpreter (``python3 -m tensorrt_llm.commands.serve``, ``python3 /venv/bin/trtllm-serve``) is
    asked for the package metadata; a console script with a folder (``/venv/bin/trtllm-serve``) through
    the ``python3`` beside it (pip writes both there). A bare ``trtllm-serve`` found on PATH names no
    interpreter: the host's ``version_command`` must say.
    """
    items = list(command)
    if not items:
        return None
    run = python_run(items)
    if run is not None and (run.module((MODULE,)) or run.script(SCRIPT)):
        return [*run.interpreter, "-c", VERSION_SCRIPT]
    if os.path.basename(items[0]) == SCRIPT and os.path.dirname(items[0]):
        return [os.path.join(os.path.dirname(items[0]), "python3"), "-c", VERSION_SCRIPT]
    return None
