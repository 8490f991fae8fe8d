"""Which processes are SGLang servers, from their argv alone (pure: the host-side process table uses it).

SGLang's entry points: ``python -m sglang.launch_server``, ``.../sglang/launch_server.py``, ``sglang
serve`` (also as the kernel shows the console script running: ``/venv/bin/python3 /venv/bin/sglang
serve``), ``python -m sglang.cli.main serve``. ``sglang version`` or ``sglang generate`` are not servers;
neither is a file named like the script in someone's editor or grep, nor a word of another program's
argv (``python3 -c CODE -m sglang.launch_server`` runs CODE: the interpreter's options are read as CPython
reads them, :mod:`workers.engines.python_argv`). Its scheduler processes rename
themselves ``sglang::scheduler_TP0`` and are found through the server's tree.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.engines.processes import console_script_args, module_after_m, module_args, python_run

KIND = "sglang"
#: The port SGLang listens on when no ``--port`` is given.
DEFAULT_PORT = 30000
#: What the host-side scan looks for in a command line to send it back (its children's titles included).
NEEDLES = ("sglang", "launch_server")


def sglang_serve_args(argv: Sequence[str]) -> list[str] | None:
    """The words after ``serve`` when argv runs SGLang's ``sglang serve`` (its console script, or ``python
    -m sglang.cli.main serve``), else None. ``sglang version`` or ``sglang generate`` are not servers."""
    items = list(argv)
    rest = console_script_args(items, "sglang")
    if rest is None:
        rest = module_args(items, ("sglang.cli.main",))
    return rest[1:] if rest is not None and rest[:1] == ["serve"] else None


def recognise(argv: Sequence[str]) -> str | None:
    """``sglang`` when argv runs one of SGLang's server entry points, else None."""
    items = list(argv)
    if module_after_m(items, ("sglang.launch_server",)):
        return KIND
    run = python_run(items)  # the script the interpreter runs, not any word that names the file
    if run is not None and run.script("launch_server.py") and run.target.endswith("sglang/launch_server.py"):
        return KIND
    if sglang_serve_args(items) is not None:
        return KIND
    return None
