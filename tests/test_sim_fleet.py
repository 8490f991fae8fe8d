"""Two simulated hosts on one machine: each has its own fake GPUs with no variable set by hand (issue 16.1)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.util import free_port
from workers.config import EMBEDDED_TOML, parse_config
from workers.engines.sglang.diagnosis import diagnose, without_satisfied_hints
from workers.host import simulated as fleet
from workers.host.engine_env import engine_env
from workers.presets import build_launch
from workers.sim.launcher import start_sim


def two_sim_hosts(port_a: int, port_b: int):
    """The embedded default plus a second simulated host: nothing sets a sim state dir per host."""
    text = EMBEDDED_TOML.replace("port = 30000", f"port = {port_a}") + (
        f'\n[hosts.sim-2]\ntransport = "local"\nport = {port_b}\n'
        'nvidia_smi = ["{python}", "-m", "workers.sim.nvidia_smi"]\n'
    )
    return parse_config(text, "two-sims.toml")


def _apps(host, worker_env: dict[str, str]) -> set[int]:
    argv = [*fleet.nvidia_smi_argv(host, worker_env), "--query-compute-apps=pid,used_memory", "--format=csv,noheader"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True, env=worker_env).stdout
    return {int(line.split(",")[0]) for line in out.splitlines() if line.strip()}


def test_second_simulated_host_gets_its_own_gpus(tmp_path: Path) -> None:
    """One worker env (one BENCHBOT_SIM_STATE_DIR, as `benchbot worker --host sim --host sim-2` has) serves
    two simulated hosts: both engines load 8 GPUs' worth of weights, and each host's nvidia-smi shows only
    its own engine. Before, both shared one registry: the second launch ran out of memory."""
    config = two_sim_hosts(free_port(), free_port())
    worker_env = {"BENCHBOT_SIM_STATE_DIR": str(tmp_path / "sim"), "PATH": "/usr/bin:/bin"}
    sims = []
    try:
        for name in ("sim", "sim-2"):
            host = config.host(name)
            assert fleet.is_simulated(host)
            spec = build_launch(config, host, ["cutlass", "cudnn"])
            env = engine_env(host, spec, worker_env)
            assert env["BENCHBOT_SIM_STATE_DIR"] == f"{tmp_path}/sim/hosts/{name}"
            args = list(spec.argv[spec.argv.index("workers.sim.sglang") + 1 :])
            sims.append(start_sim(host.port, *args, env=env, log_path=tmp_path / f"{name}.log"))
        pids = [_apps(config.host(name), worker_env) for name in ("sim", "sim-2")]
        assert pids[0] and pids[1], pids
        assert not pids[0] & pids[1], "each host's nvidia-smi shows only its own engine"
    finally:
        for sim in sims:
            sim.stop()


def test_state_dir_in_host_env_wins_for_engine_and_nvidia_smi(tmp_path: Path) -> None:
    config = parse_config(
        EMBEDDED_TOML.replace(
            'transport = "local"', f'transport = "local"\nenv = {{ BENCHBOT_SIM_STATE_DIR = "{tmp_path}" }}'
        ),
        "x.toml",
    )
    host = config.host("sim")
    assert fleet.nvidia_smi_argv(host, {})[-1] == f"--sim-state-dir={tmp_path}"
    assert engine_env(host, build_launch(config, host, []), {})["BENCHBOT_SIM_STATE_DIR"] == str(tmp_path)


def test_real_host_gets_no_sim_settings() -> None:
    config = parse_config(
        EMBEDDED_TOML.replace(
            '["{python}", "-m", "workers.sim.sglang"]', '["python3", "-m", "sglang.launch_server"]'
        ).replace('nvidia_smi = ["{python}", "-m", "workers.sim.nvidia_smi"]\n', ""),
        "real.toml",
    )
    host = config.host("sim")
    assert not fleet.is_simulated(host)
    assert fleet.nvidia_smi_argv(host, {}) == ["nvidia-smi"]
    assert "BENCHBOT_SIM_STATE_DIR" not in engine_env(host, build_launch(config, host, []), {})


OOM_LOG = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"


def test_oom_hint_does_not_ask_for_spec_v2_when_set() -> None:
    found = diagnose(OOM_LOG, exited=True, returncode=1, timed_out=False)
    assert "SGLANG_ENABLE_SPEC_V2=1" in found.summary
    assert without_satisfied_hints(found, {}) == found
    done = without_satisfied_hints(found, {"SGLANG_ENABLE_SPEC_V2": "1"})
    assert done.category == "oom" and "SPEC_V2" not in done.summary
    assert done.summary.endswith("or use more GPUs.")
