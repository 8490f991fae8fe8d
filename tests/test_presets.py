"""Preset words -> engine argv/env: groups, removals, conflicts, requirements, reserved flags."""

from __future__ import annotations

import pytest

from workers.config import parse_config
from workers.errors import BenchbotError
from workers.presets import LaunchSpec, build_launch, check_raw_flag, flags_to_argv, merge_flags


@pytest.fixture
def config():
    return parse_config("""
[engine]
command = ["python3", "-m", "sglang.launch_server"]
model = "m"
flags = { "--tp-size" = 8, "--disable-custom-all-reduce" = true }
env = { A = "1" }
[hosts.h]
port = 31000
[presets.cutlass]
group = "moe"
flags = { "--moe-runner-backend" = "flashinfer_cutlass" }
[presets.trtllm]
group = "moe"
flags = { "--moe-runner-backend" = "flashinfer_trtllm" }
[presets.customar]
remove = ["--disable-custom-all-reduce"]
[presets.nextn]
flags = { "--speculative-algorithm" = "NEXTN", "--speculative-eagle-topk" = 1 }
env = { SGLANG_ENABLE_SPEC_V2 = "1" }
[presets.topk2]
flags = { "--speculative-eagle-topk" = 2 }
requires = ["nextn"]
[presets.slow]
flags = { "--disable-cuda-graph" = true }
conflicts = ["nextn"]
""")


def test_argv_is_command_model_base_presets_then_raw_flags(config):
    spec = build_launch(config, config.hosts["h"], ["cutlass", "nextn"], [("--mem-fraction-static", "0.8")])
    assert spec.argv == (
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        "31000",
        "--tp-size",
        "8",
        "--disable-custom-all-reduce",
        "--moe-runner-backend",
        "flashinfer_cutlass",
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-eagle-topk",
        "1",
        "--mem-fraction-static",
        "0.8",
    )
    assert dict(spec.env) == {"A": "1", "SGLANG_ENABLE_SPEC_V2": "1"}
    assert spec.label == "cutlass nextn --mem-fraction-static 0.8"


def test_a_preset_removes_a_base_flag(config):
    spec = build_launch(config, config.hosts["h"], ["customar"])
    assert "--disable-custom-all-reduce" not in spec.argv


def test_later_layers_override_and_raw_flags_win(config):
    spec = build_launch(config, config.hosts["h"], ["nextn", "topk2"], [("--tp-size", "4")])
    flags = dict(spec.flags)
    assert flags["--speculative-eagle-topk"] == "2"
    assert flags["--tp-size"] == "4"
    assert spec.argv.count("--tp-size") == 1


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["cutlass", "trtllm"], '"cutlass" and "trtllm" are both moe presets'),
        (["nextn", "nextn"], "given twice"),
        (["topk2"], '"topk2" needs "nextn"'),
        (["nextn", "slow"], '"slow" cannot be combined with "nextn"'),
        (["cutlas"], 'unknown preset "cutlas" (did you mean "cutlass"?)'),
    ],
)
def test_invalid_preset_combinations_are_refused(config, words, message):
    with pytest.raises(BenchbotError) as info:
        build_launch(config, config.hosts["h"], words)
    assert message in str(info.value)


@pytest.mark.parametrize("flag", ["--port", "--host", "--por", "--hos", "--api-key", "--config"])
def test_flags_set_from_the_host_config_cannot_be_overridden(config, flag):
    with pytest.raises(BenchbotError, match="set by benchbot from the host config"):
        build_launch(config, config.hosts["h"], [], [(flag, "1")])


@pytest.mark.parametrize("flag", ["--model-path", "--model", "--model-pat", "--trust-remote-code", "--revision"])
def test_model_and_remote_code_flags_are_admin_only(flag):
    # Changed with the reserved-flag rework: the model is no longer refused outright; an admin may change it
    # (the dispatcher calls check_raw_flag with the requester's role).
    with pytest.raises(BenchbotError, match="only an admin may give it"):
        check_raw_flag(flag, admin=False)
    check_raw_flag(flag, admin=True)


@pytest.mark.parametrize("flag", ["--model-path", "--model", "--model-pat"])
def test_an_admins_model_replaces_the_configured_one(config, flag):
    spec = build_launch(config, config.hosts["h"], [], [(flag, "other/model")])
    assert "m" not in spec.argv and spec.argv.count("other/model") == 1
    assert [f for f, _ in spec.flags if f.startswith("--model")] == [flag]


def test_a_prefix_replaces_the_base_flag_it_means(config):
    spec = build_launch(config, config.hosts["h"], [], [("--tp", "4")])
    assert ("--tp", "4") in spec.flags and "--tp-size" not in spec.argv


def test_launch_spec_round_trips_through_json(config):
    import json

    spec = build_launch(config, config.hosts["h"], ["cutlass", "nextn"], [("--enable-metrics", True)])
    again = LaunchSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec


def test_merge_and_argv_helpers():
    merged = merge_flags([("--a", "1"), ("--b", True)], [([("--c", "x")], ["--b"]), ([("--a", "2")], [])])
    assert merged == [("--c", "x"), ("--a", "2")]
    assert flags_to_argv(merged) == ["--c", "x", "--a", "2"]
