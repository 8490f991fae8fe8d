"""The real tier's host: benchbot's real workers driving vLLM's CPU build on 127.0.0.1.

One config (``real_config_toml``) with a few local hosts, all served by the real ``.venv-real/bin/vllm
serve``: ``real-1`` (the tiny model, the main host of every test), ``real-badmodel`` (a model path that
does not exist), ``real-broken`` (the same model with its last norm zeroed: every logit equal, degenerate
output) and ``real-profiled`` (the tiny model on a server started with vLLM's torch profiler).
The engine's env is the config's and nothing else: offline (``HF_HUB_OFFLINE``), vLLM's caches under the
test's own folder. ``nvidia_smi = []``: a CPU box has no GPUs to report.

``RealHost`` is the integration harness' :class:`BenchbotHost` on that config; on exit it also stops every
vLLM process tree left on the hosts' ports (API server, ``VLLM::EngineCore``, ``VLLM::Worker``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path

from bot.demo_real import DEMO_FLAGS, cpu_host_toml, vllm_tree
from tests.integration.harness import BenchbotHost
from tests.util import free_port, wait_until

MAIN = "real-1"
BAD_MODEL = "real-badmodel"
BROKEN = "real-broken"
#: The tiny model on a vLLM started with a torch profiler (``--profiler-config``): the only host whose
#: server mounts ``/start_profile``, launched only by the profile test.
PROFILED = "real-profiled"
HOSTS = (MAIN, BAD_MODEL, BROKEN, PROFILED)
#: Flags every launch passes: fp32 (the model's dtype; vLLM would downcast to bf16), a short context,
#: eager mode (no torch.compile: 41-45 s to healthy here instead of 70-95 s), a 1 GiB KV cache. The cache
#: is a flag, not ``VLLM_CPU_KVCACHE_SPACE``: that legacy variable silently overrides the flag (vLLM 0.32's
#: ``platforms/cpu.py``), so a launch with ``--kv-cache-memory-bytes`` would not get what it asked for.
BASE_FLAGS = {**DEMO_FLAGS, "--enforce-eager": True}


#: The one number ``/tune`` may search on the tier's hosts (an admin's declaration: flag, range, step).
TUNE_KNOBS_TOML = """
[tune.knobs.max-num-seqs]
flag = "--max-num-seqs"
range = [1, 64]
step = 1
engine = "vllm"
description = "requests vLLM schedules at once"
"""


def profiler_flags(work: Path) -> dict[str, str | int | bool]:
    """vLLM's torch profiler, its traces under the tier's own folder."""
    return {"--profiler-config": json.dumps({"profiler": "torch", "torch_profiler_dir": str(work / "vllm-traces")})}


def real_config_toml(
    ports: Mapping[str, int],
    *,
    venv: Path,
    models: Mapping[str, Path],
    work: Path,
    lease_ttl_s: float = 15.0,
    launch_timeout_s: float = 300.0,
) -> str:
    """benchbot.toml for the real tier: one host per entry of ``ports``, its model from ``models``."""
    hosts = "".join(
        cpu_host_toml(
            name,
            port,
            venv=venv,
            model=models[name],
            work=work,
            flags={**BASE_FLAGS, **(profiler_flags(work) if name == PROFILED else {})},
            log_dir=work / f"logs-{name}",
            description="vLLM CPU build (vllm-cpu) serving a tiny model made by the test tier",
            launch_timeout_s=launch_timeout_s,
        )
        for name, port in ports.items()
    )
    return f"""
default_host = "{MAIN}"
{hosts}
[limits]
lease_ttl_s = {lease_ttl_s}
cancel_grace_s = 10
# status_of() asserts a fresh observation: a real vLLM's /metrics on a loaded 2-core box can take >0.6 s
status_deadline_s = 10
{TUNE_KNOBS_TOML}"""


def kill_vllm(port: int) -> None:
    for pid in vllm_tree(port):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not vllm_tree(port), timeout=20, what=f"vLLM on port {port} to die")


class RealHost(BenchbotHost):
    """:class:`BenchbotHost` on :func:`real_config_toml`; also stops vLLM trees on every host's port."""

    def __init__(
        self,
        redis_url: str,
        work: Path,
        *,
        venv: Path,
        models: Mapping[str, Path],
        workers: int = 1,
        lease_ttl_s: float = 15.0,
    ) -> None:
        ports = {name: free_port() for name in models}
        super().__init__(
            redis_url,
            work,
            workers=workers,
            host_ports=ports,
            config_toml=lambda p: real_config_toml(p, venv=venv, models=models, work=work, lease_ttl_s=lease_ttl_s),
        )

    def close(self) -> None:
        super().close()
        for port in self.ports.values():
            kill_vllm(port)

    def vllm_pids(self, host: str = MAIN) -> list[int]:
        return vllm_tree(self.ports[host])
