"""Every SGLang release 0.5.9-0.5.23 recorded; the presets' version boundaries are the wheels' own; a host
whose version is unknown gets no guessed flags; the recorded choices are real values, not stubs."""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest

from tests.util import free_port
from workers.config import SEED_PRESETS_TOML, load_config, parse_config
from workers.engines.contract import CONTRACTS_DIR, all_contracts, load_contract, recorded_versions
from workers.engines.sglang.diagnosis import diagnose, flags_for_version
from workers.engines.version_spread import unknown_version_problems, version_ranges
from workers.engines.vllm import load_presets, preset_flags
from workers.presets import build_launch, check_launch
from workers.sim.flashinfer_arch import trtllm_moe_majors
from workers.sim.launcher import start_sim

ALL = [f"0.5.{n}" for n in range(9, 24)]
CONFIG = parse_config(
    """
[engine]
command = ["python3", "-m", "sglang.launch_server"]
model = "nvidia/Qwen3.5-397B-A17B-NVFP4"
flags = { "--tp-size" = 8, "--quantization" = "modelopt_fp4", "--disable-custom-all-reduce" = true }
[hosts.h]
port = 31000
"""
    + SEED_PRESETS_TOML
)
HOST = CONFIG.hosts["h"]


def test_every_release_from_0_5_9_to_0_5_23_is_recorded_from_its_wheel() -> None:
    assert set(ALL) <= set(recorded_versions("sglang"))
    for version in ALL:
        contract = load_contract("sglang", version)
        assert contract.recorded_from["wheel"].startswith(f"sglang-{version}-"), version
        assert len(contract.recorded_from["sha256"]) == 64


def test_the_recorder_records_a_range_in_one_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tools/record_sglang_contract.py 0.5.9..0.5.23``: every patch release between the ends, none skipped
    (the boundaries were once guessed from three recordings)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "tools"))
    recorder = importlib.import_module("record_sglang_contract")
    assert recorder.expand_versions(["0.5.9..0.5.23"]) == ALL
    assert recorder.expand_versions(["0.5.22", "0.5.21..0.5.23"]) == ["0.5.22", "0.5.21", "0.5.23"]
    for bad in ("0.5.23..0.5.9", "0.5.9..0.6.1", "0.5..0.5.3"):
        with pytest.raises(SystemExit):
            recorder.expand_versions([bad])
    sys.modules.pop("record_sglang_contract", None)


def test_the_boundaries_are_the_wheels_own() -> None:
    for version in ALL:
        c = load_contract("sglang", version)
        minor = int(version.split(".")[2])
        # --mamba-radix-cache-strategy appears in 0.5.14; the old name is its alias until 0.5.19, gone in 0.5.20
        assert (c.resolve("--mamba-radix-cache-strategy").kind == "exact") is (minor >= 14), version
        assert (c.resolve("--mamba-scheduler-strategy").kind == "exact") is (minor < 20), version
        # --cuda-graph-max-bs is exact until 0.5.19; split into -decode/-prefill it is ambiguous from 0.5.20
        assert c.resolve("--cuda-graph-max-bs").kind == ("exact" if minor < 20 else "ambiguous"), version
        assert (c.resolve("--cuda-graph-max-bs-decode").kind == "exact") is (minor >= 14), version


@pytest.mark.parametrize("version", ALL)
def test_every_seed_preset_and_nextn_parse_with_each_releases_parser(version: str) -> None:
    contract = load_contract("sglang", version)
    config = load_config(None)
    host = next(h for h in config.hosts.values() if h.engine.kind == "sglang")
    for word in config.presets:
        spec = build_launch(config, host, [word], version=version)
        assert [p for p in check_launch(spec, contract) if "--sim-" not in p] == [], (version, word)
    nextn = dict(build_launch(CONFIG, HOST, ["nextn"], version=version).flags)
    new = int(version.split(".")[2]) >= 14
    assert ("--mamba-radix-cache-strategy" in nextn) is new and ("--mamba-scheduler-strategy" in nextn) is not new


@pytest.mark.parametrize("contract", all_contracts("vllm"), ids=lambda c: c.version)
def test_every_vllm_preset_parses_with_each_recorded_vllm(contract) -> None:
    for word, preset in load_presets().items():
        flags = preset_flags(preset)
        assert contract.check_flags(flags) == [], (contract.version, word)


def test_no_recorded_choice_or_default_is_a_python_repr() -> None:
    """The vLLM recorder once filed a stub's repr as a choice of --mm-processor-device (``cuda`` refused)."""
    looks_like_repr = re.compile(r"^<.*>$|object at 0x|\bstub\b")
    for path in sorted(CONTRACTS_DIR.glob("*.json")):
        for option in json.loads(path.read_text())["parser"]["options"]:
            for choice in option.get("choices") or ():
                assert not looks_like_repr.search(str(choice)), (path.name, option["flags"], choice)
            assert not looks_like_repr.search(json.dumps(option.get("default"))), (path.name, option["flags"])


def test_vllm_0_34_takes_cuda_as_the_mm_processor_device() -> None:
    contract = load_contract("vllm", "0.34.0")
    assert contract.problem("--mm-processor-device", "cuda") is None
    assert contract.problem("--mm-processor-device", "tpu") is not None


# --------------------------------------------------------------------------------------------- unknown version


def test_an_unknown_version_refuses_the_flag_newer_releases_reject_naming_them() -> None:
    spec = build_launch(CONFIG, HOST, ["nextn"])  # no version: the base preset
    problems = unknown_version_problems(spec.flags, "sglang")
    assert len(problems) == 1, problems
    assert problems[0].startswith("--mamba-scheduler-strategy extra_buffer is refused by SGLang 0.5.20-")
    assert "0.5.9-0.5.19 accept it" in problems[0] and "has no option --mamba-scheduler-strategy" in problems[0]
    assert "version is unknown" in problems[0]


def test_an_unknown_version_passes_flags_every_release_accepts() -> None:
    spec = build_launch(CONFIG, HOST, [], raw_flags=[("--mem-fraction-static", "0.8")])
    assert unknown_version_problems(spec.flags, "sglang") == []
    spec = build_launch(CONFIG, HOST, [], raw_flags=[("--cuda-graph-max-bs", "128")])
    (problem,) = unknown_version_problems(spec.flags, "sglang")
    assert "is ambiguous in SGLang 0.5.20" in problem and "0.5.9-0.5.19 accept it" in problem


def test_version_ranges_join_neighbours() -> None:
    recorded = ["0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.13"]
    assert version_ranges(["0.5.9", "0.5.10", "0.5.12", "0.5.13"], recorded) == "0.5.9-0.5.10, 0.5.12-0.5.13"
    assert version_ranges(["0.5.11"], recorded) == "0.5.11"


def test_the_oom_hint_for_an_unknown_version_names_no_flag_a_release_refuses() -> None:
    log = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    found = diagnose(log, exited=True, returncode=1, timed_out=False, contract=None)
    assert found.category == "oom", found
    newest = all_contracts("sglang")
    for flag in re.findall(r"--[a-z0-9][a-z0-9-]*[a-z0-9](?![-\w])", found.summary):
        assert all(c.resolve(flag).kind == "exact" for c in newest if int(c.version.split(".")[2]) >= 14), flag
    assert not re.search(r"--cuda-graph-max-bs(?![-\w])", found.summary)
    hinted = flags_for_version("lower --cuda-graph-max-bs", None)
    assert hinted.startswith("lower --cuda-graph-max-bs-decode (SGLang 0.5.14+")


# --------------------------------------------------------------------------------------------- trtllm MoE on SM120


def test_trtllm_moe_builds_for_sm12_from_flashinfer_0_6_7() -> None:
    assert trtllm_moe_majors(load_contract("sglang", "0.5.9")) == (10,)  # FlashInfer 0.6.3
    for version in ALL[1:]:
        assert 12 in trtllm_moe_majors(load_contract("sglang", version)), version


def test_the_trtllm_preset_names_the_first_release_that_runs_it_on_sm120() -> None:
    """The seed's preset once said trtllm MoE dies on SM120 in every version; the pins say 0.5.10 on."""
    first_sm12 = next(v for v in ALL if 12 in trtllm_moe_majors(load_contract("sglang", v)))
    description = load_config(None).presets["trtllm"].description
    assert "SM120" in description and f"SGLang {first_sm12}" in description, description
    assert f"dies on SM120 with {ALL[0]}" in description  # and only there


def test_trtllm_moe_on_sm120_loads_on_0_5_23(tmp_path) -> None:
    log = tmp_path / "log.txt"
    env = {"BENCHBOT_SIM_SGLANG_VERSION": "0.5.23", "BENCHBOT_SIM_STATE_DIR": str(tmp_path)}
    argv = ["--model-path", "nvidia/Qwen3.5-397B-A17B-NVFP4", "--tp-size", "8", "--quantization", "modelopt_fp4"]
    with start_sim(free_port(), *argv, "--moe-runner-backend", "flashinfer_trtllm", env=env, log_path=log):
        pass
    assert "No supported CUDA architectures" not in log.read_text()
