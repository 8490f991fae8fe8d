"""vLLM as an engine: everything benchbot knows about it.

- :mod:`~workers.engines.vllm.processes`: which argv is a vLLM server (``vllm serve``, its modules)
- :mod:`~workers.engines.vllm.probe`: how to ask a host its vLLM version
- :mod:`~workers.engines.vllm.flags`: flags read by the recorded parser, requested args, secret flags
- :mod:`~workers.engines.vllm.diagnosis`: vLLM's failure RULES on its recorded texts
- :mod:`~workers.engines.vllm.profile`: ``/start_profile`` where ``--profiler-config`` allows it
- :mod:`~workers.engines.vllm.driver`: all of it behind :class:`workers.engines.interface.EngineDriver`

Its presets are data (``presets.toml``; ``presets-cpu.toml`` for its CPU build), read against its recorded
contracts (``workers/engines/contracts/vllm-<version>.json``, ``vllm-cpu-<version>.json``).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from workers.engines.interface import Engine, MetricNames
from workers.engines.vllm import probe
from workers.engines.vllm.processes import DEFAULT_PORT, KIND, NEEDLES, recognise

if TYPE_CHECKING:
    from workers.engines.interface import EngineDriver

PRESETS_FILE = Path(__file__).resolve().parent / "presets.toml"
#: The presets of a vLLM host whose engine runs on the CPU (``device = "cpu"``): only what the CPU build
#: has (no CUDA-only backends), held against the CPU build's recorded contract.
CPU_PRESETS_FILE = Path(__file__).resolve().parent / "presets-cpu.toml"
#: Packaged presets per preset set (a config's ``[engines.SET.presets]`` replaces one).
PRESETS_FILES = {"vllm": PRESETS_FILE, "vllm-cpu": CPU_PRESETS_FILE}


def load_presets(path: Path = PRESETS_FILE) -> dict[str, dict[str, object]]:
    """``{word: {"description", "group", "flags", "env"}}`` as written in the presets file."""
    with path.open("rb") as fh:
        return dict(tomllib.load(fh).get("presets", {}))


def preset_flags(preset: Mapping[str, object]) -> list[tuple[str, str | bool]]:
    """A preset's flags as (flag, value) pairs: True for a bare flag, other values as strings."""
    flags = preset.get("flags")
    pairs = flags.items() if isinstance(flags, Mapping) else ()
    return [(str(flag), True if value is True else str(value)) for flag, value in pairs]


def _driver() -> EngineDriver:
    from workers.engines.vllm.driver import DRIVER

    return DRIVER


ENGINE = Engine(
    kind=KIND,
    name="vLLM",
    default_port=DEFAULT_PORT,
    default_command=("vllm", "serve"),  # the model follows ``serve`` as a positional
    recognise=recognise,
    version_argv=probe.version_argv,
    load_driver=_driver,
    process_needles=NEEDLES,
    devices=("cuda", "cpu"),
    preset_files=PRESETS_FILES,
    set_names={"vllm-cpu": "vLLM's CPU build"},
    metrics=MetricNames(
        running=("vllm:num_requests_running",),
        queued=("vllm:num_requests_waiting",),
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),  # older releases: gpu_cache_usage_perc
        ttft=("vllm:time_to_first_token_seconds",),
        itl=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),  # older: time_per_output_token
        e2e=("vllm:e2e_request_latency_seconds",),
    ),
)
