"""benchbot.toml: hosts (each with its engine), presets, access and limits, validated with errors that name the key.

Found via ``--config``, then ``BENCHBOT_CONFIG``, then ``./benchbot.toml``; with none of those, the
embedded default (``embedded.toml`` + ``seed_presets.toml``, shipped as package data: one simulated host
named ``sim``, one ``sim-vllm``, a group ``pair`` of two more, and the seed's presets) is used, so a
newcomer can run everything with no file at all. The modules: ``schema`` (the dataclasses), ``discovery``
(where the file is, the embedded default's ports), ``checks`` + ``validate`` (validation by section, groups in
``groups``). This module loads and
re-exports, so ``from workers.config import ...`` keeps working for every caller.
"""

from __future__ import annotations

import tomllib
from importlib import resources

from workers.config.checks import RawTable
from workers.config.discovery import (
    EMBEDDED_PORT_FILE,
    EMBEDDED_VLLM_PORT_FILE,
    embedded_port,
    find_config_path,
)
from workers.config.schema import (
    DATASET_NAME_RE,
    DEFAULT_COMMANDS,
    DEVICES,
    EMBEDDED_SOURCE,
    ENGINE_KEYS,
    ENV_NAME_RE,
    FLAG_RE,
    LOCAL_MACHINE,
    NAME_RE,
    USER_RE,
    AccessConfig,
    Config,
    EngineConfig,
    EvalConfig,
    FlagValue,
    GroupConfig,
    HostConfig,
    Limits,
    MetricsConfig,
    Preset,
    PresetVersion,
    expand_python,
    machine_of,
)
from workers.config.validate import _Validator
from workers.errors import ConfigError
from workers.redis_conn import state_dir


def _package_text(name: str) -> str:
    """A TOML file shipped beside this module, its leading comment lines dropped (they document the file)."""
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "\n" + "".join(lines)


#: The seed's presets: what the team tried on 8 x RTX PRO 6000 (SM120) with Qwen3.5-397B NVFP4.
SEED_PRESETS_TOML = _package_text("seed_presets.toml")
#: The embedded default as written (fixed ports 30000 / 8000, no log_dir): tests and demos start from it.
EMBEDDED_TOML = _package_text("embedded.toml") + SEED_PRESETS_TOML


def embedded_data() -> RawTable:
    """The embedded default for this user, as raw TOML data: the simulated hosts on this user's own ports,
    logging under the state dir (not 30000 and ``/tmp/benchbot``, which on a shared box belong to someone
    else). Set on the parsed tables, not patched into the text."""
    directory = state_dir()
    data = tomllib.loads(EMBEDDED_TOML)
    logs = str(directory / "logs")
    for name, port_file in (("sim", EMBEDDED_PORT_FILE), ("sim-vllm", EMBEDDED_VLLM_PORT_FILE)):
        host = data["hosts"][name]
        host["port"] = embedded_port(directory, port_file)
        host["log_dir"] = logs
    for name, group in data.get("groups", {}).items():  # the group's hosts and rendezvous port: this user's too
        for member in group["hosts"]:
            data["hosts"][member]["port"] = embedded_port(directory, f"{member}-port")
            data["hosts"][member]["log_dir"] = logs
        group["port"] = embedded_port(directory, f"{name}-rendezvous-port")
    return data


def load_config(cli_path: str | None = None) -> Config:
    """Load and validate the configuration that applies here."""
    path = find_config_path(cli_path)
    if path is None:
        return _Validator(EMBEDDED_SOURCE).config(embedded_data())
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_config(text, str(path))


def parse_config(text: str, source: str = "benchbot.toml") -> Config:
    """Parse TOML text into a validated :class:`Config`; every error names ``source`` and the key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    return _Validator(source).config(data)


__all__ = [
    "DATASET_NAME_RE",
    "DEFAULT_COMMANDS",
    "DEVICES",
    "EMBEDDED_PORT_FILE",
    "EMBEDDED_SOURCE",
    "EMBEDDED_TOML",
    "EMBEDDED_VLLM_PORT_FILE",
    "ENGINE_KEYS",
    "ENV_NAME_RE",
    "FLAG_RE",
    "LOCAL_MACHINE",
    "NAME_RE",
    "SEED_PRESETS_TOML",
    "USER_RE",
    "AccessConfig",
    "Config",
    "EngineConfig",
    "EvalConfig",
    "FlagValue",
    "GroupConfig",
    "HostConfig",
    "Limits",
    "MetricsConfig",
    "Preset",
    "PresetVersion",
    "embedded_data",
    "embedded_port",
    "expand_python",
    "find_config_path",
    "load_config",
    "machine_of",
    "parse_config",
]
