"""Describe an argparse parser as plain data: every option's names, dest, action, nargs, choices, default.

This module is self-contained (standard library only) on purpose: its source is also sent to a GPU host
and run there with ``python3 -c`` against the host's real ``sglang.srt.server_args`` parser, so the
worker learns the exact options of a version nobody recorded yet. The contract recorder
(``tools/record_sglang_contract.py``) runs the same code against a downloaded wheel.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

#: argparse's own action classes, by the name they are given in a contract.
_ACTION_KINDS: tuple[tuple[type[argparse.Action], str], ...] = (
    (argparse._StoreTrueAction, "store_true"),
    (argparse._StoreFalseAction, "store_false"),
    (argparse._StoreConstAction, "store_const"),
    (argparse._AppendConstAction, "append_const"),
    (argparse._AppendAction, "append"),
    (argparse._CountAction, "count"),
    (argparse._HelpAction, "help"),
    (argparse._VersionAction, "version"),
    (argparse._StoreAction, "store"),
)


def _jsonable(value: Any) -> tuple[bool, Any]:
    """(True, value) when ``value`` survives a JSON round trip unchanged in meaning, else (False, None)."""
    if value is None or isinstance(value, (bool, int, str)):
        return True, value
    if isinstance(value, float):
        return (value == value and value not in (float("inf"), float("-inf"))), value
    if isinstance(value, (list, tuple)):
        items = [_jsonable(v) for v in value]
        if all(ok for ok, _ in items):
            return True, [v for _, v in items]
        return False, None
    if isinstance(value, dict):
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return False, None
        return True, value
    return False, None


def _type_name(kind: Any) -> str | None:
    if kind is None:
        return None
    name = getattr(kind, "__name__", None) or type(kind).__name__
    return str(name)


def describe_action(action: argparse.Action) -> dict[str, Any]:
    """One option as plain data. ``action`` is argparse's kind, or ``custom`` with the class name kept."""
    kind = "custom"
    for cls, name in _ACTION_KINDS:
        if type(action) is cls:
            kind = name
            break
    ok_default, default = _jsonable(action.default)
    ok_const, const = _jsonable(action.const)
    choices = None
    if action.choices is not None:
        try:
            choices = [str(c) for c in action.choices] or None  # empty: built from something not loaded
            if choices and isinstance(action.choices, (set, frozenset)):
                choices.sort()  # a set has no order of its own: keep recordings stable
        except TypeError:
            choices = None
    nargs = action.nargs if isinstance(action.nargs, (int, str)) or action.nargs is None else str(action.nargs)
    out: dict[str, Any] = {
        "flags": list(action.option_strings),
        "dest": action.dest,
        "action": kind,
        "nargs": nargs,
        "choices": choices,
        "default": default if ok_default and action.default is not argparse.SUPPRESS else None,
        "type": _type_name(action.type),
        "required": bool(action.required),
    }
    if not ok_default:
        out["default_repr"] = "<computed at start-up>"
    if action.const is not None:
        out["const"] = const if ok_const else None
    if kind == "custom":
        out["action_class"] = type(action).__name__
    negative = getattr(action, "negative_option_strings", None)  # vLLM's EnableDisableAction
    if isinstance(negative, (set, frozenset, list, tuple)) and negative:
        out["negative_flags"] = sorted(str(n) for n in negative)
    text = action.help if isinstance(action.help, str) and action.help is not argparse.SUPPRESS else ""
    if text:
        out["help"] = " ".join(text.split())[:240]
    return out


def describe_parser(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The whole parser: how it matches prefixes, and its options in the order they were added.

    An option string the parser knows but the action does not list (vLLM keeps ``--no-enable-x`` out of
    help) is recorded as the option's ``hidden_flags``: argparse still matches it, prefixes included.
    """
    options = []
    for action in parser._actions:
        if not action.option_strings:
            continue
        out = describe_action(action)
        hidden = sorted(s for s, a in parser._option_string_actions.items() if a is action and s not in out["flags"])
        if hidden:
            out["hidden_flags"] = hidden
        options.append(out)
    return {
        "prog": parser.prog,
        "allow_abbrev": bool(parser.allow_abbrev),
        "prefix_chars": parser.prefix_chars,
        "options": options,
        "positionals": [a.dest for a in parser._actions if not a.option_strings],
    }


def server_args_fields(cls: Any) -> list[str]:
    """Field names of SGLang's ``ServerArgs`` (a dataclass in 0.5.9, a msgspec Struct in 0.5.23)."""
    import dataclasses

    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    names = getattr(cls, "__struct_fields__", None)
    if names:
        return [str(n) for n in names]
    return []


def dump_sglang() -> dict[str, Any]:
    """Import the installed SGLang's server args and describe its launch parser (run on the host)."""
    from sglang.srt.server_args import ServerArgs

    try:
        from sglang.version import __version__ as version
    except Exception:  # a very old or very new layout
        from importlib.metadata import version as _version

        version = _version("sglang")
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return {
        "version": str(version),
        "parser": describe_parser(parser),
        "server_args_fields": server_args_fields(ServerArgs),
    }


if __name__ == "__main__":
    print(json.dumps(dump_sglang()))
