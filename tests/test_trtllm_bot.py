"""TensorRT-LLM reaches the bot through the registry alone (issue 21): ``/help`` lists its presets in its words,
``config check`` names them, ``benchbot sim trtllm`` runs its simulator, and messages name it.

Nothing in ``bot/`` names the engine (``tests/test_engine_seam.py``): each of these comes from its folder's
``ENGINE`` and the registry line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bot.commands.help import preset_lines
from workers.config import parse_config
from workers.engines import registry
from workers.engines.trtllm import load_presets

REPO = Path(__file__).resolve().parent.parent
#: One SGLang host (the default engine) and one simulated TensorRT-LLM host.
CONFIG = """
default_host = "gpu-1"
[hosts.gpu-1]
[hosts.trt-1]
port = 8000
[hosts.trt-1.engine]
kind = "trtllm"
command = ["{python}", "-m", "workers.sim.trtllm", "serve"]
flags = { "--tp_size" = 8 }

[presets.cutlass]
description = "SGLang's words for the default engine's hosts"
flags = { "--moe-runner-backend" = "flashinfer_cutlass" }
"""


def test_help_lists_trtllm_presets_in_its_own_words_after_the_default_engines() -> None:
    lines = list(preset_lines(parse_config(CONFIG)))
    heading = lines.index("  TensorRT-LLM hosts (trt-1), in TensorRT-LLM's words:")
    assert heading == 1 and lines[0].startswith("  cutlass")  # the default engine's presets first
    listed = [line.split()[0] for line in lines[heading + 1 :]]
    assert listed == list(load_presets())
    assert any(line.startswith("  moe-cutlass") and "[moe]" in line for line in lines[heading + 1 :])


def test_config_check_names_trtllm_presets_and_benchbot_sim_runs_its_simulator(tmp_path: Path) -> None:
    config = tmp_path / "benchbot.toml"
    config.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if k != "BENCHBOT_CONFIG"} | {"BENCHBOT_STATE_DIR": str(tmp_path)}

    def cli(*words: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "bot.cli", *words]
        return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)

    checked = cli("--config", str(config), "config", "check")
    assert checked.returncode == 0, checked.stderr
    assert f"  TensorRT-LLM presets: {', '.join(load_presets())}" in checked.stdout.splitlines()
    assert "engine (its own [hosts.trt-1.engine]): trtllm `" in checked.stdout
    version = cli("sim", "trtllm", "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == "1.3.0rc3"
    unknown = cli("sim", "tgi")
    assert unknown.returncode != 0 and "invalid choice: 'tgi'" in unknown.stderr
    assert all(kind in unknown.stderr for kind in registry.kinds())  # the choices are the registry's


def test_messages_name_it_from_its_folder() -> None:
    assert registry.display_name("trtllm") == "TensorRT-LLM"
    assert registry.DEFAULT_COMMANDS["trtllm"] == ("trtllm-serve", "serve")
    assert registry.DEVICES["trtllm"] == ("cuda",)
