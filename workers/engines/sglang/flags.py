"""SGLang flags and server args: flag <-> arg names via the recorded contracts, requested args, argv
parsing, and the requested-vs-observed comparison.

Pure functions over names and values (no I/O). Facts come from the contracts recorded from the real wheels
(``workers/engines/contracts/``) and docs/observe.md ("Requested vs observed"); docs/sim.md ("Versions and
flags") says what each version accepts.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from workers import secrets
from workers.engines import processes
from workers.engines.contract import Contract, all_contracts
from workers.secrets import is_secret_name

#: Args that newer SGLang versions store under another name; the diff looks there when the old name
#: is missing from the observed args (docs/observe.md, "Requested vs observed"; docs/sim.md, "Versions and flags").
OBSERVED_RENAMES: dict[str, tuple[str, ...]] = {
    "mamba_scheduler_strategy": ("mamba_radix_cache_strategy",),
    "mamba_radix_cache_strategy": ("mamba_scheduler_strategy",),
    "cuda_graph_max_bs": ("cuda_graph_max_bs_decode",),
    "stream_output": ("incremental_streaming_output",),
}


def _dashed(flag: str) -> str:
    return "--" + flag.strip().split("=", 1)[0].lstrip("-")


@functools.lru_cache(maxsize=4096)
def _recorded_arg(dashed: str) -> str | None:
    """What the newest recorded SGLang that accepts ``dashed`` (exactly or as a unique prefix) stores it as."""
    for contract in reversed(all_contracts("sglang")):
        if contract.resolve(dashed).ok:
            return contract.server_arg(dashed)
    return None


def flag_to_arg(flag: str, contract: Contract | None = None) -> str:
    """Map an SGLang CLI flag (``--tp``, ``--fp4-gemm-backend``) to the key ``/server_info`` reports it under.

    The recorded contracts answer, as SGLang's own parser would: ``contract`` (the host's version) when
    given, else the newest recorded version that accepts the flag. Only a flag no recorded version
    accepts (unknown, or an ambiguous prefix SGLang rejects) falls back to dashes -> underscores.
    ``--foo=bar`` is accepted (the value is ignored); a bare ``foo_bar`` is returned unchanged so the
    function is idempotent on already-mapped names.
    """
    name = flag.strip().split("=", 1)[0]
    if not name.startswith("-"):
        return name.replace("-", "_")
    dashed = _dashed(name)
    if contract is not None:
        found = contract.server_arg(dashed)
        if found is not None:
            return found
    return _recorded_arg(dashed) or dashed[2:].replace("-", "_")


_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)$")


def coerce_value(value: Any) -> Any:
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


def requested_args(flags: Mapping[str, str | bool | list[str]], contract: Contract | None = None) -> dict[str, Any]:
    """Flags as given by a person or a preset (``{"--tp": "8", "--enable-metrics": True}``) -> server args.

    ``True`` marks a store_true flag that is present; ``False`` one that is explicitly absent (the
    server should report ``False``). Later flags win, like argparse. ``contract`` is the host's SGLang
    version when known (see :func:`flag_to_arg`).
    """
    out: dict[str, Any] = {}
    for flag, value in flags.items():
        out[flag_to_arg(flag, contract)] = value if isinstance(value, bool) else coerce_value(value)
    return out


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


def server_argv(argv: Iterable[str]) -> list[str]:
    """The words of a process's argv that SGLang's ServerArgs parses, as ``sglang serve`` hands them on.

    ``python -m sglang.launch_server ...`` passes its argv as is. ``sglang serve`` (``sglang.cli.serve``)
    first takes out ``--model-type X`` (its backend choice, not a server arg) and reads a first plain word
    as the model (``sglang serve org/model --tp 8`` is ``--model-path org/model --tp 8``); without this a
    served model given that way would read as no model at all.
    """
    items = list(argv)
    rest = processes.sglang_serve_args(items)
    if rest is None:
        return items
    kept: list[str] = []
    i = 0
    while i < len(rest):
        if rest[i] == "--model-type":
            i += 2
            continue
        if not rest[i].startswith("--model-type="):
            kept.append(rest[i])
        i += 1
    if kept and not kept[0].startswith("-"):
        kept = ["--model-path", kept[0], *kept[1:]]
    return kept


def is_secret_flag(flag: str) -> bool:
    """Does this flag (``--api-key``, or an abbreviation SGLang accepts like ``--api-k``) carry a secret?"""
    return is_secret_name(flag_to_arg(flag))


def redact_argv(argv: Iterable[str]) -> list[str]:
    """argv with the value after a secret flag (``--api-key K``, ``--api-k=K``) replaced: the secret policy
    (:func:`workers.secrets.redact_argv`) with SGLang's flag abbreviations resolved."""
    return secrets.redact_argv(argv, is_secret_flag=is_secret_flag)


# ---------------------------------------------------------------------------------------------------------
# Requested vs observed
# ---------------------------------------------------------------------------------------------------------

#: Values SGLang rewrites on purpose; (arg, requested, observed) -> why they are the same thing.
EQUIVALENT_VALUES: dict[tuple[str, str, str], str] = {
    ("speculative_algorithm", "NEXTN", "EAGLE"): "SGLang renames NEXTN to EAGLE internally",
}

#: Args that can never be compared (secrets, or things each start chooses).
UNCOMPARABLE_ARGS = frozenset({"api_key", "admin_api_key"})


@dataclass(frozen=True)
class ArgDiff:
    """One requested arg whose observed value differs (``observed`` is None when the server lacks it)."""

    arg: str
    requested: Any
    observed: Any
    note: str = ""


@dataclass(frozen=True)
class ArgComparison:
    """Result of comparing what was asked for with what the server says it runs."""

    diffs: list[ArgDiff] = field(default_factory=list)
    #: Human notes about values treated as equal though they are spelled differently (NEXTN vs EAGLE).
    notes: list[str] = field(default_factory=list)


def _values_equal(a: Any, b: Any) -> bool:
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


def compare_arg(arg: str, requested: Any, observed: Any) -> tuple[bool, str]:
    """Is ``observed`` what ``requested`` asked for? Returns (equal, note); note explains equivalences."""
    if _values_equal(requested, observed):
        return True, ""
    if isinstance(requested, str) and isinstance(observed, str):
        why = EQUIVALENT_VALUES.get((arg, requested.upper(), observed.upper()))
        if why:
            return True, f"{arg}: requested {requested}, server reports {observed} ({why}); treated as equal"
        if requested.lower() == "auto":
            return True, f"{arg}: requested auto, server resolved it to {observed}"
    return False, ""


def compare_requested(requested: Mapping[str, Any], observed_args: Mapping[str, Any]) -> ArgComparison:
    """Compare only over the requested keys; a requested arg the server does not report is a diff.

    A missing key is not assumed to be fine: we only vouch for what the server told us.
    """
    diffs: list[ArgDiff] = []
    notes: list[str] = []
    for arg, want in requested.items():
        if arg in UNCOMPARABLE_ARGS:
            continue
        key = arg
        if key not in observed_args:
            key = next((k for k in OBSERVED_RENAMES.get(arg, ()) if k in observed_args), arg)
        if key not in observed_args:
            diffs.append(ArgDiff(arg, want, None, "not reported by the server"))
            continue
        got = observed_args[key]
        equal, note = compare_arg(arg, want, got)
        if equal:
            if note:
                notes.append(note)
        else:
            diffs.append(ArgDiff(arg, want, got, note))
    return ArgComparison(diffs, notes)
