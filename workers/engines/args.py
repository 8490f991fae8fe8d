"""Flags and args as every engine has them: an argv read into flags, CLI values as argparse stores them, and
what was asked for held against what the server says it runs.

Pure functions over names and values (no I/O). Which spellings an engine renamed, or which values it
rewrites on purpose, is the engine's own (its driver's ``observed_renames`` and ``equivalent_values``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from workers.json_value import JsonValue

#: A flag's value as the config and the grammar hold it: a string, or True for a bare flag. Here, below the
#: engines and the config, so both spell it one way without the engine folders importing the config.
FlagValue = str | bool

_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)$")


def coerce_value(value: JsonValue) -> JsonValue:
    """Turn a CLI string into what argparse would have stored (int, float, bool, None, or the string).

    Lists are coerced element-wise (``nargs='+'`` flags). Strings that only look like other types stay
    strings when they are not numbers: argparse never turns ``"true"`` into a bool, but SGLang's JSON
    reports real bools, so ``"true"``/``"false"`` are accepted as bools here to compare both sides fairly.
    """
    if isinstance(value, (list, tuple)):
        return [coerce_value(v) for v in value]
    if not isinstance(value, str):
        return value
    text = value.strip()
    if _INT_RE.match(text):
        return int(text)
    if _FLOAT_RE.match(text):
        return float(text)
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    return text


def parse_argv(argv: Iterable[str]) -> dict[str, str | bool | list[str]]:
    """Split a launch command line into ``{flag: value}``: tokens before the first ``--flag`` are dropped.

    A flag followed by another flag (or nothing) is a store_true flag (``True``); a flag followed by
    several plain tokens gets the list (``--cuda-graph-bs 1 2 4``). Used to read the argv of a process
    we did not start, never to decide what the server runs (``/server_info`` does that).
    """
    out: dict[str, str | bool | list[str]] = {}
    current: str | None = None
    values: list[str] = []

    def close() -> None:
        if current is not None:
            out[current] = True if not values else (values[0] if len(values) == 1 else list(values))

    for token in argv:
        if token.startswith("--") and len(token) > 2:
            close()
            values = []
            if "=" in token:
                name, val = token.split("=", 1)
                current = name
                values.append(val)
            else:
                current = token
        elif current is not None:
            values.append(token)
    close()
    return out


#: Args by name (``tp_size``), as a launch asks for them or a server reports them: JSON values, any engine's.
ArgValues = Mapping[str, JsonValue]

#: Args that can never be compared (secrets, or things each start chooses).
UNCOMPARABLE_ARGS = frozenset({"api_key", "admin_api_key"})


@dataclass(frozen=True)
class ArgDiff:
    """One requested arg whose observed value differs (``observed`` is None when the server lacks it)."""

    arg: str
    requested: JsonValue
    observed: JsonValue
    note: str = ""


@dataclass(frozen=True)
class ArgComparison:
    """Result of comparing what was asked for with what the server says it runs."""

    diffs: list[ArgDiff] = field(default_factory=list)
    #: Human notes about values treated as equal though they are spelled differently (NEXTN vs EAGLE).
    notes: list[str] = field(default_factory=list)


def _values_equal(a: JsonValue, b: JsonValue) -> bool:
    a, b = coerce_value(a), coerce_value(b)
    if isinstance(a, bool) or isinstance(b, bool):
        # An absent store_true flag is reported as False or None depending on the version.
        return (False if a is None else a) == (False if b is None else b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, list) and len(a) == 1:
        return _values_equal(a[0], b)
    return a == b


def compare_arg(
    arg: str, requested: JsonValue, observed: JsonValue, equivalents: Mapping[tuple[str, str, str], str] | None = None
) -> tuple[bool, str]:
    """Is ``observed`` what ``requested`` asked for? Returns (equal, note); note explains equivalences
    (``equivalents``: the engine's ``(arg, REQUESTED, OBSERVED) -> why``)."""
    if _values_equal(requested, observed):
        return True, ""
    if isinstance(requested, str) and isinstance(observed, str):
        why = (equivalents or {}).get((arg, requested.upper(), observed.upper()))
        if why:
            return True, f"{arg}: requested {requested}, server reports {observed} ({why}); treated as equal"
        if requested.lower() == "auto":
            return True, f"{arg}: requested auto, server resolved it to {observed}"
    return False, ""


def compare_requested(
    requested: ArgValues,
    observed_args: ArgValues,
    *,
    renames: Mapping[str, tuple[str, ...]] | None = None,
    equivalents: Mapping[tuple[str, str, str], str] | None = None,
) -> ArgComparison:
    """Compare only over the requested keys; a requested arg the server does not report is a diff.

    A missing key is not assumed to be fine: we only vouch for what the server told us. ``renames`` says
    where an engine's newer releases report an arg; ``equivalents`` which values it rewrites on purpose.
    """
    diffs: list[ArgDiff] = []
    notes: list[str] = []
    for arg, want in requested.items():
        if arg in UNCOMPARABLE_ARGS:
            continue
        key = arg
        if key not in observed_args:
            key = next((k for k in (renames or {}).get(arg, ()) if k in observed_args), arg)
        if key not in observed_args:
            diffs.append(ArgDiff(arg, want, None, "not reported by the server"))
            continue
        got = observed_args[key]
        equal, note = compare_arg(arg, want, got, equivalents)
        if equal:
            if note:
                notes.append(note)
        else:
            diffs.append(ArgDiff(arg, want, got, note))
    return ArgComparison(diffs, notes)
