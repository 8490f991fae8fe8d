"""How to ask a host which vLLM it runs, from the engine's command alone: the package metadata of the
interpreter that runs ``-m vllm...``, or ``vllm --version`` of the console script."""

from __future__ import annotations

import os
from collections.abc import Sequence

from workers.engines.processes import split_module

VERSION_SCRIPT = "import importlib.metadata as m; print(m.version('vllm'))"


def version_argv(command: Sequence[str]) -> list[str] | None:
    """The argv that prints vLLM's version on the host, or None when ``command`` is not vLLM's."""
    interpreter, module = split_module(command)
    if module and module.split(".")[0] == "vllm" and interpreter:
        return [*interpreter, "-c", VERSION_SCRIPT]
    if command and os.path.basename(command[0]) == "vllm":
        return [command[0], "--version"]
    return None
