"""vLLM as an engine: its presets as data (``presets.toml``; ``presets-cpu.toml`` for its CPU build), read
against its recorded contracts."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

PRESETS_FILE = Path(__file__).resolve().parent / "presets.toml"
#: The presets of a vLLM host whose engine runs on the CPU (``device = "cpu"``): only what the CPU build
#: has (no CUDA-only backends), held against the CPU build's recorded contract.
CPU_PRESETS_FILE = Path(__file__).resolve().parent / "presets-cpu.toml"
#: Packaged presets per preset set (a config's ``[engines.SET.presets]`` replaces one).
PRESETS_FILES = {"vllm": PRESETS_FILE, "vllm-cpu": CPU_PRESETS_FILE}


def load_presets(path: Path = PRESETS_FILE) -> dict[str, dict[str, Any]]:
    """``{word: {"description", "group", "flags", "env"}}`` as written in the presets file."""
    with path.open("rb") as fh:
        return dict(tomllib.load(fh).get("presets", {}))


def preset_flags(preset: dict[str, Any]) -> list[tuple[str, str | bool]]:
    """A preset's flags as (flag, value) pairs: True for a bare flag, other values as strings."""
    return [(flag, True if value is True else str(value)) for flag, value in (preset.get("flags") or {}).items()]
