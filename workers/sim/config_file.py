"""SGLang's ``--config FILE.yaml``: the YAML file's keys become launch flags, as the real merger does it.

``prepare_server_args`` checks for the exact word ``--config`` in argv; ``ConfigArgumentMerger`` then
reads the YAML mapping, turns each ``key: value`` into flags and returns
``config_flags + argv_before + argv_after`` (``--config PATH`` removed), so flags on the command line
win over the file. Per key (written ``--{key}`` exactly as spelled in the file, so ``tp_size`` is not
``--tp-size``):

* a boolean of a ``store_true`` option adds the bare flag when true and nothing when false; any other
  boolean becomes ``--key true|false``;
* a list becomes ``--key a b c`` (nothing when empty); a mapping becomes one value (0.5.9:
  ``str(dict)``, Python's repr; 0.5.23: ``json.dumps``); anything else ``--key str(value)``;
* a key of an action the merger cannot express is refused: 0.5.9 accepts ``store``/``store_true``
  options by ``dest``; 0.5.23 by ``dest`` or any long spelling, and also one-value custom actions.

The merger's errors are ``ValueError``s with SGLang's own words (:class:`ConfigFileError`); the caller
prints them as the real launcher's traceback and exits 1.

PyYAML is not a benchbot dependency, so :func:`load_yaml` reads the subset of YAML a launch config
uses (a top-level mapping of scalars, flow or block lists, nested mappings; PyYAML's YAML 1.1 scalar
types) and refuses anything else with a clear message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.engines.contract import Contract, Option, parse_version


class ConfigFileError(ValueError):
    """What SGLang's ConfigArgumentMerger raises (its message is SGLang's)."""


# --------------------------------------------------------------------------------------------- YAML subset

_BOOL = {
    "true": True,
    "True": True,
    "TRUE": True,
    "yes": True,
    "Yes": True,
    "YES": True,
    "on": True,
    "On": True,
    "ON": True,
    "false": False,
    "False": False,
    "FALSE": False,
    "no": False,
    "No": False,
    "NO": False,
    "off": False,
    "Off": False,
    "OFF": False,
}
_NULL = {"", "~", "null", "Null", "NULL"}
_INT = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")
_HEX = re.compile(r"^[-+]?0x[0-9a-fA-F_]+$")
_FLOAT = re.compile(r"^[-+]?([0-9][0-9_]*)?\.[0-9_]*([eE][-+][0-9]+)?$")
_INF = {
    ".inf": float("inf"),
    ".Inf": float("inf"),
    ".INF": float("inf"),
    "-.inf": float("-inf"),
    "-.Inf": float("-inf"),
    "-.INF": float("-inf"),
    "+.inf": float("inf"),
}


def _strip_comment(line: str) -> str:
    """The line without a ``#`` comment (a ``#`` inside quotes, or glued to a word, is text)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _scalar(text: str) -> Any:
    """One YAML 1.1 scalar as PyYAML's safe_load types it."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return json.loads(text)
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    if text in _NULL:
        return None
    if text in _BOOL:
        return _BOOL[text]
    if _INT.match(text):
        return int(text.replace("_", ""))
    if _HEX.match(text):
        return int(text.replace("_", ""), 16)
    if _FLOAT.match(text) and any(c.isdigit() for c in text):
        return float(text.replace("_", ""))
    if text in _INF:
        return _INF[text]
    if text in (".nan", ".NaN", ".NAN"):
        return float("nan")
    if text[:1] in "&*!|>%@`":
        raise ConfigFileError(
            f"unsupported YAML in config file: {text!r} (anchors, tags and block scalars "
            "are not read by benchbot's simulator)"
        )
    return text


def _split_flow(body: str) -> list[str]:
    """Split the inside of ``[...]`` / ``{...}`` at top-level commas."""
    parts, depth, quote, cur = [], 0, "", []
    for ch in body:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.strip() for p in parts]


def _value(text: str) -> Any:
    """A scalar, or a flow list / flow mapping."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        return [_value(p) for p in _split_flow(text[1:-1])]
    if text.startswith("{") and text.endswith("}"):
        out: dict[str, Any] = {}
        for part in _split_flow(text[1:-1]):
            key, sep, val = part.partition(":")
            if not sep:
                raise ConfigFileError(f"unsupported YAML in config file: {text!r}")
            out[str(_scalar(key))] = _value(val)
        return out
    return _scalar(text)


def _key_value(line: str) -> tuple[str, str] | None:
    """``key: value`` -> (key, value text); None when the line is not a mapping entry."""
    m = re.match(r"""^("(?:[^"\\]|\\.)*"|'[^']*'|[^\s'"#][^:]*?)\s*:(?:\s+(.*))?$""", line)
    if not m:
        return None
    return str(_scalar(m.group(1))), (m.group(2) or "")


def load_yaml(text: str) -> Any:
    """The document in ``text`` as ``yaml.safe_load`` would return it, for the launch-config subset.

    A JSON document is YAML too, and it is what benchbot itself writes (the engine's private options):
    it is read as JSON first, so any JSON value, however it is laid out, reads as PyYAML would read it.
    """
    try:
        return json.loads(text)
    except ValueError:
        pass
    lines: list[tuple[int, str]] = []
    for raw in text.splitlines():
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise ConfigFileError("found a tab character in the indentation of the config file")
        line = _strip_comment(raw)
        if not line.strip() or line.strip() in ("---", "..."):
            continue
        lines.append((len(line) - len(line.lstrip(" ")), line.strip()))
    if not lines:
        return None
    value, end = _block(lines, 0, lines[0][0])
    if end != len(lines):
        raise ConfigFileError(f"unsupported YAML in config file near: {lines[end][1]!r}")
    return value


def _block(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[Any, int]:
    """The block (mapping, sequence or lone scalar) starting at ``lines[i]`` with this indentation."""
    if lines[i][1].startswith("- ") or lines[i][1] == "-":
        items: list[Any] = []
        while i < len(lines) and lines[i][0] == indent and (lines[i][1].startswith("- ") or lines[i][1] == "-"):
            rest = lines[i][1][1:].strip()
            i += 1
            if rest:
                items.append(_value(rest))
            elif i < len(lines) and lines[i][0] > indent:
                item, i = _block(lines, i, lines[i][0])
                items.append(item)
            else:
                items.append(None)
        return items, i
    if _key_value(lines[i][1]) is None:
        return _value(lines[i][1]), i + 1
    mapping: dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == indent:
        kv = _key_value(lines[i][1])
        if kv is None:
            raise ConfigFileError(f"unsupported YAML in config file near: {lines[i][1]!r}")
        key, rest = kv
        i += 1
        if rest.strip():
            mapping[key] = _value(rest)
        elif i < len(lines) and lines[i][0] > indent:
            mapping[key], i = _block(lines, i, lines[i][0])
        elif i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("-"):
            mapping[key], i = _block(lines, i, indent)  # a block list may sit at the key's own indent
        else:
            mapping[key] = None
    return mapping, i


# --------------------------------------------------------------------------------------------- the merge

_ACTION_CLASS = {
    "store": "_StoreAction",
    "store_true": "_StoreTrueAction",
    "store_false": "_StoreFalseAction",
    "store_const": "_StoreConstAction",
    "append": "_AppendAction",
    "append_const": "_AppendConstAction",
    "count": "_CountAction",
    "extend": "_ExtendAction",
    "help": "_HelpAction",
}


def _class_name(opt: Option) -> str:
    """The action's class name, as SGLang's message prints ``action.__class__.__name__``."""
    if opt.action == "custom":
        return opt.action_class or "Action"
    return _ACTION_CLASS.get(opt.action, opt.action)


def _keys(opt: Option, *, all_spellings: bool) -> set[str]:
    keys = {opt.dest}
    if all_spellings:
        keys |= {f[2:].replace("-", "_") for f in opt.flags if f.startswith("--")}
    return keys


def _is_meta(opt: Option) -> bool:
    return "--config" in opt.flags or "--help" in opt.flags or "-h" in opt.flags


def _merger_tables(contract: Contract) -> tuple[set[str], dict[str, Option]]:
    """(keys of store_true options, unsupported key -> option) as the version's merger builds them."""
    options = [o for o in contract.options if o.flags]
    if parse_version(contract.version) < (0, 5, 15):
        store_true = {o.dest for o in options if o.action == "store_true"}
        unsupported = {o.dest: o for o in options if o.action not in ("store", "store_true") and not _is_meta(o)}
        return store_true, unsupported
    store_true = {k for o in options if o.action == "store_true" for k in _keys(o, all_spellings=True)}
    supported = [o for o in options if o.action in ("store", "store_true") or o.nargs is None]
    supported_keys = {k for o in supported for k in _keys(o, all_spellings=True)}
    unsupported = {
        k: o
        for o in options
        if o not in supported and not _is_meta(o)
        for k in _keys(o, all_spellings=True)
        if k not in supported_keys
    }
    return store_true, unsupported


def config_path(argv: Sequence[str]) -> str | None:
    """The file after ``--config`` (SGLang's checks and messages); None without ``--config``."""
    found = [i for i, arg in enumerate(argv) if arg == "--config"]
    if len(found) > 1:
        raise ConfigFileError("Multiple config files specified! Only one allowed.")
    if not found:
        return None
    if found[0] == len(argv) - 1:
        raise ConfigFileError("No config file specified after --config flag!")
    return argv[found[0] + 1]


def read_config(path: str) -> dict[str, Any]:
    """The YAML mapping in ``path``, checked as SGLang checks it."""
    p = Path(path)
    if p.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigFileError(f"Config file must be YAML format, got: {p.suffix}")
    if not p.exists():
        raise ConfigFileError(f"Config file not found: {path}")
    data = load_yaml(p.read_text(encoding="utf-8"))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigFileError("Config file must contain a dictionary at root level")
    return data


def config_flags(contract: Contract, config: dict[str, Any]) -> list[str]:
    """The flags ``config`` stands for, as this version's merger writes them."""
    new = parse_version(contract.version) >= (0, 5, 15)
    store_true, unsupported = _merger_tables(contract)
    out: list[str] = []
    for key, value in config.items():
        norm = str(key).replace("-", "_")
        if norm in unsupported:
            raise ConfigFileError(f"Unsupported config option '{norm}' with action '{_class_name(unsupported[norm])}'")
        if isinstance(value, bool):
            if norm in store_true:
                if value:
                    out.append(f"--{key}")
            else:
                out += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            if value:
                out.append(f"--{key}")
                out += [str(item) for item in value]
        elif isinstance(value, dict):
            out += [f"--{key}", json.dumps(value) if new else str(value)]
        else:
            out += [f"--{key}", str(value)]
    return out


def merge_config(contract: Contract, argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--config FILE`` replaced by the file's flags in front (CLI > config > defaults)."""
    argv = list(argv)
    if "--config" not in argv:
        return argv
    path = config_path(argv)
    assert path is not None
    flags = config_flags(contract, read_config(path))
    at = argv.index("--config")
    return flags + argv[:at] + argv[at + 2 :]
