"""Reserved and admin-only engine flags, matched after argparse's prefix resolution in every recorded SGLang."""

from __future__ import annotations

import pytest

from workers.engines import registry
from workers.engines.contract import Contract, all_contracts, load_contract
from workers.errors import BenchbotError
from workers.reserved_flags import (
    ADMIN_ONLY_ARGS,
    RESERVED_ARGS,
    check_raw_flag,
    check_reserved_flag,
    raw_flag_problem,
    reserved_flag_problem,
    reserved_flag_problems,
)

CONTRACTS = all_contracts()


def _spellings(contract: Contract, args: frozenset[str]) -> list[tuple[str, str]]:
    """(arg, spelling) for every option string of these args and every prefix the parser takes for it."""
    out = []
    for option in contract.options:
        arg = contract.server_arg(option.name)
        if arg not in args:
            continue
        for flag in option.flags:
            for end in range(3, len(flag) + 1):
                res = contract.resolve(flag[:end])
                if res.option is option:
                    out.append((arg, flag[:end]))
    return out


def test_the_policy_names_real_options() -> None:
    # the policy covers every registered engine's options (vLLM's since issue 15, TensorRT-LLM's since issue 21):
    # each name is a real option of some recorded engine
    known = {c.server_arg(o.name) for kind in registry.kinds() for c in all_contracts(kind) for o in c.options}
    assert known >= RESERVED_ARGS and known >= ADMIN_ONLY_ARGS
    assert not RESERVED_ARGS & ADMIN_ONLY_ARGS


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.version for c in CONTRACTS])
def test_every_spelling_of_a_reserved_option_is_refused_even_for_admins(contract: Contract) -> None:
    spellings = _spellings(contract, RESERVED_ARGS)
    assert {"--por", "--hos", "--api-k", "--config"} <= {s for _, s in spellings}
    for arg, spelling in spellings:
        assert reserved_flag_problem(spelling, [contract], admin=True), (arg, spelling)
        assert reserved_flag_problem(f"{spelling}=1", [contract], admin=True), (arg, spelling)


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.version for c in CONTRACTS])
def test_every_spelling_of_an_admin_only_option_is_for_admins(contract: Contract) -> None:
    spellings = _spellings(contract, ADMIN_ONLY_ARGS)
    assert {"--model-pat", "--model", "--trust-remote-code", "--revision", "--tokenizer-p"} <= {s for _, s in spellings}
    for arg, spelling in spellings:
        problem = reserved_flag_problem(spelling, [contract], admin=False)
        assert problem and "only an admin may give it" in problem, (arg, spelling)
        assert reserved_flag_problem(spelling, [contract], admin=True) is None


def test_the_bot_refuses_what_any_recorded_version_reserves() -> None:
    for flag in ("--por", "--hos", "--api-key", "--admin-api-key", "--config", "--ssl-keyfile", "--fastapi-root"):
        with pytest.raises(BenchbotError, match="set by benchbot from the host config"):
            check_reserved_flag(flag)
    with pytest.raises(BenchbotError) as info:
        check_raw_flag("--por")
    assert str(info.value).startswith("--por (--port in SGLang ")  # says what the abbreviation means
    with pytest.raises(BenchbotError, match="only an admin"):
        check_raw_flag("--model-pat", admin=False)
    check_raw_flag("--model-pat", admin=True)
    # --ssl-cert is --ssl-certfile from 0.5.10 on and nothing in 0.5.9: refused, whatever the host runs.
    assert not load_contract("sglang", "0.5.9").resolve("--ssl-cert").ok
    with pytest.raises(BenchbotError, match=r"--ssl-cert \(--ssl-certfile in SGLang 0\.5\.10\)"):
        check_reserved_flag("--ssl-cert")


@pytest.mark.parametrize(
    "flag",
    [
        "--tp",
        "--tp-size",
        "--mem-fraction-static",
        "--moe-runner-backend",
        "--enable-metrics",
        "--mamba-radix-cache-strategy",
        "--cuda-graph-max-bs",
        "--speculative-num-steps",
    ],
)
def test_ordinary_flags_pass_for_everyone(flag: str) -> None:
    check_raw_flag(flag, admin=False)


def test_a_flag_no_recorded_version_knows_is_judged_by_its_own_spelling() -> None:
    assert reserved_flag_problem("--port", [], admin=True)
    assert reserved_flag_problem("--trust-remote-code", [], admin=False)
    assert reserved_flag_problem("--not-an-option", CONTRACTS, admin=False) is None  # SGLang refuses it itself


def test_the_workers_check_against_the_hosts_version() -> None:
    c9 = load_contract("sglang", "0.5.9")
    problems = reserved_flag_problems(["--por", "--tp", "--model-pat"], c9, admin=False)
    assert len(problems) == 2
    assert problems[0].startswith("--por (--port in SGLang 0.5.9)") and "--model-pat" in problems[1]
    assert reserved_flag_problems(["--model-pat"], c9, admin=True) == []


@pytest.mark.parametrize(
    "flag",
    ['-cc={"backend": "my.module"}', '--compilation-config={"backend": "my.module"}'],
)
def test_an_alias_and_an_attached_value_are_judged_as_the_long_form(flag: str) -> None:
    """Issue 39 round 4, item 7: vLLM's -cc is --compilation-config, a value after = is its value."""
    problem = raw_flag_problem(flag, True, all_contracts("vllm"), admin=False)
    assert problem is not None and 'key "backend"' in problem and "only an admin" in problem, problem
    if flag.startswith("-cc"):
        assert "(--compilation-config in vLLM" in problem
    assert raw_flag_problem(flag, True, all_contracts("vllm"), admin=True) is None


@pytest.mark.parametrize("flag", ["-O3", "-O=3", "-O"])
def test_vllms_dash_o_is_its_optimization_level(flag: str) -> None:
    """vLLM's parser rewrites -O3 / -O=3 / -O 3 to --optimization-level: resolved (and judged) as that."""
    for contract in all_contracts("vllm"):
        resolved = contract.resolve(flag)
        assert resolved.option is not None and resolved.option.dest == "optimization_level", (contract, flag)
    assert contract.problem("-O", "3") is None
