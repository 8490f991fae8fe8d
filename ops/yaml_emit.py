"""A tiny YAML emitter for the compose file and ``prometheus.yml``: no YAML library is installed.

Deliberately small: every string is a JSON-style double-quoted scalar (valid YAML), keys are plain words,
and nothing else (anchors, multi-line strings, tags) is ever produced. A :class:`Commented` value carries
the comment written on the lines above its key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Union

#: What the emitter writes: mappings, sequences, strings, ints and bools, any of them with a comment above.
Yaml = Union[str, int, bool, "Commented", Mapping[str, "Yaml"], Sequence["Yaml"]]

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Commented:
    """A mapping value with a comment written on the lines above its key."""

    value: Yaml
    comment: str


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if any(ord(c) > 0xFFFF or 0xD800 <= ord(c) <= 0xDFFF for c in value):
            raise ValueError(f"only characters of the BMP (no surrogates) are emitted: {value!r}")
        return json.dumps(value)  # ASCII-only JSON string: a valid YAML double-quoted scalar
    raise TypeError(f"cannot emit {type(value).__name__} as YAML")


#: Plain words a YAML 1.1 reader takes for booleans or null: such keys are quoted.
_RESERVED_WORDS = {"true", "false", "null", "yes", "no", "on", "off", "y", "n"}


def _key(key: str) -> str:
    return key if _KEY_RE.fullmatch(key) and key.lower() not in _RESERVED_WORDS else _scalar(key)


def _comment_lines(comment: str, pad: str) -> list[str]:
    return [f"{pad}# {line}".rstrip() for line in comment.splitlines()]


def _is_scalar(value: object) -> bool:
    return isinstance(value, str | int | bool)


def _emit(value: Mapping[str, Yaml] | Sequence[Yaml], indent: int) -> list[str]:
    """Lines for a mapping or a sequence at ``indent`` spaces."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, Commented):
                lines += _comment_lines(item.comment, pad)
                item = item.value
            lines += _entry(f"{pad}{_key(key)}:", item, indent)
        return lines
    for item in value:
        if isinstance(item, Commented):
            lines += _comment_lines(item.comment, pad)
            item = item.value
        if isinstance(item, Mapping) and item:
            inner = _emit(item, indent + 2)
            first = next(i for i, line in enumerate(inner) if not line.lstrip().startswith("#"))
            lines += [*inner[:first], f"{pad}- {inner[first].lstrip()}", *inner[first + 1 :]]
        else:
            lines += _entry(f"{pad}-", item, indent)
    return lines


def _entry(head: str, item: Yaml, indent: int) -> list[str]:
    if isinstance(item, str | int | bool):
        return [f"{head} {_scalar(item)}"]
    if isinstance(item, Mapping):
        return [f"{head} {{}}"] if not item else [head, *_emit(item, indent + 2)]
    if isinstance(item, Commented):  # a comment belongs above a key or a sequence item
        raise TypeError("a Commented value only goes under a key or in a sequence")
    items = list(item)
    if not items:
        return [f"{head} []"]
    if all(_is_scalar(i) for i in items):
        flow = "[" + ", ".join(_scalar(i) for i in items) + "]"
        if len(head) + len(flow) < 110:
            return [f"{head} {flow}"]
    return [head, *_emit(items, indent + 2)]


def to_yaml(document: Mapping[str, Yaml], header: str = "") -> str:
    """Emit a document of mappings, sequences, strings, ints and bools as block YAML."""
    lines = _comment_lines(header, "") if header else []
    for key, item in document.items():
        if isinstance(item, Commented):
            lines += ["", *_comment_lines(item.comment, "")]
            item = item.value
        elif lines:
            lines.append("")
        lines += _entry(f"{_key(key)}:", item, 0)
    return "\n".join(lines) + "\n"


def plain(document: Yaml) -> Yaml:
    """The document without comment wrappers: what a YAML parser reads back."""
    if isinstance(document, Commented):
        return plain(document.value)
    if isinstance(document, Mapping):
        return {k: plain(v) for k, v in document.items()}
    if isinstance(document, list | tuple):
        return [plain(v) for v in document]
    return document
