"""A simulated launch lives like a real SGLang one: loading with no listener, then warm-up, then ready.

Real ``launch_server`` binds its HTTP port only after the schedulers have loaded the weights and
captured CUDA graphs; the GPU memory belongs to the scheduler child processes; ``/health`` is 503
until the warm-up request has run while every other route already answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.util import free_port, wait_until
from workers.engines.contract import load_contract
from workers.engines.sglang.readiness import ReadyResult, wait_ready
from workers.sim import registry
from workers.sim.launcher import SimProcess, spawn_sim, start_sim
from workers.sim.ports import is_port_available

ROOT = Path(__file__).resolve().parents[1]
BASELINE = [
    "--model-path",
    "nvidia/Qwen3.5-397B-A17B-NVFP4",
    "--tp-size",
    "8",
    "--quantization",
    "modelopt_fp4",
    "--moe-runner-backend",
    "flashinfer_cutlass",
    "--fp4-gemm-backend",
    "flashinfer_cudnn",
]
READY = load_contract("sglang", "0.5.9").ready_line or ""


def _refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        try:
            s.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
    return False


def _smi(state: Path, *args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "workers.sim.nvidia_smi", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "BENCHBOT_SIM_STATE_DIR": str(state)},
        cwd=ROOT,
        check=True,
    ).stdout


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _entry(state: Path, pid: int) -> dict:
    try:
        return json.loads((state / f"{pid}.json").read_text())
    except (OSError, ValueError):
        return {}


def test_a_loading_server_has_no_listener_but_its_children_hold_gpu_memory(tmp_path: Path) -> None:
    state = tmp_path / "state"
    port = free_port()
    with spawn_sim(port, *BASELINE, load_s=4.0, startup_s=4.2, env={"BENCHBOT_SIM_STATE_DIR": str(state)}) as proc:
        entry = wait_until(
            lambda: (e := _entry(state, proc.pid)).get("mem_mib", 0) > 10_000 and e,
            timeout=15,
            what="the weights to be loading",
        )
        assert entry["status"] == "Loading" and "Load weight begin" in proc.log_text()
        assert _refused(port) and proc.health() is None  # no listener: connection refused, as SGLang
        assert "Uvicorn running" not in proc.log_text()
        apps = [
            row.split(", ")
            for row in _smi(
                state, "--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv,noheader,nounits"
            ).splitlines()
        ]
        assert [a[1] for a in apps] == [f"sglang::scheduler_TP{i}" for i in range(8)]
        assert {a[3] for a in apps} == {f"GPU-5a1b0000-0000-4000-8000-{i:012d}" for i in range(8)}
        assert all(int(a[2]) > 10_000 for a in apps) and str(proc.pid) not in {a[0] for a in apps}
        assert all(_ppid(int(a[0])) == proc.pid for a in apps)  # observation must follow the process tree
        detok = [c for c in entry["procs"] if c["name"] == "sglang::detokenizer"]
        assert len(detok) == 1 and detok[0]["gpu"] is None
        used = [int(x) for x in _smi(state, "--query-gpu=memory.used", "--format=csv,noheader,nounits").split()]
        assert all(u > 10_000 for u in used)
        proc.wait_ready(timeout=20)
        assert not _refused(port) and proc.health() == 200
        children = [int(a[0]) for a in apps]
    assert not any(registry.pid_alive(c) for c in children)  # SIGTERM took the children along


def test_listening_before_warmup_health_is_503_but_server_info_and_generate_answer(tmp_path: Path) -> None:
    port = free_port()
    with spawn_sim(
        port, *BASELINE, "--enable-metrics", load_s=0.3, startup_s=4.0, env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path)}
    ) as proc:
        wait_until(lambda: not _refused(port), timeout=15, what="the listener")
        assert proc.health() == 503
        assert httpx.get(proc.base_url + "/health_generate").status_code == 503
        info = httpx.get(proc.base_url + "/server_info")
        assert info.status_code == 200 and info.json()["status"] == "ready"  # never 503
        out = httpx.post(
            proc.base_url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 3}}, timeout=10
        )
        assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 3
        assert READY not in proc.log_text() and proc.health() == 503
        proc.wait_ready(timeout=15)
        log = proc.log_text()
        assert log.index("max_total_num_tokens=") < log.index("Uvicorn running on") < log.index(READY)
        # the warm-up went through HTTP like SGLang's (a VLM: chat with an image) and counted in the metrics
        metrics = httpx.get(proc.base_url + "/metrics").text
        requests = next(ln for ln in metrics.splitlines() if ln.startswith("sglang:num_requests_total"))
        assert float(requests.rsplit(" ", 1)[1]) == 2.0


def test_children_end_with_the_engine_even_when_it_is_sigkilled(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with start_sim(free_port(), *BASELINE, "--skip-server-warmup", env={"BENCHBOT_SIM_STATE_DIR": str(state)}) as proc:
        children = [c["pid"] for c in _entry(state, proc.pid)["procs"]]
        assert len(children) == 9 and all(registry.pid_alive(c) for c in children)
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait(timeout=10)
        wait_until(
            lambda: not any(registry.pid_alive(c) for c in children), timeout=10, what="the orphaned children to exit"
        )
    assert _smi(state, "--query-compute-apps=pid", "--format=csv,noheader") == ""


def test_the_driver_wait_ready_treats_a_refused_connection_as_still_loading(tmp_path: Path) -> None:
    port = free_port()
    with spawn_sim(
        port,
        *BASELINE,
        load_s=1.5,
        startup_s=2.0,
        env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path)},
        log_path=tmp_path / "sim.log",
    ) as proc:
        offset = 0

        async def read_new_log() -> str:
            nonlocal offset
            text = (tmp_path / "sim.log").read_text()
            new, offset = text[offset:], len(text)
            return new

        async def alive() -> bool:
            return proc.proc.poll() is None

        started = time.monotonic()
        result = asyncio.run(
            wait_ready(proc.base_url, deadline_s=30, is_alive=alive, read_new_log=read_new_log, poll_s=0.1)
        )
        assert isinstance(result, ReadyResult), result
        assert result.health_polls > 5 and time.monotonic() - started >= 1.0 and result.saw_ready_line


def test_an_idle_keep_alive_connection_is_closed_after_5_s(tmp_path: Path) -> None:
    """uvicorn's timeout_keep_alive=5 (SGLang passes it); clients that pool connections must cope."""
    env = {"BENCHBOT_SIM_STATE_DIR": str(tmp_path)}
    with (
        start_sim(free_port(), *BASELINE, "--skip-server-warmup", env=env) as proc,
        socket.create_connection(("127.0.0.1", proc.port), timeout=10) as s,
    ):
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        idle_from = time.monotonic()
        assert s.recv(4096) == b""  # the server closed the idle connection
        idle = time.monotonic() - idle_from
    assert 4.5 < idle < 7.0, idle


def _port_with_free_internal_ports() -> int:
    """An HTTP port below the ephemeral range whose internal ports (+233..+238) are free now: a port an
    outgoing connection happens to use would make 0.5.9 fail (it cannot find a listener to name)."""
    for port in random.sample(range(20_000, 32_000), 200):
        if all(is_port_available(p) for p in (port, *range(port + 233, port + 239))):
            return port
    pytest.skip("no free port block below the ephemeral range")


def test_an_internal_port_in_use_is_waited_for_then_used(tmp_path: Path) -> None:
    """With DP attention SGLang waits for --port + 233; the wait line is recoverable, not a failure."""
    port = _port_with_free_internal_ports()
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("", port + 233))
    holder.listen()
    proc = spawn_sim(
        port,
        *BASELINE,
        "--enable-dp-attention",
        "--skip-server-warmup",
        env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path)},
        log_path=tmp_path / "l.txt",
    )
    try:
        wait_until(lambda: "is in use. Waiting for" in proc.log_text(), timeout=15, what="the wait line")
        line = next(ln for ln in proc.log_text().splitlines() if "is in use. Waiting for" in ln)
        assert f"port {port + 233} is in use. Waiting for 15 seconds for dist_init_port to be available." in line
        assert f"pid={os.getpid()}" in line and proc.proc.poll() is None
        holder.close()
        proc.wait_ready(timeout=15)
    finally:
        holder.close()
        proc.stop()


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_server_info_has_the_shape_of_the_imitated_version(tmp_path: Path, version: str) -> None:
    contract = load_contract("sglang", version)
    with start_sim(
        free_port(),
        *BASELINE,
        "--skip-server-warmup",
        "--api-key",
        "k",
        env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path), "BENCHBOT_SIM_SGLANG_VERSION": version},
    ) as proc:
        auth = {"Authorization": "Bearer k"}
        info = httpx.get(proc.base_url + "/server_info", headers=auth).json()
        model = httpx.get(proc.base_url + "/model_info", headers=auth).json()
    keys = set(info) - {"sim"}
    assert set(contract.server_args_fields) | set(contract.server_info_extra) <= keys
    assert info["version"] == version and info["sim"]["sglang_version"] == version
    assert info["tp_size"] == 8 and info["context_length"] is None and info["api_key"] == "k"
    if version == "0.5.9":
        assert keys == set(contract.server_args_fields) | set(contract.server_info_extra)
        assert info["mamba_scheduler_strategy"] == "no_buffer" and "frontend" not in info
        assert set(info["internal_states"][0]["memory_usage"]) == {"weight", "kvcache", "graph", "token_capacity"}
    else:
        assert info["frontend"] == "python" and info["kv_events"] is None
        assert "--api-key k" in info["launch_command"] and "--sim-" not in info["launch_command"]
        assert info["mamba_radix_cache_strategy"] == "extra_buffer" and "mamba_scheduler_strategy" not in info
        assert set(info["startup_time"]) == {"load_weight", "kv_cache_allocation", "scheduler_e2e", "cuda_graph"}
        state = info["internal_states"][0]
        assert state["world_size"] == 8 and isinstance(state["memory_usage"]["graph"], dict)
        assert {"served_model_name", "load_format", "disaggregation_mode"} <= set(model)


def test_a_port_in_use_ends_the_launch_after_loading(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc: SimProcess = spawn_sim(
            port, *BASELINE, env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path)}, log_path=tmp_path / "l.txt"
        )
        code = proc.wait_exit(timeout=30)
    text = (tmp_path / "l.txt").read_text()
    assert code == 1 and f"[Errno 98] error while attempting to bind on address ('127.0.0.1', {port})" in text
    assert text.index("max_total_num_tokens=") < text.index("[Errno 98]") and READY not in text
