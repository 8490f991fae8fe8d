"""A vLLM host on the CPU (`device = "cpu"`, vLLM's CPU build): its presets, its config, the real demo's config."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.demo_real import HOST, demo_real_config
from workers.config import parse_config
from workers.errors import BenchbotError, ConfigError
from workers.presets import build_launch

CPU_HOST = """
default_host = "cpu"
[hosts.cpu]
transport = "local"
port = 18500
gpus = 0
nvidia_smi = []
[hosts.cpu.engine]
kind = "vllm"
device = "cpu"
command = ["/opt/v/bin/vllm", "serve"]
model = "/models/tiny"
flags = { "--dtype" = "float32" }
[hosts.gpu]
port = 18501
[hosts.gpu.engine]
kind = "vllm"
command = ["/opt/v/bin/vllm", "serve"]
"""


def test_a_cpu_host_gets_the_cpu_presets_and_a_gpu_host_the_gpu_ones():
    config = parse_config(CPU_HOST, "t.toml")
    cpu, gpu = config.hosts["cpu"], config.hosts["gpu"]
    assert cpu.engine.device == "cpu" and cpu.engine.preset_set == "vllm-cpu"
    assert gpu.engine.device == "cuda" and gpu.engine.preset_set == "vllm"
    assert cpu.gpus == 0
    spec = build_launch(config, cpu, ("eager", "seqs8"), ())
    assert "--enforce-eager" in spec.argv and spec.argv[spec.argv.index("--max-num-seqs") + 1] == "8"
    assert list(spec.argv[:3]) == ["/opt/v/bin/vllm", "serve", "/models/tiny"]
    with pytest.raises(BenchbotError, match=r'unknown preset "cutlass" on cpu'):
        build_launch(config, cpu, ("cutlass",), ())  # a CUDA-only backend is not a CPU host's word
    with pytest.raises(BenchbotError, match=r'unknown preset "seqs8" on gpu'):
        build_launch(config, gpu, ("seqs8",), ())


def test_a_config_may_give_the_cpu_hosts_their_own_presets():
    text = CPU_HOST + '\n[engines.vllm-cpu.presets.tiny-batch]\nflags = { "--max-num-seqs" = 2 }\n'
    config = parse_config(text, "t.toml")
    assert list(config.presets_for("vllm-cpu")) == ["tiny-batch"]
    assert "cutlass" in config.presets_for("vllm")  # the GPU hosts keep the packaged vLLM presets


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ('kind = "vllm"\ndevice = "tpu"', r"'tpu' is not a device vllm runs on here \(one of cuda, cpu\)"),
        ('kind = "sglang"\ndevice = "cpu"', r"'cpu' is not a device sglang runs on here \(one of cuda\)"),
    ],
)
def test_a_device_the_engine_does_not_run_on_is_refused_by_name(engine, message):
    text = f'[hosts.h]\nport = 18502\n[hosts.h.engine]\n{engine}\ncommand = ["x"]\n'
    with pytest.raises(ConfigError, match=message) as err:
        parse_config(text, "t.toml")
    assert "hosts.h.engine.device" in str(err.value)


def test_the_real_demo_config_is_a_valid_cpu_host(tmp_path: Path):
    text = demo_real_config(18503, tmp_path / "venv", tmp_path / "model", tmp_path)
    config = parse_config(text, "demo.toml")
    host = config.hosts[HOST]
    assert host.engine.kind == "vllm" and host.engine.device == "cpu"
    assert host.engine.command == (str(tmp_path / "venv" / "bin" / "vllm"), "serve")
    assert dict(host.engine.flags)["--kv-cache-memory-bytes"] == str(1 << 30)
    assert "VLLM_CPU_KVCACHE_SPACE" not in host.engine.env  # it would override --kv-cache-memory-bytes
    assert host.engine.env["HF_HUB_OFFLINE"] == "1"


def test_demo_real_without_the_cpu_build_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from bot.demo_real import run_real_demo

    monkeypatch.setenv("BENCHBOT_REAL_VENV", str(tmp_path / "no-venv"))
    with pytest.raises(RuntimeError, match="make demo-real"):
        run_real_demo(tmp_path / "out", emit=lambda _line: None)
