"""The driver held against SGLang's recorded contracts (``workers/engines/contracts``), not its simulator.

Every diagnosis rule is matched on the real text of each recorded version that prints it; the texts
SGLang logs and survives never end a readiness wait; every seed preset parses with each version's real
parser (through the version-aware presets); flag mapping and argv parsing agree with those parsers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from workers.config import EMBEDDED_TOML, load_config, parse_config
from workers.engines.args import parse_argv
from workers.engines.contract import Contract, RecordedText, all_contracts, load_contract, recorded_versions
from workers.engines.sglang.diagnosis import (
    BENIGN_TEXTS,
    RULES,
    SUMMARY_FLAG_RE,
    Rule,
    diagnose,
    flags_for_version,
    match_rule,
)
from workers.engines.sglang.flags import flag_to_arg, redact_argv, requested_args
from workers.engines.sglang.readiness import READY_LINE, ReadyResult, wait_ready
from workers.errors import ConfigError
from workers.presets import LaunchSpec, build_launch, check_launch
from workers.secrets import REDACTED

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = all_contracts()
VERSIONS = recorded_versions()
CONFIG = parse_config(EMBEDDED_TOML)  # the seed's presets, whatever benchbot.toml lies near
HOST = CONFIG.host("sim")
COMMAND_LEN = len(HOST.engine.command)
LOAD = (
    "[2026-03-01 09:59:10 TP0] Load weight begin. avail mem=94.20 GB\n"
    "[2026-03-01 09:59:50 TP0] Load weight end. type=Qwen3_5MoeForCausalLM, avail mem=45.10 GB.\n"
)
WRAPPER = (
    "[2026-03-01 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 42, in run\n'
)


def log_line(entry: RecordedText) -> str:
    """The recorded text as it shows up in an engine log (logged lines carry SGLang's prefix)."""
    line = entry.log_line
    assert line is not None
    return f"[2026-03-01 10:00:00 TP0] {line}" if entry.emitted.startswith("logger") else line


def rule_id(rule: Rule) -> str:
    return f"{rule.category}:{rule.texts[0] if rule.texts else rule.pattern.pattern[:20]}"


RULE_CASES = [
    pytest.param(rule, key, c, id=f"{rule_id(rule)}-{key}-{c.version}")
    for rule in RULES
    for key in rule.texts
    for c in CONTRACTS
    if c.texts.get(key) is not None
]


# --------------------------------------------------------------------------------------------- rules


def test_every_rule_is_for_texts_a_recorded_version_prints() -> None:
    for rule in RULES:
        assert rule.texts, f"{rule_id(rule)} names no recorded text"
        for key in rule.texts:
            assert any(key in c.texts for c in CONTRACTS), f"{key}: no contract records this key (a typo?)"
        entries = [c.texts[k] for k in rule.texts for c in CONTRACTS if c.texts.get(k) is not None]
        recorded = [e for e in entries if e.recorded]
        # A rule whose text exists in no recorded version matches something nobody prints: it fails here.
        # The only excuse is a text that exists but no wheel shows (the fixture then says why).
        assert recorded or (entries and all(e.source.startswith("not recorded:") for e in entries)), rule_id(rule)


@pytest.mark.parametrize(("rule", "key", "contract"), RULE_CASES)
def test_rule_matches_the_real_text(rule: Rule, key: str, contract: Contract) -> None:
    entry = contract.texts[key]
    assert entry is not None
    if not entry.recorded:
        pytest.skip(entry.source)
    log = LOAD + log_line(entry) + "\n"
    found = match_rule(log)
    assert found is not None and found[0] is rule, (entry.text, found and rule_id(found[0]))
    if rule.fatal:
        fatal = match_rule(log, fatal_only=True)
        assert fatal is not None and fatal[0] is rule
    d = diagnose(log, exited=True, returncode=1, timed_out=False, contract=contract)
    assert d.category == rule.category
    assert entry.text.splitlines()[0].strip()[:40] in d.evidence_line or entry.text[:40] in log
    for flag in SUMMARY_FLAG_RE.findall(flags_for_version(rule.summary, contract)):  # the hint's own flags
        assert contract.resolve(flag).kind == "exact", f"the hint names {flag}, which {contract.label()} lacks"
    raised = entry.emitted.startswith(("raise", "assert"))
    if raised and RULES.index(rule) < RULES.index(next(r for r in RULES if "scheduler_exception" in r.texts)):
        # The cause wins over the scheduler's wrapper line that comes first in the log.
        wrapped_log = LOAD + WRAPPER + log_line(entry) + "\n"
        for fatal_only in (False, True) if rule.fatal else (False,):
            wrapped = match_rule(wrapped_log, fatal_only=fatal_only)
            assert wrapped is not None and wrapped[0] is rule


def test_the_ready_line_is_the_one_every_version_prints() -> None:
    for contract in CONTRACTS:
        assert contract.ready_line == READY_LINE
        assert contract.texts["ready"] is not None
        assert contract.texts["ready"].source.endswith("sglang/srt/entrypoints/http_server.py")


BENIGN_CASES = [
    pytest.param(key, c, id=f"{key}-{c.version}")
    for key in BENIGN_TEXTS
    for c in CONTRACTS
    if c.texts.get(key) is not None and c.texts[key].recorded
]


@pytest.mark.parametrize(("key", "contract"), BENIGN_CASES)
def test_lines_sglang_survives_are_not_fatal(key: str, contract: Contract) -> None:
    entry = contract.texts[key]
    assert entry is not None
    assert match_rule(LOAD + log_line(entry) + "\n", fatal_only=True) is None, entry.text


def test_every_benign_text_is_recorded_somewhere() -> None:
    for key in BENIGN_TEXTS:
        assert any(c.texts.get(key) is not None and c.texts[key].recorded for c in CONTRACTS), key


def test_an_internal_port_wait_is_not_the_http_port_in_use() -> None:
    wait = load_contract("sglang", "0.5.9").texts["internal_port_wait"]
    assert wait is not None and "is in use. Waiting for" in (wait.text or "")
    assert match_rule(log_line(wait)) is None
    alive = diagnose(LOAD + log_line(wait), exited=False, returncode=None, timed_out=True)
    assert alive.category == "timeout"


def test_recorded_templates_render_other_values_as_the_source_formats_them() -> None:
    """A literal's template keeps how each field is formatted: ``{x=}`` is repr, ``%d`` of a log call."""
    c9, c23 = load_contract("sglang", "0.5.9"), load_contract("sglang", "0.5.23")
    kv = c9.texts["kv_pool_too_small"]
    assert kv is not None and kv.sample() == kv.text and [f.format for f in kv.fields] == ["!r"]
    assert kv.render({"mem_fraction_static": 0.5}).endswith("mem_fraction_static=0.5")
    assert kv.render({"self.server_args.mem_fraction_static": "x"}).endswith("mem_fraction_static='x'")
    nxt = c23.texts["internal_port_next"]
    assert nxt is not None and [f.expr for f in nxt.fields] == ["port", "port + 1"]
    assert nxt.render({"port": 7, "port + 1": 8}) == "Port 7 is already in use, trying port 8"
    with pytest.raises(TypeError):
        nxt.render({"port": "seven", "port + 1": 8})  # %d of a str fails as it would in SGLang
    oom = c9.texts["torch_cuda_oom"]
    assert oom is not None and oom.template is None and oom.render() == oom.text  # a C string: verbatim
    for contract in CONTRACTS:
        for entry in contract.texts.values():
            if entry is not None and entry.template is not None:
                assert entry.sample() == entry.text, (contract.version, entry.key)


async def _serve_health(codes: list[int]) -> tuple[web.AppRunner, str, list[int]]:
    calls: list[int] = []

    async def health(_: web.Request) -> web.Response:
        calls.append(1)
        return web.Response(status=codes[min(len(calls) - 1, len(codes) - 1)])

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}", calls


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.version for c in CONTRACTS])
def test_wait_ready_rides_out_every_line_sglang_survives(contract: Contract) -> None:
    lines = [log_line(e) for k in BENIGN_TEXTS if (e := contract.texts.get(k)) is not None and e.recorded]
    pending = [LOAD + "\n".join(line for line in lines if READY_LINE not in line) + "\n"]

    async def read_new_log() -> str:
        if pending:
            return pending.pop()
        return ""

    async def alive() -> bool:
        return True

    async def main() -> Any:
        runner, url, calls = await _serve_health([503, 503, 503, 200])
        try:
            return await wait_ready(
                url, deadline_s=20, is_alive=alive, read_new_log=read_new_log, poll_s=0.02, contract=contract
            ), len(calls)
        finally:
            await runner.cleanup()

    result, polls = asyncio.run(main())
    assert isinstance(result, ReadyResult), result
    assert polls == 4


# --------------------------------------------------------------------------------------------- presets


def _parse(contract: Contract, spec: LaunchSpec) -> Any:
    return contract.build_parser().parse_args(list(spec.argv[COMMAND_LEN:]))


PRESET_CASES = [
    pytest.param(c, words, id=f"{c.version}-{'+'.join(words)}")
    for c in CONTRACTS
    for words in [(), *[(w,) for w in CONFIG.presets], ("nextn", "cutlass", "cudnn", "mscclpp", "customar")]
]


@pytest.mark.parametrize(("contract", "words"), PRESET_CASES)
def test_every_seed_preset_parses_with_the_real_parser(contract: Contract, words: tuple[str, ...]) -> None:
    spec = build_launch(CONFIG, HOST, words, version=contract.version)
    assert check_launch(spec, contract) == []
    ns = _parse(contract, spec)  # argparse exits (and the test fails) on anything it would refuse
    assert ns.model_path == HOST.engine.model and ns.port == HOST.port


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.version for c in CONTRACTS])
def test_the_example_configs_presets_are_what_each_version_accepts(contract: Contract) -> None:
    example = load_config(str(ROOT / "deploy" / "benchbot.example.toml"))
    for host in example.hosts.values():
        if host.engine.kind != "sglang":
            continue  # the example's vLLM box: its presets are held against vLLM's parser (test_vllm_driver.py)
        for word in example.presets:
            spec = build_launch(example, host, [word], version=contract.version)
            assert check_launch(spec, contract) == [], (word, host.name)
            contract.build_parser().parse_args(list(spec.argv[len(host.engine.command) :]))


def test_nextn_is_what_each_version_accepts() -> None:
    for version, flag in (
        ("0.5.9", "--mamba-scheduler-strategy"),
        ("0.5.10", "--mamba-scheduler-strategy"),
        ("0.5.23", "--mamba-radix-cache-strategy"),
    ):
        spec = build_launch(CONFIG, HOST, ["nextn"], version=version)
        flags = dict(spec.flags)
        assert flags[flag] == "extra_buffer" and sum(f.startswith("--mamba") for f in flags) == 1, version
        assert dict(spec.env)["SGLANG_ENABLE_SPEC_V2"] == "1"


def test_check_launch_names_the_version_and_the_nearest_real_flag() -> None:
    c23 = load_contract("sglang", "0.5.23")
    unversioned = build_launch(CONFIG, HOST, ["nextn"])  # the base preset: 0.5.9's flag names
    problems = check_launch(unversioned, c23)
    assert len(problems) == 1
    assert "SGLang 0.5.23 has no option --mamba-scheduler-strategy" in problems[0]
    assert "--mamba-radix-cache-strategy" in problems[0]
    raw = build_launch(CONFIG, HOST, ["cutlass"], [("--cuda-graph-max-bs", "16"), ("--moe-runner-backend", "cutlas")])
    problems = check_launch(raw, c23)
    assert any(
        "--cuda-graph-max-bs is ambiguous in SGLang 0.5.23" in p and "--cuda-graph-max-bs-decode" in p for p in problems
    )
    assert any('did you mean "cutlass"' in p for p in problems)
    assert check_launch(raw, load_contract("sglang", "0.5.9")) != []  # cutlas is wrong everywhere


def test_check_launch_refuses_a_reserved_flag_smuggled_into_a_queued_spec() -> None:
    spec = build_launch(CONFIG, HOST, ["cutlass"])
    forged = LaunchSpec.from_dict(
        {**spec.to_dict(), "raw_flags": [["--por", "43103"]], "flags": [*spec.to_dict()["flags"], ["--por", "43103"]]}
    )
    problems = check_launch(forged, load_contract("sglang", "0.5.9"))
    assert any("--por (--port in SGLang 0.5.9) is set by benchbot" in p for p in problems)


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ('[presets.x.versions."newest"]\nflags = { "--a" = "1" }', 'presets.x.versions."newest"'),
        ('[presets.x.versions.">=0.5.15"]\nflag = { "--a" = "1" }', 'presets.x.versions.">=0.5.15".flag'),
        ('[presets.x.versions.">=0.5.15"]\nremove = ["bad flag"]', 'presets.x.versions.">=0.5.15".remove[0]'),
        ('[presets.x.versions.">=0.5.15"]\n', 'presets.x.versions.">=0.5.15"'),
    ],
)
def test_preset_version_blocks_are_validated_with_the_key_named(toml: str, key: str) -> None:
    base = '[hosts.h]\n[presets.x]\nflags = { "--enable-metrics" = true }\n'
    with pytest.raises(ConfigError) as info:
        parse_config(base + toml)
    assert f": {key}:" in str(info.value)


def test_version_blocks_apply_in_order_and_only_where_they_match() -> None:
    config = parse_config("""
[hosts.h]
[presets.x]
flags = { "--a-flag" = "base" }
env = { E = "base" }
[presets.x.versions.">=0.5.10"]
flags = { "--a-flag" = "ten" }
[presets.x.versions.">=0.5.20,<0.6"]
remove = ["--a-flag"]
flags = { "--b-flag" = "twenty" }
env = { E = "twenty" }
""")
    host = config.host("h")
    assert dict(build_launch(config, host, ["x"]).flags)["--a-flag"] == "base"
    assert dict(build_launch(config, host, ["x"], version="0.5.9").flags)["--a-flag"] == "base"
    assert dict(build_launch(config, host, ["x"], version="0.5.10").flags)["--a-flag"] == "ten"
    late = build_launch(config, host, ["x"], version="0.5.23")
    assert "--a-flag" not in dict(late.flags) and dict(late.flags)["--b-flag"] == "twenty"
    assert dict(late.env)["E"] == "twenty"
    assert dict(build_launch(config, host, ["x"], version="0.6.0").env)["E"] == "base"


# --------------------------------------------------------------------------------------------- flags


def _flags_we_use() -> set[str]:
    flags = {"--model-path", "--host", "--port", *(f for f, _ in HOST.engine.flags)}
    for preset in CONFIG.presets.values():
        flags |= {f for f, _ in preset.flags} | set(preset.remove)
        for block in preset.versions:
            flags |= {f for f, _ in block.flags} | set(block.remove)
    return flags


def test_flag_mapping_agrees_with_each_contract_for_every_flag_we_use() -> None:
    for flag in sorted(_flags_we_use()):
        accepting = [c for c in CONTRACTS if c.resolve(flag).ok]
        assert accepting, f"{flag}: no recorded SGLang accepts it"
        for contract in accepting:
            arg = contract.server_arg(flag)
            assert flag_to_arg(flag, contract) == arg
            assert arg in contract.server_args_fields, f"/server_info of {contract.label()} does not report {arg}"
        assert flag_to_arg(flag) == accepting[-1].server_arg(flag)  # the newest version that accepts it


def test_requested_args_of_a_seed_launch_are_the_parsers_own_names() -> None:
    for contract in CONTRACTS:
        spec = build_launch(CONFIG, HOST, ["nextn", "cutlass", "cudnn"], version=contract.version)
        requested = requested_args(dict(spec.flags), contract)
        assert set(requested) <= set(contract.server_args_fields), contract.version


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.version for c in CONTRACTS])
def test_parse_argv_reads_a_launch_as_the_real_parser_does(contract: Contract) -> None:
    spec = build_launch(CONFIG, HOST, ["nextn", "cutlass", "cudnn", "mscclpp"], version=contract.version)
    graph_bs = "--cuda-graph-bs" if contract.resolve("--cuda-graph-bs").ok else "--cuda-graph-bs-decode"
    # A person's argv: a list value, --flag=value, and an abbreviation that overrides an earlier spelling.
    argv = [*spec.argv[COMMAND_LEN:], graph_bs, "1", "2", "4", "--mem-fraction-static=0.85", "--tp", "4"]
    ns = contract.build_parser().parse_args(argv)
    parsed = parse_argv(["python3", "-m", "sglang.launch_server", *argv])
    requested = requested_args(parsed, contract)
    assert len(parsed) >= 14 and requested["tp_size"] == 4  # the later spelling wins, as in argparse
    for flag in parsed:
        option = contract.resolve(flag).option
        assert option is not None, flag
        assert requested[flag_to_arg(flag, contract)] == getattr(ns, option.dest), flag


def test_an_abbreviated_secret_flag_is_redacted_like_the_whole_one() -> None:
    # SGLang takes --api-k as --api-key; the redaction must too, or the key reaches logs and Slack.
    assert redact_argv(["--api-k", "sk-1", "--admin-api=sk-2", "--tp", "8"]) == [
        "--api-k",
        REDACTED,
        f"--admin-api={REDACTED}",
        "--tp",
        "8",
    ]
