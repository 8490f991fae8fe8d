"""The launch flags whose value differs from the engine's own defaults, as the config's summary names them.

A summary names what matters most for speed in words (``no spec, TP1, eager``); two servers that differ
only in another flag (``--max-num-seqs 8`` against ``4``) would read the same. :func:`non_default_flags`
lists every other option whose observed value is not the recorded parser's default (``contracts/<kind>-
<version>.json``, parsed by the parser rebuilt from it, so types and spellings are the engine's own), so two
different configs never share a summary.

Engines that report their *resolved* args (SGLang's ``/server_info``) fill an unset option with what they
chose at start (``chunked_prefill_size`` 8192, ``mem_fraction_static`` 0.863): that is not what was varied,
so such an engine passes ``asked``, the options its command line set, and only those are named. Without a
command line (the process is not visible) every observed difference is named: noisier, but two different
configs still never read the same. What an engine leaves out (where it listens, names, logging, secrets)
is its fingerprint's dropped set plus what its summary says in words, passed as ``skip``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Collection, Mapping

from workers.engines.contract import Contract, Option
from workers.json_value import JsonValue

_DEFAULTS: dict[tuple[str, str], dict[str, object]] = {}


def _placeholder(opt: Option) -> list[str]:
    """A required option given a value its type accepts, so the parser yields everyone else's default."""
    if not opt.takes_value:
        return [opt.name]
    value = opt.choices[0] if opt.choices else "0" if opt.type in ("int", "float") else "x"
    return [opt.name, value]


def _defaults(contract: Contract) -> dict[str, object]:
    """Every dest's default as the recorded parser stores it (string defaults typed), {} if it cannot parse.
    A required option (SGLang's ``--model-path``) has no default: it is given a placeholder and left out."""
    key = (contract.engine, contract.version)
    if key not in _DEFAULTS:
        parser = contract.build_parser(exit_on_error=False)
        required = [opt for opt in contract.options if opt.required]
        try:
            ns, _ = parser.parse_known_args([word for opt in required for word in _placeholder(opt)])
            _DEFAULTS[key] = {k: v for k, v in vars(ns).items() if k not in {opt.dest for opt in required}}
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


def non_default_flags(
    contract: Contract | None,
    args: Mapping[str, JsonValue],
    skip: Collection[str],
    asked: Collection[str] | None = None,
) -> list[str]:
    """``--flag value`` for each observed arg that differs from its default, in the parser's order.

    ``args`` are keyed as the engine reports them (the dest, or SGLang's ``/server_info`` key: ``tp_size`` for
    ``--tensor-parallel-size``); keys in ``skip`` (what the summary already says in words, where the server
    listens) are left out; with ``asked`` (the keys its command line set) only those are named."""
    if contract is None:
        return []
    defaults = _defaults(contract)
    out: list[str] = []
    seen: set[str] = set()
    for opt in contract.options:
        key = contract.server_arg(opt.name) or opt.dest
        if key in seen or opt.dest not in defaults or opt.action == "help":
            continue
        seen.add(key)
        if key in skip or key not in args or (asked is not None and key not in asked):
            continue
        value = args[key]
        if value == defaults[opt.dest] or value is None:
            continue
        out.append(_render(opt, value))
    return out
