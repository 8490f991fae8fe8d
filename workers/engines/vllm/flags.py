"""vLLM's command line read as vLLM reads it: FlexibleArgumentParser's rewrites, the recorded parser, args.

Pure functions (no I/O). ``vllm serve MODEL [flags]``: the model is a positional (``model_tag``), flags
resolve by prefix (``allow_abbrev``), ``--a_b`` is ``--a-b`` and ``--x.key v`` merges into ``--x '{"key": v}'``.
What a process was started with is read back with the contract of the version it runs, so the observed
args carry vLLM's own names (dests) and defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import NoReturn

from workers import secrets
from workers.engines.args import FlagValue, coerce_value
from workers.engines.contract import Contract, contract_or_newest
from workers.engines.processes import without_simulator_flags
from workers.json_value import JsonObject, JsonValue

#: Module entry points that run ``vllm serve`` (``python -m ... serve``) or the older OpenAI server.
SERVE_MODULES = ("vllm.entrypoints.cli.main", "vllm.entrypoints.openai.api_server")


def flexible_argv(argv: Sequence[str]) -> list[str]:
    """FlexibleArgumentParser's documented rewrites: ``--a_b`` -> ``--a-b`` (up to the first dot) and
    ``--x.key v`` / ``--x.key=v`` merged into ``--x '{"key": v}'`` (values as JSON where they parse)."""
    out: list[str] = []
    dotted: dict[str, JsonObject] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            head, dot, rest = key[2:].partition(".")
            key = "--" + head.replace("_", "-") + dot + rest
            if dot:
                if not eq:
                    i += 1
                    value = argv[i] if i < len(argv) else ""
                try:
                    parsed: JsonValue = json.loads(value)
                except json.JSONDecodeError:
                    parsed = value
                node = dotted.setdefault("--" + head.replace("_", "-"), {})
                parts = rest.split(".")
                for part in parts[:-1]:
                    child = node.setdefault(part, {})
                    if not isinstance(child, dict):  # --x.a 1 --x.a.b 2: the later, deeper key wins
                        child = node[part] = {}
                    node = child
                node[parts[-1]] = parsed
            else:
                out.append(key + eq + value)
        else:
            out.append(arg)
        i += 1
    for flag, tree in dotted.items():
        out += [flag, json.dumps(tree)]
    return out


def contract_for(version: str | None) -> Contract | None:
    """The recorded contract of ``version``, else the newest recorded one (None when none is recorded)."""
    return contract_or_newest("vllm", version)


def serve_args(argv: Sequence[str]) -> list[str]:
    """The part of a process's argv that ``vllm serve``'s parser reads: after ``serve`` (or the module)."""
    items = list(argv)
    for i, token in enumerate(items):
        if token == "serve" or (token in SERVE_MODULES and i > 0 and items[i - 1] == "-m"):
            rest = items[i + 1 :]
            return rest[1:] if token != "serve" and rest[:1] == ["serve"] else rest
    return items[1:]


def observed_args(argv: Sequence[str], contract: Contract) -> JsonObject:
    """Every ``vllm serve`` arg (vLLM's dest names, defaults included) a process was started with, read
    by the recorded parser; secrets redacted; ``{}`` when the parser cannot read the command line."""
    parser = contract.build_parser(exit_on_error=False)
    parser.add_argument("model_tag", nargs="?")

    def refuse(message: str) -> NoReturn:  # argparse would print usage to the observer's stderr, then exit
        raise ValueError(message)

    parser.error = refuse  # type: ignore[method-assign]
    try:
        ns, _unknown = parser.parse_known_args(flexible_argv(without_simulator_flags(serve_args(argv))))
    except (argparse.ArgumentError, SystemExit, ValueError):
        return {}
    args = {k: v for k, v in vars(ns).items() if k != "help"}
    spec = args.get("speculative_config")
    if isinstance(spec, str):
        with contextlib.suppress(json.JSONDecodeError):
            args["speculative_config"] = json.loads(spec)
    redacted: JsonObject = secrets.redact(args)
    return redacted


def requested_args(flags: Mapping[str, FlagValue], contract: Contract | None) -> JsonObject:
    """Flags as a preset or a person gave them -> vLLM's arg names and values (as its parser stores them)."""
    out: JsonObject = {}
    for flag, value in flags.items():
        res = contract.resolve(flag) if contract is not None else None
        key = res.option.dest if res is not None and res.option is not None else flag.lstrip("-").replace("-", "_")
        if isinstance(value, bool):
            negative = res is not None and res.option is not None and res.flag in res.option.negative_flags
            out[key] = not value if negative else value
        elif key == "speculative_config" and isinstance(value, str):
            try:
                out[key] = json.loads(value)
            except json.JSONDecodeError:
                out[key] = value
        else:
            out[key] = coerce_value(value)
    return out


def flag_key(flag: str) -> str:
    """Which spellings are one option, for merging base flags, presets and raw flags
    (``-tp`` is ``--tensor-parallel-size``)."""
    contract = contract_for(None)
    if contract is not None:
        res = contract.resolve(flag)
        if res.option is not None:
            return res.option.dest
    return contract.normalize(flag) if contract is not None else flag


def redact_argv(argv: Iterable[str]) -> list[str]:
    """argv with the value of a secret flag hidden, abbreviations resolved as vLLM's parser resolves them."""
    contract = contract_for(None)

    def is_secret(flag: str) -> bool:
        res = contract.resolve(flag) if contract is not None else None
        name = res.option.dest if res is not None and res.option is not None else flag.lstrip("-")
        return secrets.is_secret_name(name.replace("-", "_"))

    return secrets.redact_argv(argv, is_secret_flag=is_secret)
