"""benchbot.toml loading: the embedded default, the example file, and errors that name the key."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.config import EMBEDDED_SOURCE, EMBEDDED_TOML, find_config_path, load_config, parse_config
from workers.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
MINIMAL = """
[engine]
model = "m"
[hosts.gpu-1]
transport = "ssh"
ssh_target = "10.0.0.5"
"""


def test_embedded_default_is_a_simulated_sglang_host_and_a_vllm_host_with_the_seed_presets(
    monkeypatch, tmp_path, state_dir
):
    monkeypatch.delenv("BENCHBOT_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    config = load_config()
    assert config.source == EMBEDDED_SOURCE
    # issue 15: a mixed fleet out of the box, SGLang's simulated host (the default) and vLLM's; issue 38: a pair
    assert list(config.hosts) == ["sim", "sim-vllm", "pair-a", "pair-b"] and config.default_host == "sim"
    vllm = config.hosts["sim-vllm"]
    assert vllm.engine.kind == "vllm" and vllm.engine.command[1:] == ("-m", "workers.sim.vllm", "serve")
    assert vllm.port not in (8000, config.hosts["sim"].port) and vllm.log_dir == str(state_dir / "logs")
    assert (state_dir / "sim-vllm-port").read_text().strip() == str(vllm.port)
    assert {"cutlass", "cudnn", "mtp"} <= set(config.presets_for("vllm"))
    sim = config.hosts["sim"]
    # Not 30000 and /tmp/benchbot (someone else's on a shared box): this user's port, the state dir (16.5).
    assert sim.transport == "local" and sim.port != 30000 and sim.gpus == 8
    assert sim.log_dir == str(state_dir / "logs")
    assert (state_dir / "sim-port").read_text().strip() == str(sim.port)
    assert sim.engine is config.default_engine  # no [hosts.sim.engine]: the default engine
    assert sim.engine.command[0] == sys.executable
    assert sim.engine.command[1:] == ("-m", "workers.sim.sglang")
    assert set(config.presets) == {
        "cutlass",
        "cutedsl",
        "trtllm",
        "triton",
        "cudnn",
        "fp4-cutlass",
        "nextn",
        "customar",
        "mscclpp",
    }
    assert {config.presets[p].group for p in ("cutlass", "cutedsl", "trtllm", "triton")} == {"moe"}
    assert {config.presets[p].group for p in ("cudnn", "fp4-cutlass")} == {"fp4"}
    nextn = dict(config.presets["nextn"].flags)
    assert nextn["--speculative-algorithm"] == "NEXTN"
    assert (
        nextn["--speculative-num-steps"],
        nextn["--speculative-eagle-topk"],
        nextn["--speculative-num-draft-tokens"],
    ) == ("3", "1", "4")
    assert nextn["--mamba-scheduler-strategy"] == "extra_buffer"
    assert config.presets["nextn"].env == {"SGLANG_ENABLE_SPEC_V2": "1"}
    assert config.presets["customar"].remove == ("--disable-custom-all-reduce",)
    assert dict(config.presets["mscclpp"].flags) == {"--enable-mscclpp": True}
    base = dict(sim.engine.flags)
    assert base == {"--tp-size": "8", "--quantization": "modelopt_fp4", "--disable-custom-all-reduce": True}
    assert sim.engine.model == "nvidia/Qwen3.5-397B-A17B-NVFP4"


def test_example_config_in_deploy_loads_a_mixed_fleet_and_the_seed_presets():
    config = load_config(str(ROOT / "deploy" / "benchbot.example.toml"))
    assert list(config.hosts) == ["gpu-1", "gpu-2", "sim", "gpu-3"]
    vllm = config.hosts["gpu-3"].engine  # a vLLM box: its own command and flags, [engine]'s model
    assert vllm.kind == "vllm" and vllm.command == ("/opt/vllm/bin/vllm", "serve")
    assert vllm.model == config.default_engine.model and ("--tensor-parallel-size", "8") in vllm.flags
    assert set(config.presets_for("vllm")) == {"cutlass", "cudnn", "mtp", "customar"}
    assert {"cutlass", "cudnn", "nextn", "customar", "mscclpp", "trtllm", "cutedsl"} <= set(config.presets)
    real, sim = config.hosts["gpu-1"].engine, config.hosts["sim"].engine
    assert real is config.hosts["gpu-2"].engine is config.default_engine
    assert real.command == ("python3", "-m", "sglang.launch_server")
    assert sim.command == (sys.executable, "-m", "workers.sim.sglang")
    assert sim.env == {"BENCHBOT_SIM_SGLANG_VERSION": "0.5.23"} and sim.launch_timeout_s == 120
    assert (sim.model, sim.flags) == (real.model, real.flags)  # keys it does not give are [engine]'s
    assert config.hosts["sim"].nvidia_smi == (sys.executable, "-m", "workers.sim.nvidia_smi")


MIXED = """
[engine]
command = ["python3", "-m", "sglang.launch_server"]
model = "org/default-model"
flags = { "--tp-size" = 8, "--disable-custom-all-reduce" = true }
env = { NCCL_P2P_LEVEL = "SYS" }
api_key_env = "TEAM_KEY"
pass_env = ["HF_TOKEN"]
launch_timeout_s = 1200
version_command = ["/opt/sglang-version"]

[hosts.real]

[hosts.sim]
port = 30001

[hosts.sim.engine]
command = ["{python}", "-m", "workers.sim.sglang"]
model = "org/sim-model"
flags = { "--tp-size" = 4 }
api_key_env = "SIM_KEY"
launch_timeout_s = 60
version_command = []
"""


def test_a_hosts_engine_table_replaces_the_keys_it_gives_and_keeps_the_rest():
    config = parse_config(MIXED, "team.toml")
    real, sim = config.hosts["real"].engine, config.hosts["sim"].engine
    assert real is config.default_engine and real.model == "org/default-model"
    assert sim.command == (sys.executable, "-m", "workers.sim.sglang") and sim.model == "org/sim-model"
    assert sim.flags == (("--tp-size", "4"),)  # a table is replaced whole, not merged into the default's
    assert (sim.api_key_env, sim.launch_timeout_s) == ("SIM_KEY", 60.0)
    assert sim.env == {"NCCL_P2P_LEVEL": "SYS"} and sim.pass_env == ("HF_TOKEN",)  # not given: the default's
    assert sim.kind == "sglang"
    assert not sim.version_command and real.version_command == ("/opt/sglang-version",)  # [] derives it again


def test_each_host_reads_its_own_api_key_variable_from_the_environment_only():
    config = parse_config(MIXED, "team.toml")
    environ = {"TEAM_KEY": "sk-team-1234", "SIM_KEY": "sk-sim-5678"}
    assert config.hosts["real"].engine.api_key(environ) == "sk-team-1234"
    assert config.hosts["sim"].engine.api_key(environ) == "sk-sim-5678"
    assert config.hosts["sim"].engine.api_key({}) is None
    assert parse_config("[hosts.a]").hosts["a"].engine.api_key({"TEAM_KEY": "x"}) is None  # no variable named


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[hosts.a]\n[hosts.b.engine]\nmodel = 3", r"hosts\.b\.engine\.model: expected a non-empty string"),
        # vLLM is supported since issue 15; an engine benchbot has no driver for is not
        (
            "[hosts.a]\n[hosts.b.engine]\nkind = 'tgi'",
            r"hosts\.b\.engine\.kind: 'tgi' is not supported \(supported: sglang, vllm, trtllm\)",
        ),
        ("[hosts.a]\n[hosts.b.engine]\nbogus = 1", r"hosts\.b\.engine\.bogus: unknown key \(allowed: api_key_env"),
        ("[hosts.a]\n[hosts.b.engine]\ncommand = []", r"hosts\.b\.engine\.command: must name the program"),
        ("[hosts.a]\n[hosts.b]\nengine = 'sim'", r"hosts\.b\.engine: expected a table"),
        (
            "[hosts.a]\n[hosts.b.engine]\nlaunch_timeout_s = 0",
            r"hosts\.b\.engine\.launch_timeout_s: 0 is out of range",
        ),
        (
            "[hosts.a]\n[hosts.b.engine]\nflags = { '--tp' = false }",
            r'hosts\.b\.engine\.flags\."--tp": use true for a bare flag',
        ),
        (
            "[hosts.a]\n[hosts.b.engine]\npass_env = ['SLACK_BOT_TOKEN']",
            r"hosts\.b\.engine\.pass_env\[0\]: SLACK_BOT_TOKEN is benchbot's own secret",
        ),
        # the host's key variable against the default's pass_env: the key named is where the list came from
        (
            "[engine]\npass_env = ['K']\n[hosts.a]\n[hosts.b.engine]\napi_key_env = 'K'",
            r"engine\.pass_env\[0\]: K holds the engine's API key, which reaches it through a private file "
            r"\(hosts\.b\.engine\.api_key_env\)",
        ),
    ],
)
def test_host_engine_errors_name_the_host_table_and_the_key(text, expected):
    with pytest.raises(ConfigError, match=expected) as info:
        parse_config(text, "team.toml")
    assert str(info.value).startswith("team.toml: ")


def test_pass_env_names_what_the_engine_may_see_and_the_embedded_default_names_the_simulators():
    config = parse_config("[hosts.a]\n[engine]\npass_env = ['HF_TOKEN', 'CUDA_HOME', 'HF_TOKEN']", "team.toml")
    assert config.hosts["a"].engine.pass_env == ("HF_TOKEN", "CUDA_HOME")
    assert parse_config("[hosts.a]", "team.toml").hosts["a"].engine.pass_env == ()
    embedded = parse_config(EMBEDDED_TOML, EMBEDDED_SOURCE)
    assert {"BENCHBOT_SIM_STATE_DIR", "BENCHBOT_SIM_STARTUP_S"} <= set(embedded.hosts["sim"].engine.pass_env)


def test_config_found_via_flag_then_env_then_cwd(monkeypatch, tmp_path):
    a, b = tmp_path / "a.toml", tmp_path / "benchbot.toml"
    a.write_text(MINIMAL)
    b.write_text(MINIMAL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BENCHBOT_CONFIG", str(a))
    assert find_config_path(str(b)) == b
    assert find_config_path(None) == a
    monkeypatch.delenv("BENCHBOT_CONFIG")
    assert find_config_path(None) == Path("benchbot.toml")
    with pytest.raises(ConfigError, match="does not exist"):
        find_config_path(str(tmp_path / "missing.toml"))


def test_lease_margin_defaults_to_a_sixth_of_the_ttl_or_takes_the_configured_value():
    assert parse_config(MINIMAL).limits.lease_margin_s == 5.0
    assert parse_config(MINIMAL + "[limits]\nlease_ttl_s = 3\n").limits.lease_margin_s == 0.5
    assert parse_config(MINIMAL + "[limits]\nlease_ttl_s = 60\nlease_margin_s = 20\n").limits.lease_margin_s == 20.0


def test_ssh_host_defaults_reach_the_engine_on_the_ssh_target():
    config = parse_config(MINIMAL)
    host = config.hosts["gpu-1"]
    assert host.transport == "ssh" and host.http_host == "10.0.0.5"
    assert host.base_url == "http://10.0.0.5:30000"
    assert config.default_host == "gpu-1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[hosts.a]\ntransport = 'telnet'", r"hosts\.a\.transport: 'telnet' is not 'local' or 'ssh'"),
        ("[hosts.a]\nport = 70000", r"hosts\.a\.port: 70000 is out of range"),
        ("[hosts.a]\ntransport = 'ssh'", r"hosts\.a\.ssh_target: expected a non-empty string"),
        ("[hosts.a]\nbogus = 1", r"hosts\.a\.bogus: unknown key"),
        ("[hosts.A]", r"hosts\.A: host names are lower-case"),
        ("", r"hosts: at least one host is required"),
        ("[hosts.a]\n[presets.x]\nflags = { '-x' = '1' }", r'presets\.x\.flags\."-x": engine flags look like'),
        ("[hosts.a]\n[presets.x]\ndescription = 'nothing'", r"presets\.x: a preset must set"),
        ("[hosts.a]\n[presets.x]\nflags = {'--a'=1}\nrequires = ['y']", r"presets\.x\.requires: 'y' is not a preset"),
        ("[hosts.a]\n[engine]\nkind = 'tgi'", r"engine\.kind: 'tgi' is not supported"),
        ("[hosts.a]\n[limits]\nmax_levels = 0", r"limits\.max_levels: 0 is out of range"),
        ("[hosts.a]\n[limits]\nlease_margin_s = 0", r"limits\.lease_margin_s: 0 must be above 0 and at most a third"),
        (
            "[hosts.a]\n[limits]\nlease_ttl_s = 30\nlease_margin_s = 10.5",
            r"limits\.lease_margin_s: 10\.5 must be above 0 and at most a third of limits\.lease_ttl_s "
            r"\(30 s / 3 = 10 s\)",
        ),
        ("[hosts.a]\n[limits]\nlease_margin_s = 'x'", r"limits\.lease_margin_s: expected a number"),
        ("[hosts.a]\n[access]\nusers = ['a b']", r"access\.users\[0\]: 'a b' is not valid"),
        ("[hosts.a]\n[engine]\nenv = { 'BAD-NAME' = 'x' }", r"engine\.env\.BAD-NAME: not a valid environment"),
        ("[hosts.a]\n[engine]\npass_env = ['HF-TOKEN']", r"engine\.pass_env\[0\]: 'HF-TOKEN' is not valid"),
        ("[hosts.a]\n[engine]\npass_env = 'HF_TOKEN'", r"engine\.pass_env: expected a list"),
        (
            "[hosts.a]\n[engine]\npass_env = ['HF_TOKEN', 'SLACK_BOT_TOKEN']",
            r"engine\.pass_env\[1\]: SLACK_BOT_TOKEN is benchbot's own secret",
        ),
        ("[hosts.a]\n[engine]\npass_env = ['REDIS_URL']", r"engine\.pass_env\[0\]: REDIS_URL is benchbot's own"),
        (
            "[hosts.a]\n[engine]\napi_key_env = 'K'\npass_env = ['K']",
            r"engine\.pass_env\[0\]: K holds the engine's API key, which reaches it through a private file",
        ),
        ("default_host = 'b'\n[hosts.a]", r"default_host: 'b' is not one of the hosts"),
        ("[hosts.a\n", r"not valid TOML"),
    ],
)
def test_validation_errors_name_the_file_and_the_key(text, expected):
    with pytest.raises(ConfigError, match=expected) as info:
        parse_config(text, "team.toml")
    assert str(info.value).startswith("team.toml: ")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_config_loader_never_raises_anything_but_a_config_error(text):
    try:
        parse_config(text, "fuzz.toml")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.toml")


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["port", "gpus", "transport", "ssh_target", "env", "bind", "nvidia_smi"]),
        st.one_of(
            st.integers(-5, 70000), st.text(max_size=20), st.booleans(), st.lists(st.text(max_size=5), max_size=3)
        ),
    )
)
def test_host_tables_with_random_values_fail_clearly_or_load(values):
    import tomllib  # noqa: F401  (the loader's own parser; here we build the dict directly)

    from workers.config import _Validator

    try:
        _Validator("fuzz.toml").config({"hosts": {"a": values}})
    except ConfigError as exc:
        assert "fuzz.toml: " in str(exc)


def test_embedded_port_is_picked_free_once_and_shared_by_every_process(monkeypatch, tmp_path, state_dir):
    """The bot, its workers and a restarted worker must agree on the port: one pick, kept in the state dir."""
    import socket
    import subprocess

    monkeypatch.delenv("BENCHBOT_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    code = "from workers.config import load_config; print(load_config().hosts['sim'].port)"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    ports = {
        int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)
        for _ in range(2)
    }
    assert ports == {load_config().hosts["sim"].port}
    with socket.socket() as sock:  # it was free when picked (nothing here listens on it)
        assert sock.connect_ex(("127.0.0.1", ports.pop())) != 0


@pytest.mark.parametrize(
    ("hosts", "clash"),
    [
        ("[hosts.a]\n[hosts.b]\n", "hosts.b.port: 30000 is also the engine port of host 'a' on this machine (local)"),
        ("[hosts.a]\nport = 8000\n[hosts.b]\ntransport = 'local'\nport = 8000\n", "hosts.b.port: 8000 is also"),
        (
            "[hosts.a]\ntransport = 'ssh'\nssh_target = 'Box1'\n[hosts.b]\ntransport = 'ssh'\nssh_target = 'me@box1'\n",
            "hosts.b.port: 30000 is also the engine port of host 'a' on the same machine (box1)",
        ),
        (
            "[hosts.a]\n[hosts.b]\ntransport = 'ssh'\nssh_target = 'localhost'\n",
            "hosts.b.port: 30000 is also the engine port of host 'a' on this machine (local)",
        ),
    ],
)
def test_two_hosts_on_one_machine_with_one_port_are_refused(hosts: str, clash: str, tmp_path: Path) -> None:
    """Issue 25 item 4: a launch on one would stop the other's engine mid-bench; `config check` says so."""
    import subprocess

    with pytest.raises(ConfigError, match="a launch on one would stop the other's engine") as caught:
        parse_config(hosts, "team.toml")
    assert str(caught.value).startswith(f"team.toml: {clash}"), caught.value
    path = tmp_path / "benchbot.toml"
    path.write_text(hosts)
    env = {k: v for k, v in os.environ.items() if k != "BENCHBOT_CONFIG"}
    checked = subprocess.run(
        [sys.executable, "-m", "bot.cli", "--config", str(path), "config", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode != 0 and clash in checked.stderr + checked.stdout, (checked.stdout, checked.stderr)


def test_hosts_on_other_machines_or_other_ports_may_share_a_port_number() -> None:
    config = parse_config(
        "[hosts.a]\n[hosts.b]\nport = 30001\n"
        "[hosts.c]\ntransport = 'ssh'\nssh_target = 'box1'\n[hosts.d]\ntransport = 'ssh'\nssh_target = 'box2'\n"
    )
    assert [h.port for h in config.hosts.values()] == [30000, 30001, 30000, 30000]


def test_a_host_without_a_port_watches_its_engines_own_default_port() -> None:
    """A teammate's hand-started `vllm serve` listens on 8000, SGLang's on 30000: an unset port looks there."""
    config = parse_config(
        "[hosts.sgl]\n"
        "[hosts.vl]\ntransport = 'ssh'\nssh_target = 'box1'\n[hosts.vl.engine]\nkind = 'vllm'\n"
        "[hosts.trt]\ntransport = 'ssh'\nssh_target = 'box2'\n[hosts.trt.engine]\nkind = 'trtllm'\n"
        "[hosts.set]\ntransport = 'ssh'\nssh_target = 'box3'\nport = 9000\n[hosts.set.engine]\nkind = 'vllm'\n"
    )
    assert {name: h.port for name, h in config.hosts.items()} == {"sgl": 30000, "vl": 8000, "trt": 8000, "set": 9000}
