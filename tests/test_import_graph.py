"""No import circles in bot/, workers/ and ops/ (issue 24), read from the source with ``ast``.

The graph: one node per module (a package is its ``__init__``); an edge for every import a module runs when it
is imported, i.e. at module level, also inside a module-level ``if``/``try``/``with`` or a class body.
``import a.b`` is an edge to ``a.b``; ``from a import b`` is an edge to the submodule ``a.b`` when there is one,
else to ``a`` (a name from the package's ``__init__``: a package whose ``__init__`` re-exports a submodule that
imports names back from that ``__init__`` is a circle here). The parent packages Python initialises on the way
are not edges of their own: an ``__init__`` that imports its submodules while one of them imports a sibling
never runs its own code twice. Imports under ``if TYPE_CHECKING:`` are left out (the type checker's, not the
program's), and so are imports inside functions: a deferred import is how a dependency that is one-way by
design stays lazy (matplotlib only when a plot is drawn, the CLI loading only its sub-command, an engine
folder loading its driver when asked). It is no way to hide a circle, so :func:`test_deferred_imports_hide_no_circle`
adds them and asks again. The one dependency ``ast`` cannot see is the registry importing an engine folder by
name (``importlib``, :mod:`workers.engines.registry`): generic code asks the registry, the registry loads the
folder; :func:`test_engine_folders_stay_below_the_registry_callers` holds the folders to that direction.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "workers", "ops")

#: The layers that pick an engine driver through the registry (or sit above those that do). An engine folder
#: imports none of them, directly or not: the registry's by-name import of the folder stays one-way.
ABOVE_THE_ENGINES = (
    "bot",
    "ops",
    "workers.config",
    "workers.jobs",
    "workers.observation",
    "workers.observe_port",
    "workers.observer",
    "workers.presets",
    "workers.benchmark",
    "workers.results",
)


def _modules() -> dict[str, Path]:
    """Every module of the packages by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


#: Blocks whose statements run when the module is imported; function bodies run when called (deferred).
_BLOCKS_RUN_ON_IMPORT = (ast.With, ast.ClassDef, ast.For, ast.While)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _imports(body: list[ast.stmt], *, deferred: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements run when ``body`` runs (and, with ``deferred``, those inside its functions)."""
    for stmt in body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            yield stmt
        elif isinstance(stmt, ast.If):
            if not _is_type_checking(stmt.test):
                yield from _imports(stmt.body, deferred=deferred)
            yield from _imports(stmt.orelse, deferred=deferred)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                yield from _imports(block, deferred=deferred)
        elif isinstance(stmt, _BLOCKS_RUN_ON_IMPORT) or (deferred and isinstance(stmt, _FUNCTIONS)):
            yield from _imports(stmt.body, deferred=deferred)


def import_graph(*, deferred: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules it imports (see the module docstring for what counts)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for stmt in _imports(ast.parse(path.read_text(encoding="utf-8")).body, deferred=deferred):
            if isinstance(stmt, ast.Import):
                edges.update(alias.name for alias in stmt.names if alias.name in MODULES)
                continue
            if stmt.level:
                base = package.split(".")[: len(package.split(".")) - (stmt.level - 1)]
                source = ".".join([*base, *([stmt.module] if stmt.module else [])])
            else:
                source = stmt.module or ""
            for alias in stmt.names:
                if f"{source}.{alias.name}" in MODULES:
                    edges.add(f"{source}.{alias.name}")
                elif source in MODULES:
                    edges.add(source)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module, and every module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(root: str) -> None:  # Tarjan's algorithm, iterative (no recursion limit on a long chain)
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def _describe(graph: dict[str, set[str]], found: list[list[str]]) -> str:
    lines = []
    for component in found:
        members = set(component)
        lines.append(f"circle of {len(component)}:")
        lines += [f"  {name} -> {', '.join(sorted(graph[name] & members))}" for name in component]
    return "\n".join(lines)


def test_circles_finds_a_circle_and_a_self_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert circles(graph) == [["a", "b", "c"], ["d"]]


def test_graph_sees_a_submodule_named_by_from_import() -> None:
    graph = import_graph()
    assert "workers.sim.nvidia_dmon" in graph["workers.sim.nvidia_smi"]  # from workers.sim import nvidia_dmon
    assert "workers.config" in graph["bot.dispatch"]  # from workers.config import Config (the package's name)
    assert "workers.engines.sglang.driver" not in graph["workers.engines.sglang"]  # deferred: loaded on demand
    assert "workers.engines.sglang.driver" in import_graph(deferred=True)["workers.engines.sglang"]


def test_no_import_circles() -> None:
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles (move the shared piece down a layer, or split the module):\n" + _describe(
        graph, found
    )


def test_deferred_imports_hide_no_circle() -> None:
    graph = import_graph(deferred=True)
    found = circles(graph)
    assert not found, "a deferred import closes a circle (fix the dependency, do not hide it):\n" + _describe(
        graph, found
    )


def test_engine_folders_stay_below_the_registry_callers() -> None:
    graph = import_graph(deferred=True)
    engine_folders = [name for name in graph if name.count(".") >= 2 and name.startswith("workers.engines.")]
    engine_folders = [name for name in engine_folders if MODULES[name].parent.parent.name == "engines"]
    assert any(name.startswith("workers.engines.sglang") for name in engine_folders)
    offending = []
    for start in engine_folders:
        seen, todo = {start}, [start]
        while todo:
            for target in graph[todo.pop()]:
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        above = sorted(m for m in seen if any(m == layer or m.startswith(layer + ".") for layer in ABOVE_THE_ENGINES))
        if above:
            offending.append(f"{start} reaches {', '.join(above)}")
    assert not offending, "an engine folder imports a layer that picks drivers through the registry:\n" + "\n".join(
        offending
    )


def test_no_bench_script_imports_the_tests() -> None:
    """Benchmarks stand on the product (bot/, workers/, ops/) or on bench/ itself, never on test helpers
    (issue 36 item 11): every import in every bench/ script, deferred ones included."""
    offending = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offending += [
                f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "tests"
            ]
    assert not offending, "\n".join(offending)
