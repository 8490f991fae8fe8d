"""Count untyped dicts in bot/, workers/ and ops/, spelled out and behind an alias, and fail above a ceiling.

Issue 24: untyped dicts belong only at the edges where JSON or TOML really is untyped (Slack Block Kit,
raw TOML before validation, Redis decoding). ``make lint`` prints the counts so a reviewer sees them move,
and fails when a change pushes one above its ceiling; lower the ceilings as modules get typed.

Two figures, each with its own ceiling, so neither can grow at the other's expense:

* **spelled out**: every ``dict[str, Any]`` / ``Mapping[str, Any]`` (and ``Dict``, ``MutableMapping``) in the
  text of a ``.py`` file, comments and docstrings included (an alias's own definition is one);
* **alias uses**: every use of a name that stands for one of those: a module-level ``Name = dict[str, Any]``
  (``Name: TypeAlias = ...``, ``type Name = ...``), or a name bound to another such alias. A use is the name
  read anywhere in the code (an annotation, a ``cast``, an ``isinstance``...) of a module that defines or
  imports it, under whatever name it was imported as, or ``module.Name``; the definition and the import lines
  are not uses. ``RawJson`` in a signature is the same untyped dict as ``Mapping[str, Any]``: renaming one
  does not type it.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

#: The most spelled-out ``dict[str, Any]`` + ``Mapping[str, Any]`` allowed: a ratchet, lowered as modules get
#: typed (311 before issue 24's first pass, 296 after it, 307 once telemetry's per-level JSON summaries of
#: issue 22 landed, 316 with issue 23's operator metrics: bolt's listener bodies and contexts and the rendered
#: compose and Prometheus documents, all untyped edges; 193 once bot/, workers/results/ and ops/ were typed;
#: 190 with the engine seam; 95 once the workers wrote JSON as ``workers.json_value.JsonObject`` and read it as
#: ``RawJson``; 35 once the engines' args were JSON values (``ArgValues``), the observation and the drivers typed
#: and decoded objects read field by field (``workers.json_value`` readers)); the goal (issue 24) was under 60.
CEILING = 35
#: The most uses of aliases of those allowed (76 when first counted; 53 once levels were read as
#: ``Mapping[str, object]`` in stats, telemetry and the SLO search, and ``ArgValues`` stopped being one; 52 once
#: the gang runner took its typed payload).
ALIAS_CEILING = 51
PACKAGES = ("bot", "workers", "ops")
PATTERN = re.compile(r"\b(?:dict|Dict|Mapping|MutableMapping)\[\s*str\s*,\s*(?:typing\.)?Any\s*\]")


@dataclass(frozen=True)
class Counts:
    """Per file: spelled-out occurrences, and uses of aliases; the aliases found (``module.Name``)."""

    spelled: Counter[str]
    alias_uses: Counter[str]
    aliases: tuple[str, ...]


def _sources(root: Path) -> dict[str, tuple[str, Path]]:
    """Module name -> (its file relative to ``root``, its path), for every ``.py`` under the packages."""
    found: dict[str, tuple[str, Path]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = (str(path.relative_to(root)), path)
    return found


def _alias_value(stmt: ast.stmt) -> tuple[str, ast.expr] | None:
    """(name, value) of a module-level alias-shaped statement: ``N = v``, ``N: TypeAlias = v``, ``type N = v``."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id, stmt.value
    if (
        isinstance(stmt, ast.AnnAssign)
        and isinstance(stmt.target, ast.Name)
        and stmt.value is not None
        and "TypeAlias" in ast.unparse(stmt.annotation)
    ):
        return stmt.target.id, stmt.value
    type_alias = getattr(ast, "TypeAlias", None)  # ``type N = v``: Python 3.12's statement
    if type_alias is not None and isinstance(stmt, type_alias) and isinstance(stmt.name, ast.Name):
        return stmt.name.id, stmt.value
    return None


def _imported_names(tree: ast.Module, package: str) -> dict[str, str]:
    """Local name -> ``module.Name`` it was imported as, for every ``from m import Name [as local]``
    (``package``: the one a relative import starts from)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([source] if source else [])])
            for alias in node.names:
                names[alias.asname or alias.name] = f"{source}.{alias.name}"
    return names


def _module_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> module, for ``import a.b as c`` (and ``import a.b``, read as ``a.b.Name``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:  # from workers import json_value
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _find_aliases(trees: dict[str, ast.Module], packages: dict[str, str]) -> set[str]:
    """Every ``module.Name`` standing for ``dict/Mapping[str, Any]``, directly or through another alias."""
    aliases: set[str] = set()
    while True:
        before = len(aliases)
        for module, tree in trees.items():
            imported = _imported_names(tree, packages[module])
            for stmt in tree.body:
                found = _alias_value(stmt)
                if found is None:
                    continue
                name, value = found
                text = ast.unparse(value)
                if PATTERN.fullmatch(text) or (
                    isinstance(value, ast.Name)
                    and (imported.get(value.id) in aliases or f"{module}.{value.id}" in aliases)
                ):
                    aliases.add(f"{module}.{name}")
        if len(aliases) == before:
            return aliases


def _alias_uses(tree: ast.Module, module: str, package: str, aliases: set[str]) -> int:
    """Reads of an alias in ``tree`` (not its definition, not its import)."""
    local = {name for name, target in _imported_names(tree, package).items() if target in aliases}
    local |= {full.rpartition(".")[2] for full in aliases if full.rpartition(".")[0] == module}
    modules = _module_names(tree)
    defined = set()
    for stmt in tree.body:
        found = _alias_value(stmt)
        if found is not None and f"{module}.{found[0]}" in aliases:
            defined.add(id(stmt))
    uses = 0
    for stmt in tree.body:
        if id(stmt) in defined:
            continue
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and node.id in local and isinstance(node.ctx, ast.Load):
                uses += 1
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                owner = modules.get(node.value.id)
                if owner is not None and f"{owner}.{node.attr}" in aliases:
                    uses += 1
    return uses


def count(root: Path) -> Counts:
    """Both figures per file over every ``.py`` under the packages."""
    sources = _sources(root)
    texts = {module: path.read_text(encoding="utf-8") for module, (_, path) in sources.items()}
    trees = {module: ast.parse(text) for module, text in texts.items()}
    packages = {  # the package a relative import in each module starts from
        module: module if path.name == "__init__.py" else module.rpartition(".")[0]
        for module, (_, path) in sources.items()
    }
    aliases = _find_aliases(trees, packages)
    spelled: Counter[str] = Counter()
    alias_uses: Counter[str] = Counter()
    for module, (relative, _) in sources.items():
        hits = len(PATTERN.findall(texts[module]))
        if hits:
            spelled[relative] = hits
        uses = _alias_uses(trees[module], module, packages[module], aliases)
        if uses:
            alias_uses[relative] = uses
    return Counts(spelled, alias_uses, tuple(sorted(aliases)))


def _top(found: Counter[str], n: int = 5) -> str:
    return ", ".join(f"{name} {hits}" for name, hits in found.most_common(n)) or "none"


def main(argv: list[str]) -> int:
    """``count_any_dicts.py [ROOT] [--files]``: the two figures (``--files``: every file's, not the top five)."""
    every = "--files" in argv
    args = [a for a in argv[1:] if a != "--files"]
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent
    counts = count(root)
    spelled = sum(counts.spelled.values())
    uses = sum(counts.alias_uses.values())
    where = " ".join(p + "/" for p in PACKAGES)
    names = ", ".join(name.rpartition(".")[2] for name in counts.aliases) or "none"
    print(
        f"dict[str, Any] / Mapping[str, Any] in {where}: {spelled} spelled out (ceiling {CEILING}; most: "
        f"{_top(counts.spelled)})"
    )
    print(f"  and {uses} uses of their aliases {names} (ceiling {ALIAS_CEILING}; most: {_top(counts.alias_uses)})")
    if every:
        for title, found in (("spelled out", counts.spelled), ("alias uses", counts.alias_uses)):
            print(f"{title}:")
            print("\n".join(f"  {hits:4d} {name}" for name, hits in found.most_common()))
    sys.stdout.flush()
    failed = False
    if spelled > CEILING:
        print(f"above the ceiling of {CEILING}: type the new values (frozen dataclass / TypedDict)", file=sys.stderr)
        failed = True
    if uses > ALIAS_CEILING:
        print(
            f"alias uses above the ceiling of {ALIAS_CEILING}: an alias of dict[str, Any] is no type; decode at the "
            "edge into a typed value",
            file=sys.stderr,
        )
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
