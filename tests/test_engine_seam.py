"""The seam between generic code and the engines (issue 21): what keeps a new engine to its folder.

- Generic code (``workers/`` outside the engine folders and the simulator) names no engine: the only
  strings that say ``sglang`` or ``vllm`` there are the registry's lines and a short, reasoned list of
  data (stored words, the embedded demo's host names, package names). The bot names none either, but in
  its demos and a few help texts.
- Production code never imports the simulator: no ``import workers.sim...`` outside ``workers/sim``, and
  the worker's modules load without it.
- Every module under ``workers/`` imports on its own (no import circle depends on who came first).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from workers.engines import registry

ROOT = Path(__file__).resolve().parent.parent
WORKERS = ROOT / "workers"

#: Strings naming an engine that generic code may hold, and why (path relative to the repository).
ALLOWED: dict[str, str] = {
    "workers/engines/registry.py": "the registry's lines: kind -> engine folder, and the default kind",
    "workers/engines/option_dump.py": "SGLang's option dump, run on the host as one file (and by its recorder)",
    "workers/observation.py": "the stored word of ObservedState.NOT_ENGINE ('not_sglang') predates other engines",
    "workers/config/__init__.py": "the embedded demo config's second host is named sim-vllm",
    "workers/config/discovery.py": "the embedded demo config's second host is named sim-vllm",
    "workers/telemetry/fingerprint_parse.py": "Python package names whose versions a host fingerprint lists",
    "workers/benchmark/tokens.py": "messages about /tokenize, which SGLang serves (words only)",
    "workers/engines/multinode.py": "the multi-node argv table, one entry per engine as issue 38 asks (data, by kind)",
}


def _engine_words() -> re.Pattern[str]:
    return re.compile(r"(?<![A-Za-z])(" + "|".join(registry.ENGINE_PACKAGES) + r")(?![a-z])", re.IGNORECASE)


def _generic_modules() -> list[Path]:
    folders = tuple(f"workers/engines/{kind}/" for kind in registry.ENGINE_PACKAGES)
    return [
        path
        for path in sorted(WORKERS.rglob("*.py"))
        if not path.relative_to(ROOT).as_posix().startswith(("workers/sim/", *folders))
    ]


def _strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant that is not a docstring."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_generic_code_names_no_engine() -> None:
    words = _engine_words()
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}"
        for path in _generic_modules()
        if path.relative_to(ROOT).as_posix() not in ALLOWED
        for line, text in _strings(path)
        if words.search(text)
    ]
    assert found == [], "ask the registry or the driver instead:\n" + "\n".join(found)


#: The same for the bot: it asks the registry (kinds, names, preset sets) and names an engine only here.
ALLOWED_BOT: dict[str, str] = {
    "bot/cli.py": "help texts: the load generator's native API is SGLang's /generate; --real drives vLLM's CPU build",
    "bot/demo.py": "the demo's story and its hosts (gpu-1 serves SGLang, vllm-1 vLLM)",
    "bot/demo_real.py": "the real demo drives vLLM's CPU build",
}


def test_the_bot_names_no_engine() -> None:
    """/help's preset sets, /status's engine, plots' and tables' engine names, ``benchbot sim`` and ``config
    check`` all come from the registry: a new engine's folder and registry line reach them unchanged."""
    words = _engine_words()
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}"
        for path in sorted((ROOT / "bot").rglob("*.py"))
        if path.relative_to(ROOT).as_posix() not in ALLOWED_BOT
        for line, text in _strings(path)
        if words.search(text)
    ]
    assert found == [], "ask the registry instead:\n" + "\n".join(found)


def test_the_allowed_list_is_not_stale() -> None:
    words = _engine_words()
    for rel in [*ALLOWED, *ALLOWED_BOT]:
        assert any(words.search(text) for _, text in _strings(ROOT / rel)), f"{rel} names no engine any more"


def test_production_code_never_imports_the_simulator() -> None:
    offenders = []
    for path in WORKERS.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("workers/sim/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{rel}:{node.lineno}: {name}" for name in names if name.startswith("workers.sim")]
    assert offenders == []
    code = (
        "import json, sys\n"
        "import workers.jobs.worker, workers.jobs.runner, workers.observer, workers.host.preflight\n"
        "import workers.host.engine_env, workers.telemetry.run, workers.engines.registry\n"
        "from workers.engines import registry\n"
        "[registry.driver_for(kind) for kind in registry.kinds()]\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('workers.sim'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_every_workers_module_imports_on_its_own() -> None:
    """Each module first, in a clean slate of ``workers``/``bot`` modules: an import circle that only works
    when another module happened to load first fails here."""
    modules = sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for path in WORKERS.rglob("*.py")
    )
    code = (
        "import importlib, json, sys, traceback\n"
        "failed = {}\n"
        f"for name in {modules!r}:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] in ('workers', 'bot')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        failed[name] = traceback.format_exc(limit=3)\n"
        "print(json.dumps(failed))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert failed == {}, "\n".join(f"{name}:\n{why}" for name, why in failed.items())
