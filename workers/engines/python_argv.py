"""What a Python command line runs, read as CPython reads it: one parser for every engine's recogniser.

A word in argv means nothing until the interpreter says what it is. ``python3 -c CODE -m
sglang.launch_server --port P`` runs CODE: the ``-m ...`` words are only its ``sys.argv``; ``python3
my_tool.py -m sglang.launch_server`` runs ``my_tool.py``. CPython's own rules (``Python/getopt.c``,
``Python/initconfig.c``): the interpreter's options come first, clustered like ``-uE`` or one per word;
``-W``, ``-X`` and ``--check-hash-based-pycs`` take a value (attached, ``-Xdev``, or the next word); the
first of ``-c CODE``, ``-m MODULE`` (value attached or next), ``--`` or a word not starting with ``-``
(the script; ``-`` is standard input) ends them, and everything after is the program's own argv. An
option CPython does not know, ``-h``/``-V`` and the ``--help*``/``--version`` words end the interpreter
before it runs anything: such a command line runs nothing (:func:`python_run` says None).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class RunMode(StrEnum):
    """What the interpreter was told to run."""

    MODULE = "module"  # -m MODULE
    SCRIPT = "script"  # a file
    COMMAND = "command"  # -c CODE
    STDIN = "stdin"  # - (or nothing after --)
    INTERACTIVE = "interactive"  # nothing at all


@dataclass(frozen=True)
class PythonRun:
    """One Python command line, split as CPython splits it.

    ``interpreter``: the program and its options, as words that run the same interpreter the same way
    (``python3 -X dev``; the flags of a cluster that ended in ``-m``, ``-um``, kept as ``-u``), so a caller
    can ask that interpreter something else (``[*interpreter, "-c", ...]``). ``target``: the module, the
    script's path or the code; ``args``: the program's own argv after it.
    """

    interpreter: tuple[str, ...]
    mode: RunMode
    target: str = ""
    args: tuple[str, ...] = ()

    def module(self, names: Sequence[str]) -> str | None:
        """The one of ``names`` this runs as ``-m NAME``, else None."""
        return self.target if self.mode is RunMode.MODULE and self.target in names else None

    def script(self, basename: str) -> bool:
        """True when this runs a script file named ``basename`` (any folder)."""
        return self.mode is RunMode.SCRIPT and os.path.basename(self.target) == basename


#: ``python``, ``python3``, ``python3.11`` (any folder): an interpreter whose options follow CPython's.
_PYTHON_NAME = re.compile(r"python[0-9.]*")
#: CPython's switches without a value (``-b``, ``-u``, ...: the getopt string's letters without ``:``).
_SWITCHES = frozenset("bBdEiIOPqRsStuvx")
#: Options that take a value: ``-W arg``, ``-X opt``.
_WITH_VALUE = frozenset("WX")
#: Options that print and exit before anything runs.
_EXITS = frozenset("hV?")
_LONG_WITH_VALUE = ("check-hash-based-pycs",)
_LONG_EXITS = ("help", "version", "help-env", "help-xoptions", "help-all")


def is_python(program: str) -> bool:
    """``python``, ``python3``, ``python3.11`` (any path): an interpreter running a script."""
    return _PYTHON_NAME.fullmatch(os.path.basename(program)) is not None


def python_run(argv: Sequence[str]) -> PythonRun | None:
    """What ``argv`` runs when its program is a Python, else None (not a Python, or it runs nothing: an
    unknown option, ``--help``, ``-V``, a ``-c``/``-m`` without its value)."""
    items = list(argv)
    if not items or not is_python(items[0]):
        return None
    i, n = 1, len(items)
    while i < n:
        word = items[i]
        if word == "--":
            return _after_options(items, i + 1, items[:i])
        if not word.startswith("-") or word == "-":
            break
        if word.startswith("--"):
            name, eq, _ = word[2:].partition("=")
            if name in _LONG_WITH_VALUE:
                i += 1 if eq else 2
                continue
            return None  # --help/--version exit; anything else is an error: nothing runs
        kept: list[str] = []
        j = 1
        while j < len(word):
            letter = word[j]
            if letter in "cm":
                value, end = (
                    (word[j + 1 :], i + 1) if j + 1 < len(word) else (items[i + 1] if i + 1 < n else None, i + 2)
                )
                if value is None:
                    return None
                head = (*items[:i], *(["-" + "".join(kept)] if kept else []))
                mode = RunMode.COMMAND if letter == "c" else RunMode.MODULE
                return PythonRun(tuple(head), mode, value, tuple(items[end:]))
            if letter in _WITH_VALUE:
                if j + 1 == len(word):
                    i += 1  # its value is the next word
                break
            if letter in _EXITS or letter not in _SWITCHES:
                return None
            kept.append(letter)
            j += 1
        i += 1
    return _after_options(items, i, items[:i])


def _after_options(items: list[str], i: int, head: list[str]) -> PythonRun:
    """The run once the options ended at ``items[i]``: a script, standard input, or nothing."""
    if i >= len(items):
        return PythonRun(tuple(head), RunMode.INTERACTIVE)
    if items[i] == "-":
        return PythonRun(tuple(head), RunMode.STDIN, "-", tuple(items[i + 1 :]))
    return PythonRun(tuple(head), RunMode.SCRIPT, items[i], tuple(items[i + 1 :]))
