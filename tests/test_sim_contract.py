"""The simulator speaks the recorded SGLang contract of the version it imitates: parser, --config, texts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workers.engines.contract import TextFieldMissing, load_contract, recorded_versions
from workers.sim import args as sim_args
from workers.sim import config_file, texts
from workers.sim.perf import PerfModel
from workers.sim.profile import load_profile, model_spec_for
from workers.sim.sglang import serve_argv

ROOT = Path(__file__).resolve().parents[1]
MODEL = "nvidia/Qwen3.5-397B-A17B-NVFP4"
BASE = [
    "--model-path",
    MODEL,
    "--tp",
    "8",
    "--moe-runner-backend",
    "flashinfer_cutlass",
    "--fp4-gemm-backend",
    "flashinfer_cudnn",
]
V9, V23 = "0.5.9", "0.5.23"


def _sim(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.sim.sglang", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**_base_env(), **(env or {})},
        timeout=60,
    )


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("BENCHBOT_SIM_", "SGLANG_"))}


def _resolve(argv: list[str], env: dict[str, str] | None = None) -> sim_args.Resolved:
    env = env or {}
    ns = sim_args.parse(argv, env)
    return sim_args.resolve(ns, load_profile("rtx-pro-6000-x8"), model_spec_for(ns.model_path), env)


# --------------------------------------------------------------------------------------------- versions


def test_version_flag_prints_the_imitated_version_and_exits_0() -> None:
    assert (_sim("--version").returncode, _sim("--version").stdout) == (0, "0.5.9\n")
    assert _sim("--sim-sglang-version", V23, "--version").stdout == "0.5.23\n"
    assert _sim("--version", env={"BENCHBOT_SIM_SGLANG_VERSION": V23}).stdout == "0.5.23\n"
    bad = _sim("--sim-sglang-version", "0.4.0", "--model-path", "m")
    assert bad.returncode == 2 and "not a recorded SGLang version" in bad.stderr and "0.5.23" in bad.stderr


def test_the_console_script_spellings_serve_and_version_are_sglangs() -> None:
    """``sglang version`` prints what the real one prints; ``sglang serve`` parses as launch_server does once
    its backend choice is taken out and a first plain word is read as the model (``sglang/cli/serve.py``)."""
    out = _sim("version", env={"BENCHBOT_SIM_SGLANG_VERSION": V23})
    assert (out.returncode, out.stdout) == (0, "sglang version: 0.5.23\ngit revision: N/A\n")
    assert sim_args.split_sim_args(serve_argv(["org/m", "--model-type", "llm", "--tp", "8"]), {})[1] == [
        "--model-path",
        "org/m",
        "--tp",
        "8",
    ]
    assert serve_argv(["--model-type=llm", "--model-path", "m"]) == ["--model-path", "m"]
    bad = _sim("serve", "m", "--no-such-flag")  # the real parser's refusal, as launch_server would give it
    assert bad.returncode == 2 and "--no-such-flag" in bad.stderr


def test_each_version_parses_with_its_own_real_parser() -> None:
    """Prog, renamed flags, prefix ambiguity and error texts are the real ones, exit 2."""
    old = _sim("--model-path", "m", "--mamba-radix-cache-strategy", "extra_buffer")
    assert old.returncode == 2
    assert "launch_server.py: error: unrecognized arguments: --mamba-radix-cache-strategy extra_buffer" in old.stderr
    new = _sim("--sim-sglang-version", V23, "--model-path", "m", "--mamba-scheduler-strategy", "extra_buffer")
    assert new.returncode == 2
    assert "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer" in new.stderr
    amb = _sim("--sim-sglang-version", V23, "--model-path", "m", "--cuda-graph-max-bs", "16")
    assert amb.returncode == 2 and "ambiguous option: --cuda-graph-max-bs could match" in amb.stderr
    for version in (V9, V23):
        pp = _sim("--sim-sglang-version", version, "--model-path", "m", "--pp", "2")
        assert pp.returncode == 2 and "ambiguous option: --pp could match" in pp.stderr, version
    ns = sim_args.parse([*BASE, "--cuda-graph-max-bs", "16"], {})
    assert ns.tp_size == 8 and ns.cuda_graph_max_bs == 16 and ns.fp4_gemm_runner_backend == "flashinfer_cudnn"
    ns = sim_args.parse([*BASE, "--cuda-graph-max-bs-decode", "16", "--sim-sglang-version", V23], {})
    assert ns.tp_size == 8 and ns.cuda_graph_max_bs == 16 and ns.cuda_graph_max_bs_decode == 16


def test_sim_options_are_parsed_apart_and_never_abbreviated() -> None:
    ns = sim_args.parse([*BASE, "--sim-seed", "7", "--sim-load-s", "2.5"], {"BENCHBOT_SIM_STARTUP_S": "0.25"})
    assert (ns.sim_seed, ns.sim_load_s, ns.sim_startup_s) == (7, 2.5, 2.5)  # start-up covers the load at least
    assert sim_args.parse(["--model-path", "m"], {"BENCHBOT_SIM_LOAD_S": "4"}).sim_load_s == 4.0
    assert sim_args.parse(["--model-path", "m"], {"BENCHBOT_SIM_STARTUP_S": "2"}).sim_load_s == pytest.approx(1.8)
    out = _sim("--model-path", "m", "--sim-see", "3")  # a prefix of a sim flag is not that flag
    assert out.returncode == 2 and "unrecognized arguments: --sim-see 3" in out.stderr
    assert not hasattr(sim_args.parse(["--model-path", "m"], {}), "sim_see")


# --------------------------------------------------------------------------------------------- --config


def test_config_file_merges_like_sglang_and_the_command_line_wins(tmp_path: Path) -> None:
    cfg = tmp_path / "launch.yaml"
    cfg.write_text(
        "# the seed's baseline\n"
        "model-path: nvidia/Qwen3.5-397B-A17B-NVFP4\n"
        "tp-size: 8\n"
        "enable-metrics: true   # store_true: the bare flag\n"
        "disable-radix-cache: false\n"
        "api-key: 's3cret#1'\n"
        "mem-fraction-static: 0.8\n"
        "json-model-override-args: {rope_theta: 1000000}\n"
        "speculative-algorithm: NEXTN\n"
    )
    ns = sim_args.parse(["--config", str(cfg), "--mem-fraction-static", "0.7"], {})
    assert ns.model_path == MODEL and ns.tp_size == 8 and ns.enable_metrics is True and ns.api_key == "s3cret#1"
    assert ns.disable_radix_cache is False and ns.mem_fraction_static == 0.7  # CLI > config
    assert ns.json_model_override_args == "{'rope_theta': 1000000}"  # 0.5.9 writes str(dict)
    new = sim_args.parse(["--config", str(cfg), "--sim-sglang-version", V23], {})
    assert new.json_model_override_args == '{"rope_theta": 1000000}' and new.tp_size == 8  # 0.5.23: json.dumps
    contract = load_contract("sglang", V9)
    assert config_file.config_flags(contract, {"tp_size": 8}) == ["--tp_size", "8"]  # the key is used as written
    block = config_file.load_yaml("lora-target-modules:\n  - q_proj\n  - v_proj\nx: [1, 2.5, 'a']\ny: ~\nz: yes\n")
    assert block == {"lora-target-modules": ["q_proj", "v_proj"], "x": [1, 2.5, "a"], "y": None, "z": True}


@pytest.mark.parametrize(
    ("version", "yaml", "message"),
    [
        (
            V9,
            "prefill-round-robin-balance: true\n",
            "Unsupported config option 'prefill_round_robin_balance' with action 'DeprecatedAction'",
        ),
        (
            V23,
            "disable-cuda-graph: true\n",
            "Unsupported config option 'disable_cuda_graph' with action 'DeprecatedStoreTrueAction'",
        ),
        (V9, "- just\n- a list\n", "Config file must contain a dictionary at root level"),
    ],
)
def test_config_file_errors_are_sglangs(tmp_path: Path, version: str, yaml: str, message: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml)
    out = _sim("--sim-sglang-version", version, "--model-path", "m", "--config", str(cfg))
    assert out.returncode == 1 and f"ValueError: {message}" in out.stderr
    assert "Traceback (most recent call last)" in out.stderr


def test_config_file_path_checks() -> None:
    contract = load_contract("sglang", V9)
    with pytest.raises(config_file.ConfigFileError, match=r"Config file must be YAML format, got: \.toml"):
        config_file.merge_config(contract, ["--config", "x.toml"])
    with pytest.raises(config_file.ConfigFileError, match=r"Config file not found: nope\.yaml"):
        config_file.merge_config(contract, ["--config", "nope.yaml"])
    with pytest.raises(config_file.ConfigFileError, match="No config file specified after --config flag!"):
        config_file.merge_config(contract, ["--model-path", "m", "--config"])
    with pytest.raises(config_file.ConfigFileError, match="Multiple config files specified"):
        config_file.merge_config(contract, ["--config", "a.yaml", "--config", "b.yaml"])


# --------------------------------------------------------------------------------------------- resolution


def test_resolution_follows_each_wheel() -> None:
    # 0.5.9: the hybrid model's mamba cache defaults to no_buffer, which turns overlap off (a warning)
    base = _resolve(BASE)
    assert base.args.mamba_scheduler_strategy == "no_buffer" and base.args.disable_overlap_schedule is True
    assert any("Disabling overlap schedule since mamba no_buffer" in w for w in base.early)
    assert base.server_args["context_length"] is None and base.server_args["max_running_requests"] is None
    assert base.server_args["mem_fraction_static"] == 0.848 and "tp_size" in base.server_args
    # 0.5.9 NEXTN without extra_buffer: radix cache off (a warning), not an error
    nextn = _resolve([*BASE, "--speculative-algorithm", "NEXTN"], {"SGLANG_ENABLE_SPEC_V2": "1"})
    assert nextn.error is None and nextn.args.disable_radix_cache is True
    assert nextn.server_args["speculative_algorithm"] == "EAGLE" and nextn.server_args["max_running_requests"] == 48
    assert (
        nextn.args.speculative_num_steps,
        nextn.args.speculative_eagle_topk,
        nextn.args.speculative_num_draft_tokens,
    ) == (3, 1, 4)
    assert nextn.args.disable_overlap_schedule is False and nextn.server_args["mem_fraction_static"] == 0.827
    v1 = _resolve([*BASE, "--speculative-algorithm", "NEXTN", "--mamba-scheduler-strategy", "extra_buffer"])
    assert v1.spec_v2 is False and v1.args.disable_overlap_schedule is True
    # 0.5.23: spec v2 always, the mamba strategy follows overlap (extra_buffer), no +2 GB for the draft
    new = _resolve(
        [*BASE, "--speculative-algorithm", "NEXTN", "--sim-sglang-version", V23], {"SGLANG_ENABLE_SPEC_V2": "0"}
    )
    assert new.spec_v2 is True and new.args.disable_overlap_schedule is False and new.error is None
    assert new.server_args["mamba_radix_cache_strategy"] == "extra_buffer" and "mamba_scheduler_strategy" not in (
        new.server_args
    )
    assert new.server_args["mem_fraction_static"] == 0.848 and new.server_args["max_running_requests"] == 48
    assert set(new.server_args) == set(load_contract("sglang", V23).server_args_fields)


@pytest.mark.parametrize(
    ("argv", "env", "kind", "text_key"),
    [
        (
            [
                "--speculative-algorithm",
                "NEXTN",
                "--speculative-eagle-topk",
                "2",
                "--speculative-num-steps",
                "3",
                "--speculative-num-draft-tokens",
                "6",
            ],
            {"SGLANG_ENABLE_SPEC_V2": "1"},
            "ValueError",
            "spec_v2_topk",
        ),
        (["--attention-backend", "trtllm_mha"], {}, "ValueError", "trtllm_mha_sm100"),
        (
            [
                "--speculative-algorithm",
                "NEXTN",
                "--mamba-scheduler-strategy",
                "extra_buffer",
                "--mamba-track-interval",
                "2",
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "4",
            ],
            {},
            "AssertionError",
            "mamba_track_interval_draft",
        ),
        (["--speculative-algorithm", "NEXTN", "--speculative-eagle-topk", "1"], {}, "AssertionError", None),
    ],
)
def test_config_errors_carry_the_recorded_text(argv: list[str], env: dict, kind: str, text_key: str | None) -> None:
    res = _resolve([*BASE, *argv], env)
    assert res.error is not None and res.error.kind == kind
    if text_key:
        assert res.error.message == load_contract("sglang", V9).text(text_key)


def test_trtllm_mha_on_sm120_follows_each_version() -> None:
    """0.5.9 refuses it off SM100; 0.5.23 runs it on SM120 except with an fp8_e4m3 KV cache (wheel text)."""
    flags = [*BASE, "--attention-backend", "trtllm_mha"]
    assert _resolve(flags).error is not None
    assert _resolve([*flags, "--sim-sglang-version", V23]).error is None
    fp8 = _resolve([*flags, "--kv-cache-dtype", "fp8_e4m3", "--sim-sglang-version", V23]).error
    assert fp8 is not None and fp8.message == load_contract("sglang", V23).text("trtllm_mha_sm120_fp8_kv")


def test_perf_model_calibration_is_exact() -> None:
    """The seed baseline decodes at 72.0 tok/s on 0.5.9 (overlap off there), NEXTN at 2.04x of it."""

    def perf(argv: list[str], env: dict[str, str] | None = None) -> PerfModel:
        res = _resolve(argv, env)
        return PerfModel(res.args, load_profile("rtx-pro-6000-x8"), model_spec_for(MODEL))

    base = perf([*BASE, "--disable-custom-all-reduce"])
    nextn = perf(
        [
            *BASE,
            "--disable-custom-all-reduce",
            "--speculative-algorithm",
            "NEXTN",
            "--mamba-scheduler-strategy",
            "extra_buffer",
        ],
        {"SGLANG_ENABLE_SPEC_V2": "1"},
    )
    assert base.single_stream_tok_s() == pytest.approx(72.0, abs=0.01)
    assert nextn.single_stream_tok_s() / base.single_stream_tok_s() == pytest.approx(2.04, abs=0.005)
    newer = perf([*BASE, "--disable-custom-all-reduce", "--sim-sglang-version", V23])
    assert newer.single_stream_tok_s() > base.single_stream_tok_s()  # extra_buffer keeps overlap on


# --------------------------------------------------------------------------------------------- texts


@pytest.mark.parametrize("version", recorded_versions("sglang"))
def test_every_template_reproduces_the_recorded_text(version: str) -> None:
    """The recorder keeps each literal's template beside its text: filled with its samples it is the text."""
    contract = load_contract("sglang", version)
    templated = [e for e in contract.texts.values() if e is not None and e.template is not None]
    assert len(templated) > 20
    for entry in templated:
        assert entry.sample() == entry.text, (version, entry.key)


def test_the_sim_renders_recorded_templates_with_its_own_values() -> None:
    c9, c23 = load_contract("sglang", V9), load_contract("sglang", V23)
    # 0.5.9 writes f"...{self.server_args.mem_fraction_static=}": the name, then repr of the value
    assert texts.say(c9, "kv_pool_too_small", mem_fraction_static=0.25).endswith(
        "Current value: self.server_args.mem_fraction_static=0.25"
    )
    # 0.5.23 raises the first literal and appends the value as a second one
    assert (
        texts.say(c23, "kv_pool_too_small")
        + texts.say(c23, "kv_pool_current_value", mem_fraction_static=0.25)
        == "Not enough memory. Please try to increase --mem-fraction-static. Current value: "
        "mem_fraction_static=0.25"
    )
    assert not texts.has(c9, "kv_pool_current_value")
    assert (
        texts.say(c9, "internal_port_wait", port=30234, i=15, port_name="dist_init_port", error_message="")
        == "port 30234 is in use. Waiting for 15 seconds for dist_init_port to be available. "
    )
    assert texts.say(c23, "http_port_in_use", pyaddr=("0.0.0.0", 8000)) == (
        "[Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use"
    )
    assert texts.say(c9, "ready") == c9.ready_line
    with pytest.raises(TextFieldMissing):
        texts.say(c9, "kv_pool_too_small")  # a value the text needs is a bug in the sim, not a sample value
    with pytest.raises(texts.TextMissing):
        texts.say(c23, "spec_v2_topk")  # that error does not exist there


def test_every_text_the_sim_says_is_recorded() -> None:
    """The sim names texts by contract key only; each key it uses is recorded for a version it imitates."""
    said = set()
    for path in (ROOT / "workers" / "sim").glob("*.py"):
        said |= set(re.findall(r'texts\.(?:say|has)\(\s*[\w.]+,\s*"(\w+)"', path.read_text()))
    assert {"kv_pool_too_small", "cuda_graph_capture_hint", "http_port_in_use", "internal_port_wait"} <= said
    for key in said:
        assert any(load_contract("sglang", v).text(key) for v in (V9, V23)), key
    hint9 = texts.say(load_contract("sglang", V9), "cuda_graph_capture_hint")
    hint23 = texts.say(load_contract("sglang", V23), "cuda_graph_capture_hint")
    assert "--cuda-graph-max-bs to" in hint9 and "--cuda-graph-max-bs-decode to" in hint23


def test_server_args_line_and_info_keys_follow_the_contract() -> None:
    res = _resolve([*BASE, "--api-key", "k"])
    fields = load_contract("sglang", V9).server_args_fields
    assert list(res.server_args) == list(fields)
    assert json.dumps(res.server_args, default=str)
