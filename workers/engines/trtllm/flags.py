"""TensorRT-LLM's command line and the ``--config`` YAML benchbot writes for it, read as ``trtllm-serve`` reads them.

Pure functions (no I/O besides the packaged contracts). ``trtllm-serve serve MODEL [OPTIONS]`` parses with
click: option names match exactly (no prefixes), keep their underscores (``--tp_size``; ``--tp-size`` is
"No such option"), and a flag (``is_flag``) takes no value. Settings the command line does not have
(the MoE backend, speculative decoding, attention DP, CUDA graphs...) are LLM API fields that only the
``--config`` / ``--extra_llm_api_options`` YAML sets. benchbot spells each as a pseudo-flag naming its YAML
key (``--moe_config.backend CUTLASS``, ``--enable_attention_dp true``): the recorded contract lists those
keys beside the real options (``"llm_api_key"``), with the choices and types read from ``llm_args.py``, so
presets and raw flags are checked against one contract. At launch :func:`split_launch` moves them into
the YAML document benchbot hands the engine through its private ``--config`` file (generic code writes it,
0600, keeps it while the server runs and reads it back: ``Engine.settings_file``); argv keeps the real
options. :func:`read_settings` reads that file back: only the format benchbot writes (JSON, which YAML reads
too; a YAML file written by hand is not benchbot's and is refused), flattened to the dotted keys
:func:`requested_args` gives, so the observation compares, fingerprints and labels them like argv's.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn

from workers import secrets
from workers.engines.args import FlagValue
from workers.engines.contract import Contract, add_option, contract_or_newest, contract_path
from workers.engines.contract import recorded_versions as _recorded
from workers.engines.processes import without_simulator_flags
from workers.engines.trtllm import processes
from workers.json_value import JsonObject, JsonValue

ENGINE = "trtllm"
#: The real option that names the YAML file (benchbot's own private file; never a member's).
CONFIG_FLAGS = ("--config", "--extra_llm_api_options")


def recorded_versions() -> list[str]:
    """TensorRT-LLM versions with a recorded contract, oldest first."""
    return _recorded(ENGINE)


def contract_for(version: str | None) -> Contract | None:
    """The recorded contract of ``version``, else the newest recorded one (None when none is recorded)."""
    return contract_or_newest(ENGINE, version)


@functools.lru_cache(maxsize=16)
def yaml_keys(version: str) -> dict[str, str]:
    """``{"--moe_config.backend": "int|float|bool|str"}``: the recorded pseudo-options of ``version`` (YAML keys)."""
    data = json.loads(contract_path(ENGINE, version).read_text(encoding="utf-8"))
    return {
        o["flags"][0]: str(o.get("llm_api_type") or "str") for o in data["parser"]["options"] if o.get("llm_api_key")
    }


def _keys(contract: Contract | None) -> dict[str, str]:
    return yaml_keys(contract.version) if contract is not None and contract.engine == ENGINE else {}


def cli_options(contract: Contract) -> list[Any]:
    """The contract's real ``serve`` options (its YAML pseudo-options left out)."""
    keys = _keys(contract)
    return [o for o in contract.options if o.name not in keys]


def typed(value: object, kind: str) -> JsonValue:
    """A flag's text as the YAML value of its field's type (``"true"`` -> True, ``"3"`` -> 3)."""
    if value is True or kind == "bool":
        return value is True or str(value).strip().lower() in ("true", "1", "yes", "on")
    text = str(value)
    try:
        return int(text) if kind == "int" else float(text) if kind == "float" else text
    except ValueError:
        return text


def _nest(tree: JsonObject, dotted: str, value: JsonValue) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


def split_launch(
    flags: Iterable[tuple[str, Any]], contract: Contract | None
) -> tuple[list[tuple[str, Any]], JsonObject]:
    """(flags for argv, the ``--config`` YAML document): YAML pseudo-flags become nested keys, typed."""
    keys = _keys(contract or contract_for(None))
    argv: list[tuple[str, Any]] = []
    document: JsonObject = {}
    for flag, value in flags:
        name = flag.split("=", 1)[0]
        if name in keys:
            _nest(document, name[2:], typed(value if "=" not in flag else flag.split("=", 1)[1], keys[name]))
        else:
            argv.append((flag, value))
    return argv, document


def split_for(flags: Sequence[tuple[str, Any]], version: str | None) -> tuple[list[tuple[str, Any]], JsonObject]:
    """:func:`split_launch` with the contract of the host's ``version`` (the newest recorded one when unknown)."""
    return split_launch(flags, contract_for(version))


def read_settings(text: str) -> JsonObject:
    """benchbot's ``--config`` file as observed args: ``{"moe_config.backend": "CUTLASS", ...}``; ValueError when
    the text is not the JSON object benchbot writes."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not benchbot's --config file: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError("not benchbot's --config file: not a mapping")
    return flatten(document)


def flatten(document: Mapping[str, JsonValue], prefix: str = "") -> JsonObject:
    """``{"moe_config": {"backend": "CUTLASS"}}`` -> ``{"moe_config.backend": "CUTLASS"}``."""
    out: JsonObject = {}
    for key, value in document.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def parser_for(contract: Contract) -> argparse.ArgumentParser:
    """``serve``'s options rebuilt from the contract (exact names, as click matches them), MODEL positional."""
    parser = argparse.ArgumentParser(prog=contract.prog, allow_abbrev=False, add_help=False, exit_on_error=False)
    for opt in cli_options(contract):
        if opt.action != "help":
            add_option(parser, opt)
    parser.add_argument("model", nargs="?")
    return parser


def observed_args(argv: Sequence[str], contract: Contract) -> JsonObject:
    """Every ``serve`` arg (TensorRT-LLM's dest names, defaults included) a process was started with, read
    by the recorded options; secrets redacted; ``{}`` when the command line cannot be read."""
    words = processes.serve_args(argv)
    if words is None:
        return {}
    parser = parser_for(contract)

    def refuse(message: str) -> NoReturn:  # argparse would print usage to the observer's stderr, then exit
        raise ValueError(message)

    parser.error = refuse  # type: ignore[method-assign]
    try:
        ns, _unknown = parser.parse_known_args(without_simulator_flags(words))
    except (argparse.ArgumentError, SystemExit, ValueError):
        return {}
    args: JsonObject = secrets.redact({k: v for k, v in vars(ns).items() if k != "help"})
    return args


def requested_args(flags: Mapping[str, FlagValue], contract: Contract | None) -> JsonObject:
    """Flags as a preset or a person gave them -> TensorRT-LLM's names: a real option's dest (``--tp_size``
    -> ``tensor_parallel_size``), a YAML pseudo-flag's key (``moe_config.backend``), values typed."""
    contract = contract or contract_for(None)
    keys = _keys(contract)
    out: JsonObject = {}
    for flag, value in flags.items():
        name = flag.split("=", 1)[0]
        if name in keys:
            out[name[2:]] = typed(value, keys[name])
            continue
        res = contract.resolve(name) if contract is not None else None
        opt = res.option if res is not None else None
        key = opt.dest if opt is not None else name.lstrip("-")
        if opt is not None and not opt.takes_value:
            out[key] = value is True or str(value).lower() == "true"
        else:
            out[key] = typed(value, opt.type or "str" if opt is not None else "str")
    return out


def flag_key(flag: str) -> str:
    """Which spellings are one option, for merging base flags, presets and raw flags (``--tp_size`` is
    ``--tensor_parallel_size``; ``--kv_cache_free_gpu_memory_fraction`` is ``--free_gpu_memory_fraction``)."""
    contract = contract_for(None)
    name = flag.split("=", 1)[0]
    if contract is not None:
        res = contract.resolve(name)
        if res.option is not None:
            return res.option.dest
    return name


def redact_argv(argv: Iterable[str]) -> list[str]:
    """argv with the value of a secret-named option hidden (TensorRT-LLM's CLI has none today)."""
    return secrets.redact_argv(argv, is_secret_flag=lambda flag: secrets.is_secret_name(flag.lstrip("-")))
