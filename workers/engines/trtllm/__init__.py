"""TensorRT-LLM as an engine (``trtllm-serve``): everything benchbot knows about it, one noun per module.

- :mod:`~workers.engines.trtllm.processes`: which argv is a ``trtllm-serve`` server (its console script, its module)
- :mod:`~workers.engines.trtllm.probe`: how to ask a host its TensorRT-LLM version
- :mod:`~workers.engines.trtllm.flags`: its click options read by the recorded contract, the LLM API settings
  benchbot writes into its ``--config`` file (spelt ``--moe_config.backend``) and reads back, requested args
- :mod:`~workers.engines.trtllm.diagnosis`: its failure RULES on its recorded texts
- :mod:`~workers.engines.trtllm.readiness`: the ``/health`` wait, the ``/v1/completions`` smoke test
- :mod:`~workers.engines.trtllm.observation`: ``/version`` + ``/v1/models`` + argv + the ``--config`` file, the
  fingerprint and label
- :mod:`~workers.engines.trtllm.driver`: all of it behind :class:`workers.engines.interface.EngineDriver`

Its presets are data (``presets.toml``), read against its recorded contracts (``contracts/trtllm-<v>.json``,
recorded from its source by ``tools/record_trtllm_contract.py``). Its simulator is ``workers/sim/trtllm.py``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from workers.engines.interface import Engine, MetricNames, SettingsFile
from workers.engines.trtllm import probe
from workers.engines.trtllm.processes import DEFAULT_PORT, KIND, NEEDLES, recognise

if TYPE_CHECKING:
    from workers.engines.args import FlagValue
    from workers.engines.interface import EngineDriver
    from workers.json_value import JsonObject

PRESETS_FILE = Path(__file__).resolve().parent / "presets.toml"
#: Packaged presets per preset set (a config's ``[engines.trtllm.presets]`` replaces them).
PRESETS_FILES = {KIND: PRESETS_FILE}


def load_presets(path: Path = PRESETS_FILE) -> dict[str, dict[str, object]]:
    """``{word: {"description", "group", "flags", "env"}}`` as written in the presets file."""
    with path.open("rb") as fh:
        return dict(tomllib.load(fh).get("presets", {}))


def _driver() -> EngineDriver:
    from workers.engines.trtllm.driver import DRIVER

    return DRIVER


def _split(
    flags: Sequence[tuple[str, FlagValue]], version: str | None
) -> tuple[list[tuple[str, FlagValue]], JsonObject]:
    from workers.engines.trtllm.flags import split_for

    return split_for(flags, version)


def _read(text: str) -> JsonObject:
    from workers.engines.trtllm.flags import read_settings

    return read_settings(text)


ENGINE = Engine(
    kind=KIND,
    name="TensorRT-LLM",
    default_port=DEFAULT_PORT,
    default_command=("trtllm-serve", "serve"),  # the model follows ``serve`` as a positional
    recognise=recognise,
    version_argv=probe.version_argv,
    load_driver=_driver,
    process_needles=NEEDLES,
    devices=("cuda",),
    preset_files=PRESETS_FILES,
    # its OpenAI server checks no API key: a key in the config would protect nothing
    checks_api_key=False,
    # the MoE backend, speculative decoding, attention DP...: LLM API fields only its --config YAML sets
    settings_file=SettingsFile(split=_split, read=_read, path_flags=("--config", "--extra_llm_api_options")),
    # Its /metrics is the executor's iteration stats, not Prometheus: each read drains them and is held open
    # until 2 s pass without a new one (``get_stats_async(2)``), so a scrape during a level blocks; and its
    # /prometheus/metrics (with ``return_perf_metrics``) has request counters and latency histograms only.
    metrics=MetricNames(
        no_gauges="TensorRT-LLM serves no load gauges: its /metrics is iteration stats, held open while it is busy"
    ),
)
