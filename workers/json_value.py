"""JSON at the process's edges: typed on the way out, named once on the way in.

``JsonValue`` / ``JsonObject`` are what a ``to_dict`` returns: only JSON's own values, so mypy refuses a
datetime or a dataclass that ``json.dumps`` would refuse at run time. ``RawJson`` is a JSON object as it
was decoded (``json.loads`` of a payload, a Redis field, a stored record) until a ``from_dict`` reads it
into a frozen type: the one untyped edge, named here rather than spelled out at every decoder. A decoder
that can take its object as ``Mapping[str, object]`` instead reads each field through the readers below
(``opt_str``, ``req_int``, ``json_object``...), so every value is narrowed to its type where it is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: A JSON value. Its containers are the read-only ``Sequence`` / ``Mapping`` (covariant), so a typed
#: ``dict[str, float | None]`` or ``list[int]`` is one without a copy.
JsonValue = str | int | float | bool | None | Sequence["JsonValue"] | Mapping[str, "JsonValue"]
#: A JSON object, as a ``to_dict`` builds it.
JsonObject = dict[str, JsonValue]
#: A JSON object as decoded, before it is typed (what ``from_dict`` methods read).
RawJson = Mapping[str, Any]


# ---- reading a decoded object field by field (``Mapping[str, object]``), each value narrowed by its type ----


def json_object(value: object) -> JsonObject:
    """``value`` as a JSON object with string keys (a copy); ``{}`` when it is none (missing, null, a list)."""
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else {}


def opt_str(value: object) -> str | None:
    """A string field: None when missing or null, anything else as its text."""
    return None if value is None else str(value)


def opt_int(value: object) -> int | None:
    """An integer field: None when missing, null or not a number (a bool is no number; 8.0 reads as 8)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if float(value).is_integer() else None


def opt_float(value: object) -> float | None:
    """A number field: None when missing, null or not a number (a bool is no number)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def opt_bool(value: object) -> bool | None:
    """A true/false field: None when missing, null or anything but a bool."""
    return value if isinstance(value, bool) else None


def req_int(value: object) -> int:
    """A required integer (a JSON number, or its decimal text as older writers left it); TypeError or
    ValueError otherwise, as ``int()`` raises."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return int(value)


def req_float(value: object) -> float:
    """A required number (or its decimal text); TypeError or ValueError otherwise, as ``float()`` raises."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)
