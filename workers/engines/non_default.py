"""The launch flags whose value differs from the engine's own defaults, as the config's summary names them.

A summary names what matters most for speed in words (``no spec, TP1, eager``); two servers that differ
only in another flag (``--max-num-seqs 8`` against ``4``) would read the same. :func:`non_default_flags`
lists every other option whose observed value is not the recorded parser's default (``contracts/<kind>-
<version>.json``, parsed by the parser rebuilt from it, so types and spellings are the engine's own), so two
different configs never share a summary.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Collection, Mapping

from workers.engines.contract import Contract, Option
from workers.json_value import JsonValue

_DEFAULTS: dict[tuple[str, str], dict[str, object]] = {}


def _defaults(contract: Contract) -> dict[str, object]:
    """Every dest's default as the recorded parser stores it (string defaults typed), {} if it cannot parse."""
    key = (contract.engine, contract.version)
    if key not in _DEFAULTS:
        parser = contract.build_parser(exit_on_error=False)
        try:
            ns, _ = parser.parse_known_args([])
            _DEFAULTS[key] = vars(ns)
        except (argparse.ArgumentError, SystemExit, ValueError):
            _DEFAULTS[key] = {}
    return _DEFAULTS[key]


def _render(opt: Option, value: JsonValue) -> str:
    """``--flag``, ``--no-flag`` or ``--flag value`` as one would type it for this value."""
    if value is True and not opt.takes_value:
        return opt.name
    if value is False and not opt.takes_value:
        negative = opt.negative_flags[0] if opt.negative_flags else "--no-" + opt.name.removeprefix("--")
        return negative
    if isinstance(value, list | tuple):
        text = " ".join(str(v) for v in value)
    elif isinstance(value, dict):
        text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    else:
        text = str(value)
    return f"{opt.name} {text}"


def non_default_flags(contract: Contract | None, args: Mapping[str, JsonValue], skip: Collection[str]) -> list[str]:
    """``--flag value`` for each observed arg (by dest) that differs from its default, in the parser's order;
    dests in ``skip`` (what the summary already says in words, where the server listens) are left out."""
    if contract is None:
        return []
    defaults = _defaults(contract)
    out: list[str] = []
    seen: set[str] = set()
    for opt in contract.options:
        dest = opt.dest
        if dest in seen or dest in skip or dest not in args or dest not in defaults or opt.action == "help":
            continue
        seen.add(dest)
        value = args[dest]
        if value == defaults[dest] or value is None:
            continue
        out.append(_render(opt, value))
    return out
