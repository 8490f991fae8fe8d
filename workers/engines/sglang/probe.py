"""How to ask a host which SGLang it runs, and its real launch options, from the engine's command alone.

The version comes from the engine's own interpreter (``importlib.metadata``, which reads the package
metadata and imports nothing), or from ``sglang version`` when the command is the bare console script
(whose interpreter only its shebang names). For a version nobody recorded, the host's installed SGLang
describes its options itself (:mod:`workers.engines.option_dump` run by that interpreter).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

from workers.engines import option_dump
from workers.engines.processes import console_script_args, split_module

VERSION_SCRIPT = "import importlib.metadata as m; print(m.version('sglang'))"


def console_script(command: Sequence[str]) -> tuple[list[str], str] | None:
    """(interpreter words, script) of a ``sglang serve`` command run as SGLang's console script, else None.

    The interpreter words are empty when the script is the program (``/venv/bin/sglang serve``); they are
    the Python and its switches when the command names it (``/venv/bin/python3 /venv/bin/sglang serve``).
    """
    items = list(command)
    rest = console_script_args(items, "sglang")
    if rest is None or rest[:1] != ["serve"]:
        return None
    head = items[: len(items) - len(rest)]
    return head[:-1], head[-1]


def version_argv(command: Sequence[str]) -> list[str] | None:
    """The argv that prints SGLang's version on the host, or None when ``command`` is not SGLang's.

    ``sglang serve`` run by a named Python asks that Python's package metadata, as ``-m
    sglang.launch_server`` does; the bare console script is asked ``sglang version``, SGLang's own
    sub-command (``sglang/cli/main.py``), which prints ``sglang version: X``.
    """
    script = console_script(command)
    if script is not None:
        interpreter_words, program = script
        return [*interpreter_words, "-c", VERSION_SCRIPT] if interpreter_words else [program, "version"]
    interpreter, module = split_module(command)
    if module and module.split(".")[0] == "sglang" and interpreter:
        return [*interpreter, "-c", VERSION_SCRIPT]
    return None


def dump_argv(command: Sequence[str]) -> list[str] | None:
    """The argv that prints the host's SGLang launch options as JSON (``option_dump``), or None."""
    interpreter, module = split_module(command)
    script = console_script(command)
    if script is not None and script[0]:
        interpreter, module = script[0], "sglang.cli.main"  # the console script's Python, named in the command
    if not module or module.split(".")[0] != "sglang" or not interpreter:
        return None
    # The dump runs under `python -c`; argparse's messages in SGLang name the script, as the contracts record.
    source = inspect.getsource(option_dump) + (
        "\n_dump = dump_sglang()\n_dump['parser']['prog'] = 'launch_server.py'\nprint(json.dumps(_dump))\n"
    )
    return [*interpreter, "-c", source]
