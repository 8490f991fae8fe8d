"""The TensorRT-LLM driver behind the engine interface (issue 21): its diagnosis rules on the recorded texts,
recognition on real process-table shapes, the version probe, and what it reads back from a process.
"""

from __future__ import annotations

import json

import pytest

from workers.config import parse_config
from workers.engines import probe, processes
from workers.engines.contract import all_contracts
from workers.engines.diagnosis import diagnose, match_rule
from workers.engines.interface import SETTINGS_UNREAD_ARG
from workers.engines.registry import driver_for, kinds
from workers.engines.trtllm import diagnosis as trtllm_diagnosis
from workers.engines.trtllm import flags
from workers.engines.trtllm import probe as trtllm_probe
from workers.errors import ConfigError
from workers.observation import ServerView

CONTRACTS = all_contracts("trtllm")
RULE_TEXTS = sorted({key for rule in trtllm_diagnosis.RULES for key in rule.texts})
#: click's texts are recorded as the format strings click fills (``No such option {name!r}.``)
CLICK_SAMPLES = {
    "name": "--tp-size",
    "param_hint": "'--backend'",
    "message": "'x' is not one of 'pytorch', 'tensorrt', '_autodeploy'.",
}


def _rendered(key: str, text: str) -> str:
    text = text.format(**CLICK_SAMPLES) if key.startswith("click_") else text
    return f"{text} 'MODEL'." if key == "click_missing_argument" else text


# ------------------------------------------------------------------ diagnosis rules vs the recorded texts


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.version for c in CONTRACTS])
@pytest.mark.parametrize("key", RULE_TEXTS)
def test_every_trtllm_rule_matches_the_recorded_text_and_wins(contract, key):
    entry = contract.texts.get(key)
    if entry is None or entry.text is None:
        pytest.skip(f"{key}: not recorded in TensorRT-LLM's source (huggingface_hub's wording)")
    text = _rendered(key, entry.log_line or entry.text)
    found = match_rule(text, rules=trtllm_diagnosis.RULES)
    assert found is not None, (key, text)
    rule, _ = found
    assert key in rule.texts, f"{key} is explained by another rule ({rule.texts})"


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.version for c in CONTRACTS])
def test_texts_of_a_healthy_start_never_end_a_wait(contract):
    for key in trtllm_diagnosis.BENIGN_TEXTS:
        text = contract.text(key)
        assert text is not None, key
        assert match_rule(text, fatal_only=True, rules=trtllm_diagnosis.RULES) is None, key


def test_a_trtllm_moe_on_sm120_is_diagnosed_as_the_gpu_once_the_process_exits():
    contract = CONTRACTS[-1]
    reason = contract.texts["trtllm_moe_needs_sm100"].render({"sm_version": 120})
    log = f"[TRT-LLM] [W] {reason}\nTraceback (most recent call last):\nRuntimeError: {reason}\n"
    while_loading = diagnose(
        log,
        exited=False,
        returncode=None,
        timed_out=False,
        contract=contract,
        rules=trtllm_diagnosis.RULES,
        engine="TensorRT-LLM",
    )
    assert while_loading is None or while_loading.category != "unsupported_gpu"  # a warning alone ends no wait
    found = diagnose(
        log,
        exited=True,
        returncode=1,
        timed_out=False,
        contract=contract,
        rules=trtllm_diagnosis.RULES,
        engine="TensorRT-LLM",
    )
    assert found.category == "unsupported_gpu" and "SM120" in found.summary and "CUTLASS" in found.summary


def test_an_unknown_option_names_trtllm_serves_spelling():
    text = CONTRACTS[-1].text("click_no_such_option").format(name="--tp-size")
    found = diagnose(
        f"Usage: trtllm-serve serve [OPTIONS] MODEL\n\nError: {text}\n",
        exited=True,
        returncode=2,
        timed_out=False,
        contract=CONTRACTS[-1],
        rules=trtllm_diagnosis.RULES,
        engine="TensorRT-LLM",
    )
    assert found.category == "config_error" and "--tp-size" in found.summary and "--tp_size" in found.summary


# ------------------------------------------------------------------ recognition on real process-table shapes


@pytest.mark.parametrize(
    ("argv", "kind", "port"),
    [
        # the console script as typed, and as the kernel shows it once its shebang ran it
        (["/venv/bin/trtllm-serve", "serve", "/models/q", "--port", "8123"], "trtllm", 8123),
        (["/venv/bin/python3", "/venv/bin/trtllm-serve", "serve", "/models/q", "--tp_size", "8"], "trtllm", 8000),
        (["python3", "-u", "/usr/local/bin/trtllm-serve", "/models/q", "--port=9000"], "trtllm", 9000),
        # without `serve`: the group's default command
        (["trtllm-serve", "nvidia/Qwen3-8B", "--backend", "pytorch"], "trtllm", 8000),
        (["/usr/bin/python3.12", "-m", "tensorrt_llm.commands.serve", "serve", "m", "--port", "8500"], "trtllm", 8500),
        (["/venv/bin/python", "-m", "workers.sim.trtllm", "serve", "m", "--port", "8001"], "trtllm-sim", 8001),
        (["benchbot", "sim", "trtllm", "serve", "m"], "trtllm-sim", 8000),
        # not model servers: other sub-commands, the launcher script, MPI ranks, an editor on the script
        (["/venv/bin/python3", "/venv/bin/trtllm-serve", "disaggregated", "-c", "disagg.yaml"], None, 8000),
        (["trtllm-serve", "mm_embedding_serve", "m"], None, 8000),
        (["trtllm-serve", "--tp_size", "8", "m"], None, 8000),
        (["/bin/bash", "/venv/bin/trtllm-llmapi-launch", "trtllm-serve", "m"], None, 8000),
        (["/venv/bin/python3", "-m", "mpi4py.futures.server"], None, 8000),
        (["vim", "/venv/bin/trtllm-serve"], None, 8000),
        (["trtllm-bench", "--model", "m", "throughput"], None, 8000),
    ],
)
def test_trtllm_processes_are_identified_and_nothing_else(argv, kind, port):
    assert processes.engine_kind(argv) == kind
    if kind is not None:
        assert processes.engine_port(argv, kind) == port


def test_the_version_probe_asks_the_engines_own_python():
    script = trtllm_probe.VERSION_SCRIPT
    assert "tensorrt_llm" in script and "import tensorrt_llm" not in script
    assert probe.version_argv(["/venv/bin/trtllm-serve", "serve"]) == ["/venv/bin/python3", "-c", script]
    assert probe.version_argv(["/venv/bin/python3", "/venv/bin/trtllm-serve", "serve"]) == [
        "/venv/bin/python3",
        "-c",
        script,
    ]
    assert probe.version_argv(["python3", "-m", "tensorrt_llm.commands.serve", "serve"]) == ["python3", "-c", script]
    assert probe.version_argv(["trtllm-serve", "serve"]) is None  # no interpreter to ask: version_command says
    assert probe.version_argv(["python", "-m", "workers.sim.trtllm", "serve"]) == [
        "python",
        "-m",
        "workers.sim.trtllm",
        "--version",
    ]


# ------------------------------------------------------------------ the driver


def test_trtllm_is_a_registered_kind_with_its_own_driver():
    assert "trtllm" in kinds()
    assert driver_for("trtllm").name == "TensorRT-LLM" and driver_for("trtllm-sim") is driver_for("trtllm")
    with pytest.raises(ConfigError, match="trtllm"):
        driver_for("tgi")


def _view(args: dict[str, object]) -> ServerView:
    return ServerView(CONTRACTS[-1].version, args, "/m", "/m", None, None, None)


ARGV = ["/venv/bin/python3", "/venv/bin/trtllm-serve", "serve", "/m", "--tp_size", "8", "--port", "8123"]


def test_observed_args_are_trtllms_own_names_and_the_fingerprint_ignores_where_it_listens():
    contract = CONTRACTS[-1]
    args = flags.observed_args([*ARGV, "--config", "/run/benchbot/x.yaml"], contract)
    assert args["tensor_parallel_size"] == 8 and args["model"] == "/m" and args["port"] == 8123
    assert args["free_gpu_memory_fraction"] == 0.9 and args["backend"] == "pytorch"  # recorded defaults
    driver = driver_for("trtllm")
    moved = flags.observed_args([*ARGV[:-1], "9000", "--config", "/elsewhere.yaml"], contract)
    assert driver.fingerprint(_view(args)) == driver.fingerprint(_view(moved))
    wider = flags.observed_args([*ARGV[:4], "4", *ARGV[5:]], contract)
    assert driver.fingerprint(_view(args)) != driver.fingerprint(_view(wider))
    assert driver.describe(_view(args), {}) == "TensorRT-LLM pytorch, TP8, KV 0.9 of free memory, max batch 2048"


def test_the_config_files_settings_are_read_back_in_the_names_a_launch_requests_them():
    contract = CONTRACTS[-1]
    argv_flags, document = flags.split_for(
        [
            ("--tp_size", "8"),
            ("--moe_config.backend", "CUTLASS"),
            ("--speculative_config.num_nextn_predict_layers", "3"),
        ],
        contract.version,
    )
    assert argv_flags == [("--tp_size", "8")]
    read = flags.read_settings(json.dumps(document))  # the file as benchbot writes it
    requested = flags.requested_args(
        {"--moe_config.backend": "CUTLASS", "--speculative_config.num_nextn_predict_layers": "3"}, contract
    )
    assert read == requested == {"moe_config.backend": "CUTLASS", "speculative_config.num_nextn_predict_layers": 3}
    for text in ("moe_config:\n  backend: CUTLASS\n", "[1, 2]", ""):  # hand-written YAML is not benchbot's file
        with pytest.raises(ValueError):
            flags.read_settings(text)


def test_two_servers_differing_only_in_their_config_file_fingerprint_apart_and_say_so():
    contract = CONTRACTS[-1]
    args = flags.observed_args([*ARGV, "--config", "/x"], contract)
    driver = driver_for("trtllm")
    cutlass = {**args, "moe_config.backend": "CUTLASS", "speculative_config.decoding_type": "MTP"}
    deepgemm = {**args, "moe_config.backend": "DEEPGEMM", "speculative_config.decoding_type": "MTP"}
    assert driver.fingerprint(_view(cutlass)) != driver.fingerprint(_view(deepgemm))
    assert driver.describe(_view(cutlass), {}) == (
        "TensorRT-LLM pytorch, TP8, KV 0.9 of free memory, max batch 2048; from its --config file: MoE CUTLASS, MTP"
    )
    # a file that could not be read back never passes for a launch without one
    unread = {**args, SETTINGS_UNREAD_ARG: "gone"}
    assert driver.fingerprint(_view(unread)) != driver.fingerprint(_view(args))
    assert driver.describe(_view(unread), {}).endswith("; its --config file not read back (gone)")


def test_an_api_key_is_refused_on_a_trtllm_host():
    text = '[hosts.trt-1]\n[hosts.trt-1.engine]\nkind = "trtllm"\napi_key_env = "K"\n'
    with pytest.raises(
        ConfigError, match=r"hosts\.trt-1\.engine\.api_key_env: TensorRT-LLM's server checks no API key"
    ):
        parse_config(text)
    parse_config(text.replace('api_key_env = "K"\n', ""))  # the same host without it loads
