"""The simulator's vLLM personality (``python -m workers.sim.vllm serve MODEL ...``) on a real port.

Everything it prints or answers is held against the contract recorded from the vLLM wheel: flags,
argparse's wording, the ready line, the failure texts, the metric names.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.util import free_port, wait_until
from workers.engines.contract import load_contract

CONTRACT = load_contract("vllm", "0.34.0")
MTP = '{"method":"mtp","num_speculative_tokens":3}'


def _run(args: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "workers.sim.vllm", *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


@contextmanager
def vllm_sim(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    proc = _run(list(args), {"BENCHBOT_SIM_STATE_DIR": str(tmp_path), **(env or {})})
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout:
            proc.stdout.close()


def _output(proc: subprocess.Popen, timeout: float = 30) -> str:
    """Everything the process printed once it ended; a process still running at ``timeout`` is killed."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return out


def _status(port: int, path: str) -> int | None:
    """HTTP status, or None when nothing accepts the connection."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (ConnectionError, urllib.error.URLError, TimeoutError):
        return None


def _get_json(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return json.loads(resp.read())


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        body = resp.read().decode()
    out: dict[str, float] = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            key = name.split("{", 1)[0]
            out[key] = out.get(key, 0.0) + float(value)
    return out


def _wait_ready(port: int, timeout: float = 20.0) -> None:
    wait_until(lambda: _status(port, "/health") == 200, timeout=timeout, what="vLLM sim /health 200")


def test_loading_refuses_connections_then_health_is_200(tmp_path: Path) -> None:
    port = free_port()
    with vllm_sim(tmp_path, "serve", "Qwen/Qwen3-8B", "--port", str(port), "--sim-load-s", "3") as proc:
        # the port is bound at once (a second bind fails) but nothing listens while loading
        def bound() -> bool:
            probe = socket.socket()
            try:
                probe.bind(("", port))
            except OSError:
                return True
            finally:
                probe.close()
            return False

        wait_until(bound, timeout=10, what="the sim binds its port early")
        assert _status(port, "/health") is None
        _wait_ready(port)
        assert proc.poll() is None
        assert _get_json(port, "/version") == {"version": "0.34.0"}
        card = _get_json(port, "/v1/models")["data"][0]
        assert card["root"] == "Qwen/Qwen3-8B" and card["max_model_len"] > 0
        assert set(card) <= set(CONTRACT.http["models"]["card_fields"])
        assert _status(port, "/server_info?config_format=json") == 404  # only with VLLM_SERVER_DEV_MODE=1
        proc.terminate()
        out = _output(proc, 10)
    assert f"INFO:     {CONTRACT.ready_line}" in out
    assert CONTRACT.text("server_version") % ("0.34.0", "Qwen/Qwen3-8B") in out
    assert CONTRACT.text("uvicorn_started") % proc.pid in out
    route = CONTRACT.texts["route_line"].render({"path": "/v1/completions", "', '.join(methods)": "POST"})
    assert route in out
    assert CONTRACT.texts["api_server_starting"].render({"listen_address": f"http://0.0.0.0:{port}"}) in out


def test_streaming_completion_counts_tokens_and_mtp_moves_spec_counters(tmp_path: Path) -> None:
    port = free_port()
    args = ["serve", "Qwen/Qwen3-8B", "--port", str(port), "--sim-load-s", "0.2", "--speculative-config", MTP]
    with vllm_sim(tmp_path, *args, env={"VLLM_SERVER_DEV_MODE": "1"}):
        _wait_ready(port)
        before = _metrics(port)
        assert before["vllm:spec_decode_num_drafts_total"] == 0
        body = {"model": "Qwen/Qwen3-8B", "prompt": "hello there", "max_tokens": 40, "ignore_eos": True}
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(), method="POST"
        )
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=20) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            events = [ln[6:] for ln in resp.read().decode().splitlines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        usage = chunks[-1]["usage"]
        assert usage["completion_tokens"] == 40
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        after = _metrics(port)
        assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 40
        drafts = after["vllm:spec_decode_num_drafts_total"]
        accepted = after["vllm:spec_decode_num_accepted_tokens_total"]
        # the prefill emits the first token; each verify step after it emits its accepted drafts plus one
        assert drafts > 0 and 1 + drafts + accepted == 40
        exposed = {n for m in CONTRACT.http["metrics"].values() for n in m["exposed"]}
        assert set(after) <= exposed | {n + s for n in exposed for s in ("_sum", "_count")}
        info = _get_json(port, "/server_info?config_format=json")
        assert set(info) == set(CONTRACT.http["server_info"]["keys"])
        assert info["vllm_config"]["speculative_config"]["num_speculative_tokens"] == 3


def test_trtllm_moe_on_sm120_ends_with_the_recorded_text(tmp_path: Path) -> None:
    port = free_port()
    args = ["serve", "nvidia/Qwen3.5-397B-A17B-NVFP4", "--port", str(port), "-tp", "8", "--sim-load-s", "0.5"]
    proc = _run([*args, "--moe-backend", "flashinfer_trtllm"], {"BENCHBOT_SIM_STATE_DIR": str(tmp_path)})
    out = _output(proc)
    assert proc.returncode == 1
    assert "ValueError: NvFp4 MoE backend 'FLASHINFER_TRTLLM' does not support the deployment configuration" in out
    assert "since kernel does not support current device NVIDIA RTX PRO 6000 Blackwell Server Edition." in out
    assert "RuntimeError: " + CONTRACT.texts["engine_core_init_failed"].render({"finished": "{'EngineCore': 1}"}) in out
    assert _status(port, "/health") is None


def test_too_little_gpu_memory_ends_with_the_recorded_oom_text(tmp_path: Path) -> None:
    args = ["serve", "nvidia/Qwen3.5-397B-A17B-NVFP4", "--port", str(free_port()), "-tp", "2", "--sim-load-s", "0.5"]
    proc = _run(args, {"BENCHBOT_SIM_STATE_DIR": str(tmp_path)})
    out = _output(proc)
    assert proc.returncode == 1
    hint = CONTRACT.text("kv_cache_memory_hint")
    assert "ValueError: " + CONTRACT.texts["kv_cache_no_memory"].render({"hint": hint}) in out


def test_port_in_use_fails_at_once_with_the_recorded_oserror(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = _run(
            ["serve", "m", "--port", str(port), "--sim-load-s", "30"], {"BENCHBOT_SIM_STATE_DIR": str(tmp_path)}
        )
        out = _output(proc)
    assert proc.returncode == 1
    assert f"OSError: {CONTRACT.text('http_port_in_use')}" in out


def test_engine_death_turns_health_503_then_the_watchdog_ends_the_server(tmp_path: Path) -> None:
    port = free_port()
    args = ["serve", "m", "--port", str(port), "--sim-load-s", "0.2", "--sim-engine-dies-after-s", "0.5"]
    with vllm_sim(tmp_path, *args) as proc:
        _wait_ready(port)
        wait_until(lambda: _status(port, "/health") == 503, timeout=10, what="/health 503 after engine death")
        assert _status(port, "/v1/models") == 200
        proc.wait(timeout=15)
        out = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 1
    assert CONTRACT.text("engine_dead") in out


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["serve", "m", "--no-such-option", "1"], "argparse_unrecognized"),
        (["serve", "m", "--max-num", "8"], "argparse_ambiguous"),
        (["serve", "m", "--moe-backend", "cutlas"], "argparse_invalid_choice"),
        (["serve", "m", "--tensor-parallel-size", "eight"], "argparse_invalid_int"),
    ],
)
def test_bad_flags_are_refused_in_vllms_argparse_words(tmp_path: Path, argv: list[str], key: str) -> None:
    proc = _run(argv, {"BENCHBOT_SIM_STATE_DIR": str(tmp_path)})
    out = _output(proc)
    assert proc.returncode == 2
    assert out.strip().splitlines()[-1] == CONTRACT.text(key)


def test_bad_speculative_json_is_refused_like_vllm(tmp_path: Path) -> None:
    proc = _run(["serve", "m", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3'], {})
    out = _output(proc)
    assert proc.returncode == 2
    recorded = CONTRACT.texts["speculative_config_bad_json"]
    expected = recorded.template.split("<function loads at ")[0].replace("{{", "{").replace("}}", "}")
    assert out.strip().splitlines()[-1].startswith(expected)


def test_loading_workers_hold_fake_gpu_memory_and_let_go_on_stop(tmp_path: Path) -> None:
    state = tmp_path / "state"
    port = free_port()
    args = ["serve", "Qwen/Qwen3-32B", "--port", str(port), "-tp", "4", "--sim-load-s", "4"]
    with vllm_sim(state, *args) as proc:

        def smi(*flags: str) -> str:
            env = {**os.environ, "BENCHBOT_SIM_STATE_DIR": str(state)}
            cmd = [sys.executable, "-m", "workers.sim.nvidia_smi", *flags]
            return subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout

        def loading_apps() -> list[list[str]]:
            rows = smi("--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits")
            apps = [r.split(", ") for r in rows.splitlines()]
            return apps if len(apps) == 4 and all(int(a[2]) > 1000 for a in apps) else []

        apps = wait_until(loading_apps, timeout=15, what="the workers to hold GPU memory")
        assert [a[1] for a in apps] == [f"VLLM::Worker_TP{i}" for i in range(4)]
        assert _status(port, "/health") is None  # still loading: nothing listens
        _wait_ready(port)
        proc.terminate()
        proc.wait(timeout=10)
    assert all(used < 100 for used in smi_used(state))  # idle GPUs again (a few MiB of driver overhead)


def smi_used(state: Path) -> list[int]:
    env = {**os.environ, "BENCHBOT_SIM_STATE_DIR": str(state)}
    cmd = [sys.executable, "-m", "workers.sim.nvidia_smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    return [int(x) for x in subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout.split()]


def test_a_missing_local_model_ends_with_the_recorded_text(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    proc = _run(["serve", missing, "--port", str(free_port())], {"BENCHBOT_SIM_STATE_DIR": str(tmp_path)})
    out = _output(proc)
    assert proc.returncode == 1
    assert "ValueError: " + CONTRACT.texts["model_not_found"].render({"model": missing}) in out
