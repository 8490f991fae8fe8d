"""The verified config shows what was varied (issue 36): every flag that differs from the engine's recorded
defaults is in the summary, so ``/launch eager seqs8`` and ``/launch eager seqs4`` never read the same."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.factories import make_run
from tests.util import free_port, wait_until
from workers.engines.interface import ServerReport, ServerView
from workers.engines.non_default import non_default_flags
from workers.engines.registry import driver_for
from workers.engines.sglang.driver import DRIVER as SGLANG
from workers.engines.trtllm import flags as trtllm_flags
from workers.engines.vllm import flags
from workers.engines.vllm.driver import DRIVER
from workers.json_value import JsonValue
from workers.results import tables
from workers.results.record import RunRecord
from workers.results.summary_diff import flag_changes

BASE = ["/venv/bin/vllm", "serve", "/models/tiny", "--host", "127.0.0.1", "--port", "8123", "--enforce-eager"]


def summary(*extra: str, version: str = "0.32.0") -> str:
    contract = flags.contract_for(version)
    assert contract is not None
    args = flags.observed_args([*BASE, *extra], contract)
    view = ServerView(version, args, "/models/tiny", "/models/tiny", None, None, None)
    return DRIVER.describe(view, {})


def test_two_configs_that_differ_in_one_flag_never_read_the_same() -> None:
    eight, four = summary("--max-num-seqs", "8"), summary("--max-num-seqs", "4")
    assert eight == "vLLM no spec, TP1, eager, --max-num-seqs 8"
    assert four == "vLLM no spec, TP1, eager, --max-num-seqs 4"
    # the real demo's base flags: each named as typed, in the parser's order; what the words say is not repeated
    full = summary("--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "8", "--tensor-parallel-size", "1")
    assert full == "vLLM no spec, TP1, eager, --dtype float32, --max-model-len 512, --max-num-seqs 8"


def test_a_flag_at_its_default_and_where_the_server_listens_are_not_config() -> None:
    assert summary("--dtype", "auto", "--max-num-seqs", "8") == summary("--max-num-seqs", "8")
    assert "--port" not in summary() and "/models/tiny" not in summary() and "--host" not in summary()
    off = summary("--no-enable-prefix-caching", version="0.34.0")  # a negative spelling: vLLM's first one
    assert off.endswith("eager, --disable-prefix-caching"), off
    assert non_default_flags(None, {"max_num_seqs": 8}, ()) == []  # no recorded contract: nothing guessed


# ---------------------------------------------------------------------------------------------------------
# SGLang: the summary is built from what the real simulator's /server_info reports (resolved args)
# ---------------------------------------------------------------------------------------------------------

SGLANG_MODEL = "Qwen/Qwen3-0.6B"
SGLANG_LAUNCHES = {
    "default": [],
    "mrr8": ["--max-running-requests", "8"],
    "mrr4": ["--max-running-requests", "4"],
    # a newer release (resolved args nested under server_args), an abbreviated flag, one at its default
    "new": ["--sim-sglang-version", "0.5.23", "--tp", "1", "--schedule-policy", "fcfs", "--max-running-r", "8"],
}


@pytest.fixture(scope="module")
def sglang_views(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[ServerView, list[str]]]]:
    """Three simulated SGLang servers started together (defaults, ``--max-running-requests`` 8 and 4), each
    with the view its driver reports and its argv."""
    tmp = tmp_path_factory.mktemp("sglang-summary")
    procs: dict[str, tuple[subprocess.Popen[bytes], list[str], int]] = {}
    try:
        for name, extra in SGLANG_LAUNCHES.items():
            port = free_port()
            argv = [sys.executable, "-m", "workers.sim.sglang", "--model-path", SGLANG_MODEL, "--port", str(port)]
            argv += [*extra, "--sim-startup-s", "0", "--sim-state-dir", str(tmp / name)]
            log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - the child writes it until torn down
            procs[name] = (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), argv, port)

        def report(port: int) -> ServerReport | None:
            got = asyncio.run(SGLANG.report(f"http://127.0.0.1:{port}", None, 2.0, None))
            return got if got.outcome == "ok" else None

        views = {}
        for name, (_, argv, port) in procs.items():
            got = wait_until(functools.partial(report, port), timeout=60, what=f"the {name} SGLang sim to serve")
            assert got is not None and got.view is not None
            views[name] = (got.view, argv)
        yield views
    finally:
        for proc, _, _ in procs.values():
            proc.terminate()
        for proc, _, _ in procs.values():
            proc.wait(timeout=30)


def test_two_sglang_launches_that_differ_in_one_flag_never_read_the_same(
    sglang_views: dict[str, tuple[ServerView, list[str]]],
) -> None:
    def read(name: str) -> str:
        view, argv = sglang_views[name]
        return SGLANG.describe(view, SGLANG.launch_args(argv))

    default = read("default")
    assert default == "auto MoE, flashinfer_cutlass FP4, flashinfer attn, no spec, TP1", default
    # what SGLang filled in by itself (chunked prefill, memory fraction, seed, port) is not what was varied
    assert read("mrr8") == default + ", --max-running-requests 8"
    assert read("mrr4") == default + ", --max-running-requests 4"
    view, _ = sglang_views["mrr8"]
    assert view.args["chunked_prefill_size"] and view.args["mem_fraction_static"]  # resolved, yet not named
    new = read("new")  # --schedule-policy fcfs is 0.5.23's default; --tp is said in words
    assert new.endswith("no spec, TP1, --max-running-requests 8") and "schedule" not in new, new


def test_an_sglang_server_whose_command_line_is_unseen_names_every_observed_difference(
    sglang_views: dict[str, tuple[ServerView, list[str]]],
) -> None:
    # No process visible: the server's word is all there is; noisier, but still never the same for two configs.
    unseen = {name: SGLANG.describe(view, {}) for name, (view, _) in sglang_views.items()}
    assert "--max-running-requests 8" in unseen["mrr8"] and "--max-running-requests 4" in unseen["mrr4"]
    assert "--max-running-requests" not in unseen["default"]
    assert all("--port" not in text and "--random-seed" not in text for text in unseen.values())
    assert non_default_flags(None, sglang_views["mrr8"][0].args, ()) == []  # no recorded contract: nothing guessed


def test_compare_names_the_flag_two_launches_differ_in(sglang_views: dict[str, tuple[ServerView, list[str]]]) -> None:
    """``/compare`` of two runs labelled by their preset words names the flag those words set."""

    def run(run_id: str, name: str, label: str) -> RunRecord:
        view, argv = sglang_views[name]
        record = make_run(run_id, label=label)
        summary = SGLANG.describe(view, SGLANG.launch_args(argv))
        return dataclasses.replace(record, config={**record.config, "summary": summary, "engine_kind": "sglang"})

    table = tables.compare_table([run("r1", "mrr8", "mrr8"), run("r2", "mrr4", "mrr4"), run("r3", "default", "base")])
    lines = [line for line in table.splitlines() if line.startswith("config of")]
    assert lines == [
        "config of r2 vs r1: --max-running-requests 8 -> 4",
        "config of r3 vs r1: --max-running-requests 8 -> default",
    ], table
    # the words are in the legend already; a flag set in one run only is "default" in the other
    assert flag_changes("vLLM no spec, TP1", "vLLM MTP 3, TP2, --enforce-eager") == ["default -> --enforce-eager"]
    assert not [
        line
        for line in tables.compare_table([run("r1", "mrr8", "a"), run("r2", "mrr8", "b")]).splitlines()
        if line.startswith("config of")
    ]


def test_two_trtllm_launches_that_differ_in_one_flag_or_file_setting_never_read_the_same() -> None:
    driver = driver_for("trtllm")
    contract = trtllm_flags.contract_for(None)
    assert contract is not None
    base = ["/venv/bin/trtllm-serve", "serve", "/m", "--tp_size", "8", "--port", "8123", "--config", "/run/x.json"]

    def read(*extra: str, **settings: JsonValue) -> str:
        args = {**trtllm_flags.observed_args([*base, *extra], contract), **settings}
        return driver.describe(ServerView(contract.version, args, "/m", "/m", None, None, None), {})

    plain = "TensorRT-LLM pytorch, TP8, KV 0.9 of free memory, max batch 2048"
    assert read() == read("--max_num_tokens", "8192") == plain  # 8192 is the recorded default
    assert read("--max_num_tokens", "4096") == plain + ", --max_num_tokens 4096"
    cutlass = {"moe_config.backend": "CUTLASS"}
    assert read(**cutlass) == plain + "; from its --config file: MoE CUTLASS"
    wider = read(**cutlass, **{"moe_config.max_num_tokens": 4096})
    assert wider == plain + "; from its --config file: MoE CUTLASS, --moe_config.max_num_tokens 4096"
