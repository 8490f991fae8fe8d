"""The verified config shows what was varied (issue 36): every flag that differs from the engine's recorded
defaults is in the summary, so ``/launch eager seqs8`` and ``/launch eager seqs4`` never read the same."""

from __future__ import annotations

from workers.engines.interface import ServerView
from workers.engines.non_default import non_default_flags
from workers.engines.vllm import flags
from workers.engines.vllm.driver import DRIVER

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
