"""Engine options allowed by what they do (issue 25, finding 2): member, admin-only or reserved.

Every option of every recorded contract is classified (a new release's contract fails here until
someone decides about its new options); the flags the red team got through are refused for members
with the reason named, allowed for admins; JSON-valued options are judged by their keys; the
dispatcher judges a flag in the host's own engine and refuses without queueing anything.
"""

from __future__ import annotations

import json

import pytest

from bot.dispatch import Dispatcher
from workers.config import EMBEDDED_TOML, SEED_PRESETS_TOML, parse_config
from workers.engines.contract import CONTRACTS_DIR, Contract, all_contracts, load_contract
from workers.engines.option_policy import Level, engines, policy
from workers.errors import BenchbotError
from workers.jobs import queue
from workers.presets import build_launch, check_launch
from workers.reserved_flags import check_raw_flag, raw_flag_problem, unrecorded_version_problems

#: Every contract file present, whoever added it (a new engine release included).
ALL_CONTRACTS: list[Contract] = [
    load_contract(*path.stem.split("-", 1)) for path in sorted(CONTRACTS_DIR.glob("*.json"))
]


@pytest.mark.parametrize("contract", ALL_CONTRACTS, ids=[c.label() for c in ALL_CONTRACTS])
def test_every_option_of_every_recorded_contract_is_classified(contract: Contract) -> None:
    assert contract.engine in engines(), f"{contract.label()}: option_policy.toml has no [{contract.engine}] table"
    missing = policy(contract.engine).unclassified(contract)
    assert not missing, (
        f"{contract.label()} has options workers/engines/option_policy.toml does not classify: {missing}; "
        "put each under member, admin.<why> or reserved.<why>"
    )


def test_the_policy_lists_only_real_options_each_once() -> None:
    for engine in engines():
        known = {o.dest for c in all_contracts(engine) for o in c.options}
        listed = set(policy(engine).levels)
        assert listed <= known, f"{engine}: not options of any recorded version: {sorted(listed - known)}"


def test_an_option_the_policy_does_not_know_is_admin_only() -> None:
    # a contract dumped from a host at run time may carry options nobody has classified: fail closed
    verdict = policy("vllm").judge("some_new_plugin_path")
    assert verdict.level is Level.ADMIN and verdict.reason == "unlisted"
    assert policy("nonesuch").judge("tp_size").level is Level.ADMIN


VLLM = all_contracts("vllm")
SGLANG = all_contracts("sglang")

#: (flag, value, the words the refusal must carry) for every flag of the finding, on vLLM.
VLLM_REFUSED = [
    ("--worker-cls", "evil.Worker", "names a class"),
    ("--scheduler-cls", "evil.Scheduler", "names a class"),
    ("--worker-extension-cls", "evil.Ext", "names a class"),
    ("--middleware", "evil.middleware", "names Python code"),
    ("--speculative-config", '{"model": "someone/else", "method": "eagle"}', 'key "model" names another model'),
    ("--log-config-file", "/etc/shadow", "names a file or directory"),
    ("--generation-config", "/etc", "names a file or directory"),
    ("--compilation-config", '{"debug_dump_path": "/tmp/x"}', 'key "debug_dump_path" names a file'),
    ("--compilation-config", '{"backend": "evil.compile"}', 'key "backend" names Python code'),
    ("--chat-template", "/etc/shadow", "names a file or directory"),
    ("--hf-overrides", '{"architectures": ["Evil"]}', "names another model"),
    ("--kv-transfer-config", '{"kv_connector": "Evil"}', 'key "kv_connector" names a class'),
    ("--kv-transfer-config", '{"kv_connector_module_path": "evil"}', "names Python code"),
    ("--otlp-traces-endpoint", "http://10.0.0.1:4317", "names an address or URL"),
    ("--tool-parser-plugin", "/tmp/evil.py", "names Python code"),
    ("--logits-processors", "evil.Proc", "names Python code"),
    ("--spec-model", "someone/else", "names another model"),
    ("--trust-remote-code", True, "changes what the engine trusts"),
    ("--distributed-executor-backend", "evil.Executor", 'value "evil.Executor" is more than a member may set'),
]

SGLANG_REFUSED = [
    ("--chat-template", "/etc/shadow", "names a file or directory"),
    ("--completion-template", "/etc/shadow", "names a file or directory"),
    ("--speculative-draft-model-path", "someone/else", "names another model"),
    ("--custom-weight-loader", "evil.load", "names Python code"),
    ("--forward-hooks", '[{"target_modules": ["x"], "hook_factory": "evil.f"}]', "names Python code"),
    ("--crash-dump-folder", "/tmp/dump", "names a file or directory"),
    ("--otlp-traces-endpoint", "10.0.0.1:4317", "names an address or URL"),
    ("--tool-server", "http://10.0.0.1", "names an address or URL"),
    ("--init-expert-location", "/tmp/experts.pt", "names a file or directory"),
    ("--delete-ckpt-after-loading", True, "names a file or directory"),
    ("--cuda-graph-config", '{"decode": {"max_bs": 8}, "dump": "/tmp"}', 'key "dump" is more than a member may set'),
]


@pytest.mark.parametrize(("flag", "value", "why"), VLLM_REFUSED, ids=[f"{f} {v}"[:60] for f, v, _ in VLLM_REFUSED])
def test_vllm_options_that_name_code_files_addresses_or_models_are_for_admins(
    flag: str, value: str | bool, why: str
) -> None:
    problem = raw_flag_problem(flag, value, VLLM, admin=False)
    assert problem is not None and why in problem and "only an admin may give it" in problem, problem
    assert problem.startswith(flag)
    assert raw_flag_problem(flag, value, VLLM, admin=True) is None
    with pytest.raises(BenchbotError, match="only an admin"):
        check_raw_flag(flag, value, admin=False, engine="vllm")
    check_raw_flag(flag, value, admin=True, engine="vllm")


@pytest.mark.parametrize(("flag", "value", "why"), SGLANG_REFUSED, ids=[f"{f} {v}"[:60] for f, v, _ in SGLANG_REFUSED])
def test_sglang_options_that_name_code_files_addresses_or_models_are_for_admins(
    flag: str, value: str | bool, why: str
) -> None:
    problem = raw_flag_problem(flag, value, SGLANG, admin=False)
    assert problem is not None and why in problem and "only an admin may give it" in problem, problem
    assert raw_flag_problem(flag, value, SGLANG, admin=True) is None


@pytest.mark.parametrize(
    ("engine", "flag", "value"),
    [
        ("vllm", "--uds", "/tmp/sock"),
        ("vllm", "--headless", True),
        ("vllm", "--grpc", True),
        ("vllm", "--data-parallel-supervisor-port", "9000"),
        ("vllm", "--ssl-ciphers", "ALL"),
        ("vllm", "--hf-token", "hf_x"),
        ("sglang", "--por", "1"),
        ("sglang", "--grpc-mode", True),
        ("sglang", "--config", "/tmp/args.yaml"),
    ],
)
def test_reserved_options_are_refused_even_for_admins(engine: str, flag: str, value: str | bool) -> None:
    problem = raw_flag_problem(flag, value, all_contracts(engine), admin=True)
    assert problem is not None and "set by benchbot from the host config" in problem and "(it " in problem


@pytest.mark.parametrize(
    ("engine", "flag", "value"),
    [
        ("vllm", "--moe-backend", "flashinfer_cutlass"),
        ("vllm", "--linear-backend", "flashinfer_cudnn"),
        ("vllm", "--attention-backend", "FLASHINFER"),
        ("vllm", "--tensor-parallel-size", "8"),
        ("vllm", "--tensor-p", "8"),  # a prefix: judged as the option it becomes
        ("vllm", "--max-num-seqs", "256"),
        ("vllm", "--gpu-memory-utilization", "0.9"),
        ("vllm", "--enable-prefix-caching", True),
        ("vllm", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}'),
        ("vllm", "--speculative-config", '{"method": "ngram", "prompt_lookup_max": 4}'),
        ("vllm", "--compilation-config", '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'),
        ("vllm", "--compilation-config", "3"),
        ("vllm", "--kv-transfer-config", '{"kv_role": "kv_both"}'),
        ("vllm", "--distributed-executor-backend", "mp"),
        ("vllm", "--served-model-name", "mine"),
        ("sglang", "--tp", "8"),
        ("sglang", "--moe-runner-backend", "flashinfer_cutlass"),
        ("sglang", "--speculative-algorithm", "NEXTN"),
        ("sglang", "--speculative-num-steps", "3"),
        ("sglang", "--mem-fraction-static", "0.8"),
        ("sglang", "--cuda-graph-config", '{"decode": {"backend": "full", "max_bs": 256}}'),
        ("sglang", "--enable-metrics", True),
    ],
)
def test_backends_sizes_cache_and_speculative_knobs_are_for_members(engine: str, flag: str, value: str | bool) -> None:
    assert raw_flag_problem(flag, value, all_contracts(engine), admin=False) is None


def test_a_json_option_is_judged_by_its_keys() -> None:
    ok = '{"method": "mtp", "num_speculative_tokens": 3}'
    assert raw_flag_problem("--speculative-config", ok, VLLM, admin=False) is None
    with_model = json.dumps({"method": "eagle", "num_speculative_tokens": 3, "model": "someone/else"})
    problem = raw_flag_problem("--speculative-config", with_model, VLLM, admin=False)
    assert problem and 'key "model"' in problem and "names another model" in problem
    unknown = raw_flag_problem("--speculative-config", '{"method": "mtp", "something_new": 1}', VLLM, admin=False)
    assert unknown and 'key "something_new"' in unknown and "num_speculative_tokens" in unknown  # says what is allowed
    not_object = raw_flag_problem("--speculative-config", "mtp", VLLM, admin=False)
    assert not_object and "not a JSON object" in not_object
    # vLLM's dotted form sets one key (the grammar refuses dots; the worker's check holds anyway)
    dotted = raw_flag_problem("--speculative-config.model", "someone/else", VLLM, admin=False)
    assert dotted and 'key "model"' in dotted
    assert raw_flag_problem("--speculative-config.method", "mtp", VLLM, admin=False) is None


def test_the_worker_judges_values_against_the_hosts_version() -> None:
    config = parse_config(EMBEDDED_TOML.replace('default_host = "sim"', 'default_host = "v"', 1) + _VLLM_HOST)
    host = config.host("v")
    raw = (("--moe-backend", "flashinfer_cutlass"), ("--speculative-config", '{"model": "x/y", "method": "eagle"}'))
    spec = build_launch(config, host, (), raw, version="0.34.0")
    contract = load_contract("vllm", "0.34.0")
    problems = check_launch(spec, contract, admin=False)
    assert len(problems) == 1 and 'key "model"' in problems[0] and "vLLM" not in problems[0].split(":")[0]
    assert check_launch(spec, contract, admin=True) == []


_VLLM_HOST = """
[hosts.v]
port = 30017
[hosts.v.engine]
kind = "vllm"
command = ["vllm", "serve"]
model = "nvidia/Qwen3.5-397B-A17B-NVFP4"
"""

DISPATCH_CONFIG = (
    """
default_host = "gpu-1"
[hosts.gpu-1]
[hosts.vllm-1]
port = 8000
[hosts.vllm-1.engine]
kind = "vllm"
command = ["vllm", "serve"]
model = "nvidia/Qwen3.5-397B-A17B-NVFP4"
[access]
users = ["alice", "root"]
channels = ["C-bench"]
admins = ["root"]
"""
    + SEED_PRESETS_TOML
)


@pytest.fixture
def dispatcher(redis_client, tmp_path) -> Dispatcher:
    return Dispatcher(parse_config(DISPATCH_CONFIG), redis_client, plots_dir=tmp_path, observe_timeout_s=0.2)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("/launch cutlass --worker-cls evil.Worker on vllm-1", "names a class"),
        ("/launch cutlass --scheduler-cls evil.Sched on vllm-1", "names a class"),
        ("/launch cutlass --middleware evil.mw on vllm-1", "names Python code"),
        ("/launch cutlass --log-config-file /etc/shadow on vllm-1", "names a file"),
        ("/launch cutlass --generation-config /etc on vllm-1", "names a file"),
        ("/launch cutlass --chat-template /etc/shadow on vllm-1", "names a file"),
        ("/launch cutlass --chat-template /etc/shadow", "names a file"),
        ('/launch cutlass --speculative-config \'{"model":"someone/else"}\' on vllm-1', 'key "model"'),
        ('/launch cutlass --compilation-config \'{"debug_dump_path":"/tmp"}\' on vllm-1', "names a file"),
        ("/sweep cutlass --chat-template /etc/shadow, cudnn bench 1", "names a file"),
    ],
)
def test_the_dispatcher_refuses_a_members_flag_by_what_it_does_and_queues_nothing(
    dispatcher: Dispatcher, redis_client, line: str, why: str
) -> None:
    before = set(redis_client.keys("*"))
    reply = dispatcher.handle("alice", "C-bench", line)
    assert not reply.ok and why in reply.text and "only an admin may give it" in reply.text, reply.text
    assert set(redis_client.keys("*")) == before
    assert queue.list_jobs(redis_client, "vllm-1") == [] and queue.list_jobs(redis_client, "gpu-1") == []


def test_an_admin_may_give_admin_only_flags_and_a_member_the_member_ones(dispatcher: Dispatcher, redis_client) -> None:
    reply = dispatcher.handle("root", "C-bench", "/launch cutlass --worker-cls my.Worker on vllm-1")
    assert reply.ok and reply.job_id, reply.text
    reply = dispatcher.handle(
        "alice", "C-bench", '/launch cutlass --speculative-config \'{"method":"mtp"}\' --max-num-seqs 64 on vllm-1'
    )
    assert reply.ok and reply.job_id, reply.text
    assert len(queue.list_jobs(redis_client, "vllm-1")) == 2


def test_a_host_version_without_a_contract_judges_flags_in_every_recorded_one_and_fails_closed() -> None:
    flags = [("--moe-backend", "flashinfer_cutlass"), ("--worker-cls", "evil.W"), ("--brand-new-plugin", "x")]
    problems = unrecorded_version_problems(flags, "vllm", admin=False)
    assert len(problems) == 2, problems
    assert "--worker-cls names a class" in problems[0]
    assert "--brand-new-plugin is not an option of any vLLM version benchbot has recorded" in problems[1]
    assert unrecorded_version_problems(flags, "vllm", admin=True) == []
    assert unrecorded_version_problems([("--tp", "8")], "sglang", admin=False) == []
