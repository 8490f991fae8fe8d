"""The recorded SGLang contracts: flag resolution as argparse does it, and the parser rebuilt from them."""

from __future__ import annotations

import pytest

from workers.config import load_config
from workers.engines.contract import (
    UnknownVersion,
    check_version_spec,
    load_contract,
    parse_version,
    recorded_versions,
    version_matches,
)
from workers.presets import build_launch

V9, V23 = "0.5.9", "0.5.23"


def test_both_versions_the_issue_names_are_recorded_with_their_source() -> None:
    assert {V9, V23} <= set(recorded_versions())
    for version in (V9, V23):
        c = load_contract("sglang", version)
        assert c.version == version and c.recorded_from["wheel"].startswith(f"sglang-{version}-")
        assert len(c.recorded_from["sha256"]) == 64
        assert c.ready_line == "The server is fired up and ready to roll!"
        assert "--model-path" in c.by_flag and "--port" in c.by_flag


def test_prefixes_resolve_or_are_ambiguous_exactly_as_the_real_parser_says() -> None:
    for version in (V9, V23):
        c = load_contract("sglang", version)
        assert c.resolve("--tp").flag == "--tp-size" and c.server_arg("--tp") == "tp_size"
        for ambiguous in ("--pp", "--tokenizer", "--speculative-draft"):
            assert c.resolve(ambiguous).kind == "ambiguous", (version, ambiguous)
        assert c.resolve("--por").flag == "--port" and c.resolve("--hos").flag == "--host"
    assert load_contract("sglang", V9).resolve("--cuda-graph-max-bs").kind == "exact"
    assert load_contract("sglang", V23).resolve("--cuda-graph-max-bs").candidates == (
        "--cuda-graph-max-bs-decode",
        "--cuda-graph-max-bs-prefill",
    )
    gone = load_contract("sglang", V23).problem("--mamba-scheduler-strategy", "extra_buffer")
    assert gone is not None and "SGLang 0.5.23 has no option" in gone.message
    assert "--mamba-radix-cache-strategy" in gone.message


def test_values_are_checked_against_choices_and_types() -> None:
    c = load_contract("sglang", V9)
    assert c.problem("--moe-runner-backend", "flashinfer_cutlass") is None
    bad = c.problem("--moe-runner-backend", "flashinfer_megamoe")
    assert bad is not None and "accepts only" in bad.message
    assert c.problem("--tp", "eight") is not None and c.problem("--enable-metrics", "yes") is not None
    assert c.problem("--port", True) is not None


def test_the_rebuilt_parser_reads_a_seed_launch_and_rejects_like_sglang(capsys: pytest.CaptureFixture[str]) -> None:
    spec = build_launch(load_config(), load_config().host("sim"), ["nextn", "cutlass", "cudnn", "mscclpp"])
    argv = list(spec.argv[3:])  # past "{python} -m workers.sim.sglang"
    ns = load_contract("sglang", V9).build_parser().parse_args(argv)
    assert ns.speculative_algorithm == "NEXTN" and ns.tensor_parallel_size == 8
    with pytest.raises(SystemExit):
        load_contract("sglang", V23).build_parser().parse_args(["--model-path", "m", "--pp", "2"])
    assert "sglang serve: error: ambiguous option: --pp could match" in capsys.readouterr().err


def test_version_ranges() -> None:
    assert parse_version("0.5.10.post1") == (0, 5, 10) and parse_version("0.5.9rc1") == (0, 5, 9)
    assert version_matches(">=0.5.15", "0.5.23") and not version_matches(">=0.5.15", "0.5.9")
    assert version_matches(">=0.5.10,<0.5.18", "0.5.13") and version_matches("0.5.9", "0.5.9.0")
    with pytest.raises(ValueError):
        check_version_spec("newest")
    with pytest.raises(UnknownVersion):
        load_contract("sglang", "0.0.1")
