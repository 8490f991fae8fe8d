"""The vLLM driver behind the engine interface: diagnosis rules on vLLM's recorded texts (and the wheel's
source), process identification, launch compile, observed args and fingerprint, spec-decode counters,
and the config that chooses a driver per host."""

from __future__ import annotations

import ast
import re
import tokenize
from pathlib import Path

import pytest

from workers.config import DEFAULT_COMMANDS, ConfigError, parse_config
from workers.engines.contract import all_contracts, load_contract
from workers.engines.diagnosis import diagnose, match_rule
from workers.engines.interface import SpecDecodeCounters
from workers.engines.probe import is_simulator, version_argv
from workers.engines.processes import engine_kind, engine_port
from workers.engines.registry import driver_for
from workers.engines.vllm import diagnosis as vllm_diagnosis
from workers.engines.vllm import flags as vllm_flags
from workers.engines.vllm.driver import DRIVER, describe_args, spec_counters
from workers.errors import BenchbotError
from workers.observation import ServerView
from workers.presets import build_launch
from workers.reserved_flags import reserved_flag_problems

CONTRACTS = all_contracts("vllm")
WHEELS = {"0.34.0": Path("/tmp/wheels/vllm-0.34")}
RULE_TEXTS = sorted({key for rule in vllm_diagnosis.RULES for key in rule.texts})
#: Rule texts that are string literals of vLLM's own source (argparse's lines and libc's strerror are not).
SOURCE_TEXTS = sorted(
    key
    for key in RULE_TEXTS
    if any(
        (e := c.texts.get(key)) is not None and e.template and e.source.startswith(f"vllm {c.version}: ")
        for c in CONTRACTS
    )
)

MIXED = """
default_host = "sg"
[engine]
command = ["{python}", "-m", "workers.sim.sglang"]
flags = { "--tp-size" = 8, "--disable-custom-all-reduce" = true }
[hosts.sg]
port = 30001
[hosts.vl]
port = 8001
[hosts.vl.engine]
kind = "vllm"
command = ["{python}", "-m", "workers.sim.vllm", "serve"]
flags = { "--tensor-parallel-size" = 8, "--quantization" = "modelopt_fp4" }
[presets.cutlass]
group = "moe"
flags = { "--moe-runner-backend" = "flashinfer_cutlass" }
"""


# ------------------------------------------------------------------ diagnosis rules vs the recorded texts


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.version for c in CONTRACTS])
@pytest.mark.parametrize("key", RULE_TEXTS)
def test_every_vllm_rule_matches_the_real_text_and_wins(contract, key):
    entry = contract.texts.get(key)
    if entry is None or entry.text is None:
        pytest.skip(f"{key}: {entry.source if entry else 'not in this version'}")
    found = match_rule(entry.text, rules=vllm_diagnosis.RULES)
    assert found is not None, (key, entry.text)
    rule, _ = found
    assert key in rule.texts, f"{key} is explained by another rule ({rule.texts})"


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.version for c in CONTRACTS])
def test_texts_of_a_healthy_start_never_end_a_wait(contract):
    for key in vllm_diagnosis.BENIGN_TEXTS:
        text = contract.text(key)
        assert text is not None, key
        assert match_rule(text, fatal_only=True, rules=vllm_diagnosis.RULES) is None, key


def _joined_literals(path: Path) -> list[str]:
    """Every string expression of a Python file, implicitly concatenated literals joined, escapes decoded."""
    groups: list[str] = []
    current: list[str] = []
    with path.open(encoding="utf-8") as fh:
        for tok in tokenize.generate_tokens(fh.readline):
            if tok.type == tokenize.STRING:
                prefix = re.match(r"[rbuRBUfF]*", tok.string).group(0)  # type: ignore[union-attr]
                body = tok.string[len(prefix) :]
                try:
                    value = ast.literal_eval(("r" if "r" in prefix.lower() else "") + body)
                except (ValueError, SyntaxError):
                    value = body
                current.append(value if isinstance(value, str) else "")
            elif tok.type in (tokenize.NL, tokenize.COMMENT):
                continue
            elif current:
                groups.append("".join(current))
                current = []
    return groups


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.version for c in CONTRACTS])
@pytest.mark.parametrize("key", SOURCE_TEXTS)
def test_every_rule_text_is_in_the_wheels_source(contract, key):
    """The recorded text is the wheel's: each fixed part of its template is in one string of the file it
    names (f-string fields and ``%s`` are the variable parts). Needs the extracted wheel."""
    wheel = WHEELS.get(contract.version)
    entry = contract.texts.get(key)
    if entry is None or not entry.template or not entry.source.startswith(f"vllm {contract.version}: "):
        pytest.skip(f"{key}: not a vLLM source literal ({entry.source if entry else 'absent'})")
    if wheel is None or not wheel.is_dir():
        pytest.skip(f"the vLLM {contract.version} wheel is not extracted here")
    path = wheel / entry.source.split(": ", 1)[1].split(" ", 1)[0]
    parts = [p for p in re.split(r"\{\d*\}|%[sd]", entry.template) if len(p.strip()) >= 3]
    assert parts, key
    strings = _joined_literals(path)
    assert any(all(part in s for part in parts) for s in strings), (key, parts, path)


def test_a_vllm_oom_log_is_diagnosed_with_the_root_cause_not_the_wrapper():
    contract = load_contract("vllm", "0.34.0")
    log = "\n".join(
        [
            "(EngineCore pid=7) ERROR 12-03 10:00:00 [core.py:1757] EngineCore failed to start.",
            "ValueError: " + contract.text("kv_cache_no_memory"),
            "RuntimeError: " + contract.text("engine_core_init_failed"),
        ]
    )
    found = diagnose(
        log, exited=True, returncode=1, timed_out=False, contract=contract, rules=vllm_diagnosis.RULES, engine="vLLM"
    )
    assert found.category == "oom" and "--gpu-memory-utilization" in found.summary
    assert "No available memory for the cache blocks" in found.evidence_line
    silent = DRIVER.diagnose("(APIServer pid=7) INFO starting\n", exited=True, timed_out=False, contract=contract)
    assert silent.category == "crashed" and silent.summary.startswith("vLLM exited")


# ------------------------------------------------------------------ which processes are engines


@pytest.mark.parametrize(
    ("argv", "kind", "port"),
    [
        (["vllm", "serve", "Qwen/Qwen3-0.6B", "--port", "8123"], "vllm", 8123),
        (["/venv/bin/python3", "/venv/bin/vllm", "serve", "m"], "vllm", 8000),
        (["python3", "-m", "vllm.entrypoints.cli.main", "serve", "m", "--port=9000"], "vllm", 9000),
        (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "vllm", 8000),
        (["python3", "-m", "workers.sim.vllm", "serve", "m", "--port", "8001"], "vllm-sim", 8001),
        (["python3", "-m", "sglang.launch_server", "--port", "30001"], "sglang", 30001),
        (["VLLM::EngineCore"], None, 8000),  # a child in a server's tree, never a server of its own
        (["VLLM::Worker_TP3"], None, 8000),
        (["vllm", "bench", "serve"], None, 8000),
        (["python3", "-m", "vllm.entrypoints.cli.main", "chat"], None, 8000),
        (["vim", "vllm", "serve"], None, 8000),
        (["/usr/bin/python3.11", "/opt/vllm/bin/vllm", "serve", "m"], "vllm", 8000),
    ],
)
def test_vllm_processes_are_identified_and_nothing_else(argv, kind, port):
    assert engine_kind(argv) == kind
    assert engine_port(argv, kind or "vllm") == port


def test_a_configured_command_is_an_engine_of_the_hosts_kind():
    wrapper = ("/srv/bin/serve-vllm",)
    assert engine_kind([*wrapper, "--port", "1"], [wrapper], "vllm") == "vllm"
    assert engine_kind(["/srv/bin/other"], [wrapper], "vllm") is None


def test_the_version_probe_knows_vllm_commands():
    sim = ("/venv/bin/python", "-m", "workers.sim.vllm", "serve")
    assert is_simulator(sim) and version_argv(sim) == ["/venv/bin/python", "-m", "workers.sim.vllm", "--version"]
    assert version_argv(("vllm", "serve")) == ["vllm", "--version"]
    assert version_argv(("/venv/bin/python", "-m", "vllm.entrypoints.cli.main", "serve"))[:2] == [
        "/venv/bin/python",
        "-c",
    ]


# ------------------------------------------------------------------ config and launch compile


def test_a_vllm_host_gets_vllms_command_presets_and_argv():
    config = parse_config(MIXED)
    vl, sg = config.host("vl"), config.host("sg")
    assert vl.engine.kind == "vllm" and sg.engine.kind == "sglang"
    assert driver_for(vl.engine.kind).name == "vLLM"
    spec = build_launch(config, vl, ["cutlass", "cudnn", "mtp"], [("-tp", "4")])
    argv = list(spec.argv)
    assert argv[argv.index("serve") + 1] == vl.engine.model  # the model is vLLM's positional
    assert argv[argv.index("--moe-backend") + 1] == "flashinfer_cutlass"  # vLLM's word, not SGLang's flag
    assert argv[argv.index("--port") + 1] == "8001" and "--model-path" not in argv
    assert "--tensor-parallel-size" not in argv and argv[argv.index("-tp") + 1] == "4"  # one option, the raw wins
    assert "--disable-custom-all-reduce" not in argv  # [engine]'s SGLang base flags do not cross engines
    # the same word means SGLang's flag on the SGLang host
    assert "--moe-runner-backend" in build_launch(config, sg, ["cutlass"]).argv
    with pytest.raises(BenchbotError, match=r'unknown preset "nextn" on vl \(vLLM\)'):
        build_launch(config, vl, ["nextn"])


def test_a_host_of_another_kind_starts_from_that_engines_defaults():
    config = parse_config("[hosts.a.engine]\nkind = 'vllm'\n[hosts.b]\nport = 30001\n")
    assert config.host("a").engine.command == DEFAULT_COMMANDS["vllm"] and config.host("a").engine.flags == ()
    assert config.host("b").engine.command == DEFAULT_COMMANDS["sglang"]


def test_a_config_can_define_its_own_vllm_presets():
    config = parse_config(
        MIXED + '\n[engines.vllm.presets.fast]\nflags = { "--moe-backend" = "cutlass" }\ndescription = "x"\n'
    )
    assert list(config.presets_for("vllm")) == ["fast"]
    assert "--moe-backend" in build_launch(config, config.host("vl"), ["fast"]).argv
    with pytest.raises(ConfigError, match=r"engines\.tgi: 'tgi' is not an engine with its own presets"):
        parse_config(MIXED + "\n[engines.tgi.presets.x]\nflags = { '--a' = 1 }\n")
    with pytest.raises(ConfigError, match=r"engines\.vllm\.presets\.bad\.requires"):
        parse_config(MIXED + "\n[engines.vllm.presets.bad]\nflags = { '--a' = 1 }\nrequires = ['none']\n")


def test_reserved_vllm_options_are_refused_before_spawn():
    contract = load_contract("vllm", "0.34.0")
    problems = reserved_flag_problems(["--uds", "--root-path", "--model", "--moe-backend"], contract, admin=False)
    assert len(problems) == 3 and "--moe-backend" not in " ".join(problems)
    assert "set by benchbot" in problems[0] and "only an admin" in problems[2]


# ------------------------------------------------------------------ observation


def _view(argv: list[str], version: str = "0.34.0") -> ServerView:
    args = vllm_flags.observed_args(argv, load_contract("vllm", version))
    return ServerView(version, args, args.get("model_tag"), args.get("model_tag"), None, None, None)


def test_observed_args_are_vllms_own_names_and_the_fingerprint_ignores_where_it_listens():
    base = ["python3", "-m", "workers.sim.vllm", "serve", "m", "--tensor_parallel_size", "8"]
    spec = ["--speculative-config.method", "mtp", "--speculative-config.num_speculative_tokens", "3"]
    view = _view([*base, "--port", "8001", "--api-key", "s3cret", "--sim-load-s", "0.2", *spec])
    args = view.args
    assert args["tensor_parallel_size"] == 8 and args["model_tag"] == "m"
    assert args["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 3}
    assert "s3cret" not in repr(args) and "sim_load_s" not in args
    assert describe_args(args) == "vLLM no spec".replace("no spec", "MTP 3, TP8")
    moved = _view([*base, "--port", "9999", *spec])
    assert DRIVER.fingerprint(moved) == DRIVER.fingerprint(view)  # same config elsewhere: same fingerprint
    other = _view([*base, "--moe-backend", "cutlass", *spec])
    assert DRIVER.fingerprint(other) != DRIVER.fingerprint(view)
    assert DRIVER.requested_args({"--speculative-config": '{"method":"mtp","num_speculative_tokens":3}'}, None) == {
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 3}
    }
    assert DRIVER.requested_args({"--enable-custom-all-reduce": True, "-tp": "8"}, None) == {
        "disable_custom_all_reduce": False,
        "tensor_parallel_size": 8,
    }


def test_spec_decode_acceptance_comes_from_the_counters():
    text = (
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 40.0\n'
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 10.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 75.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 40.0\n'
    )
    now = spec_counters(text)
    assert now == SpecDecodeCounters(50.0, 75.0)
    assert now.accept_length_since(SpecDecodeCounters(10.0, 15.0)) == 2.5
    assert now.accept_length_since(now) is None  # no drafts in between: nothing to say
    assert spec_counters('vllm:generation_tokens_total{engine="0"} 5.0\n') is None


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.version for c in CONTRACTS])
def test_the_example_configs_vllm_box_launches_what_vllms_parser_accepts(contract):
    from workers.config import load_config
    from workers.presets import check_launch

    example = load_config(str(Path(__file__).resolve().parents[1] / "deploy" / "benchbot.example.toml"))
    host = example.host("gpu-3")
    parser = contract.build_parser(exit_on_error=False)
    parser.add_argument("model_tag")
    for word in example.presets_for("vllm"):
        spec = build_launch(example, host, [word], version=contract.version)
        assert check_launch(spec, contract) == [], word
        ns = parser.parse_args(list(spec.argv[len(host.engine.command) :]))
        assert ns.model_tag == host.engine.model and ns.port == 8000, word


def test_the_kv_cache_the_server_resolved_is_read_from_its_cache_config_info():
    from bot.render import _kv_cache
    from workers.engines.vllm.driver import cache_config

    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",'
        'enable_prefix_caching="True",engine="0",kv_cache_memory_bytes="1073741824",num_cpu_blocks="None",'
        'num_gpu_blocks="32768",prefix_caching_hash_algo="sha256"} 1.0\n'
    )
    cache = cache_config(text)
    assert cache == {
        "block_size": "16",
        "num_gpu_blocks": "32768",
        "cache_dtype": "auto",
        "enable_prefix_caching": "True",
        "kv_cache_memory_bytes": "1073741824",
    }
    assert _kv_cache(cache) == "32,768 blocks of 16 tokens (524,288 tokens), auto dtype, prefix caching on"
    assert cache_config("vllm:num_requests_running 0\n") == {}
