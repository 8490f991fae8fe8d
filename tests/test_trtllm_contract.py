"""TensorRT-LLM's recorded contract holds benchbot's TensorRT-LLM presets (issue 21).

Every packaged preset must name an exact ``trtllm-serve serve`` option or a recorded ``--config`` YAML key,
with a value it accepts, in every recorded version; compiled, its YAML document must be one the recorded LLM
API accepts (the simulator's check: pydantic's ``extra = "forbid"`` over the recorded fields, and the
recorded speculative decoding types). The contract itself must say what it was recorded from.
"""

from __future__ import annotations

import pytest

from workers.config import parse_config
from workers.engines.contract import all_contracts
from workers.engines.trtllm import load_presets
from workers.engines.trtllm.flags import cli_options, split_launch, yaml_keys
from workers.presets import build_launch, check_launch, preset_layers
from workers.sim.trtllm import LlmArgsError, check_llm_args

CONTRACTS = all_contracts("trtllm")
PRESETS = load_presets()
#: A config with one simulated TensorRT-LLM host (the packaged presets are its words).
TRTLLM_CONFIG = """
[hosts.trt-1]
[hosts.trt-1.engine]
kind = "trtllm"
command = ["{python}", "-m", "workers.sim.trtllm", "serve"]
flags = { "--tp_size" = 8 }
"""


def test_a_contract_is_recorded_from_the_source_with_its_commit() -> None:
    assert CONTRACTS, "no workers/engines/contracts/trtllm-*.json"
    for contract in CONTRACTS:
        origin = contract.recorded_from
        assert origin["commit"] and origin["source"] and origin["files_sha256"]
        assert contract.prog == "trtllm-serve serve" and contract.allow_abbrev is False
        assert contract.positionals == ("model",)


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.label() for c in CONTRACTS])
@pytest.mark.parametrize("word", sorted(PRESETS))
def test_every_preset_parses_with_the_recorded_contract(contract, word: str) -> None:
    flags = [(flag, True if value is True else str(value)) for flag, value in PRESETS[word]["flags"].items()]
    problems = contract.check_flags(flags)
    assert not problems, [p.message for p in problems]
    for flag, _value in flags:
        assert contract.resolve(flag).kind == "exact", f"{word}: {flag} must be written whole"
    argv_flags, document = split_launch(flags, contract)
    check_llm_args(document, contract)  # raises LlmArgsError where TorchLlmArgs would refuse it
    real = {f for o in cli_options(contract) for f in o.flags}
    assert all(flag in real for flag, _ in argv_flags)


def test_the_recorded_choices_are_the_sources() -> None:
    contract = CONTRACTS[-1]
    moe = contract.resolve("--moe_config.backend").option
    assert moe is not None and {"CUTLASS", "TRTLLM", "DEEPGEMM", "AUTO"} <= set(moe.choices or ())
    backend = contract.resolve("--backend").option
    assert backend is not None and {"pytorch", "tensorrt", "_autodeploy", "trt"} == set(backend.choices or ())
    spec = contract.resolve("--speculative_config.decoding_type").option
    assert spec is not None and {"MTP", "Eagle3", "NGram"} <= set(spec.choices or ())
    assert contract.resolve("--tp_size").option is contract.resolve("--tensor_parallel_size").option
    assert contract.resolve("--tp-size").kind == "unknown"  # click keeps underscores and matches exactly
    assert contract.resolve("--tp").kind == "unknown"  # no prefixes either
    assert "--moe_config.backend" in yaml_keys(contract.version)
    assert contract.ready_line == "Application startup complete."


def test_a_preset_the_contract_refuses_is_caught() -> None:
    contract = CONTRACTS[-1]
    (problem,) = contract.check_flags([("--moe_config.backend", "FLASHINFER")])
    assert "accepts only" in problem.message and "CUTLASS" in problem.message
    with pytest.raises(LlmArgsError, match="Extra inputs are not permitted"):
        check_llm_args({"moe_config": {"kernel": "x"}}, contract)
    with pytest.raises(LlmArgsError, match="Invalid decoding type: Nope"):
        check_llm_args({"speculative_config": {"decoding_type": "Nope"}}, contract)


def test_a_launch_compiles_to_trtllm_serve_argv_and_a_yaml_document() -> None:
    config = parse_config(TRTLLM_CONFIG)
    host = config.hosts["trt-1"]
    spec = build_launch(config, host, ["moe-cutlass", "mtp", "kv85", "adp"], [("--max_batch_size", "64")])
    argv = list(spec.argv)
    assert argv[argv.index("serve") + 1] == host.engine.model
    assert argv[argv.index("--kv_cache_free_gpu_memory_fraction") + 1] == "0.85"
    assert not any("." in word and word.startswith("--") for word in argv)  # YAML keys never reach argv
    assert check_launch(spec, CONTRACTS[-1]) == []
    _, document = split_launch(spec.flags, CONTRACTS[-1])
    assert document == {
        "moe_config": {"backend": "CUTLASS"},
        "speculative_config": {"decoding_type": "MTP", "num_nextn_predict_layers": 3},
        "enable_attention_dp": True,
    }
    assert spec.settings == document  # what the worker writes into benchbot's --config file
    assert ("--moe_config.backend", "CUTLASS") in spec.flags  # checked, requested and diffed like any flag
    assert preset_layers(config.presets_for("trtllm")["tp8"], None)[0][0] == (("--tp_size", "8"),)
