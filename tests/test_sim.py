"""The simulated SGLang server as a real subprocess: endpoint shapes, streaming, clients, host stand-in."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.util import free_port
from workers.sim.host import install_nvidia_smi
from workers.sim.launcher import BASELINE_ARGS, SimProcess, start_sim

ROOT = Path(__file__).resolve().parents[1]
BASELINE = list(BASELINE_ARGS)


@pytest.fixture(scope="module")
def sim_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("simstate")


@pytest.fixture(scope="module")
def sim(sim_state: Path) -> Iterator[SimProcess]:
    """One baseline server (model timing, metrics on) shared by the shape tests."""
    port = free_port()
    with start_sim(
        port,
        *BASELINE,
        "--enable-metrics",
        env={"BENCHBOT_SIM_STATE_DIR": str(sim_state)},
        log_path=sim_state / "baseline.log",
    ) as proc:
        yield proc


def _sse(lines: list[str]) -> list[dict]:
    out = []
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def _stream(url: str, body: dict, headers: dict | None = None) -> tuple[list[dict], list[float], list[str]]:
    """POST a streaming request; (chunks, arrival times, raw data lines)."""
    chunks, times, raw = [], [], []
    with httpx.Client(timeout=30) as client, client.stream("POST", url, json=body, headers=headers) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                raw.append(line)
                if line != "data: [DONE]":
                    times.append(time.time())
                    chunks.append(json.loads(line[6:]))
    return chunks, times, raw


def test_info_endpoints_have_sglang_shapes(sim: SimProcess) -> None:
    base = sim.base_url
    assert httpx.get(base + "/health").status_code == 200
    assert httpx.get(base + "/health_generate").status_code == 200
    info = httpx.get(base + "/server_info").json()
    assert info == {**httpx.get(base + "/get_server_info").json(), "internal_states": info["internal_states"]}
    assert info["version"] == "0.5.9" and info["status"] == "ready"
    assert info["tp_size"] == 8
    assert info["moe_runner_backend"] == "flashinfer_cutlass"
    assert info["fp4_gemm_runner_backend"] == "flashinfer_cudnn"
    assert info["speculative_algorithm"] is None and info["disable_custom_all_reduce"] is True
    assert info["max_total_num_tokens"] > 100_000
    state = info["internal_states"][0]
    assert set(state["memory_usage"]) == {"weight", "kvcache", "graph", "token_capacity"}
    assert "avg_spec_accept_length" not in state and "last_gen_throughput" in state
    model_info = httpx.get(base + "/model_info").json()
    assert model_info["model_path"] == "nvidia/Qwen3.5-397B-A17B-NVFP4" and model_info["is_generation"] is True
    assert httpx.get(base + "/get_model_info").json() == model_info
    models = httpx.get(base + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "nvidia/Qwen3.5-397B-A17B-NVFP4"
    assert models["data"][0]["owned_by"] == "sglang" and models["data"][0]["max_model_len"] == 262144
    assert httpx.get(base + "/v1/models/nvidia/Qwen3.5-397B-A17B-NVFP4").status_code == 200
    missing = httpx.get(base + "/v1/models/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    flushed = httpx.post(base + "/flush_cache")
    assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")


def test_generate_streams_cumulative_text_and_meta_info(sim: SimProcess) -> None:
    body = {"input_ids": list(range(100)), "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}, "stream": True}
    chunks, _, raw = _stream(sim.base_url + "/generate", body)
    assert raw[-1] == "data: [DONE]"
    assert len(chunks) == 6
    for prev, cur in itertools.pairwise(chunks):
        assert cur["text"].startswith(prev["text"]) and len(cur["text"]) > len(prev["text"])
        assert prev["meta_info"]["finish_reason"] is None
    last = chunks[-1]["meta_info"]
    assert last["prompt_tokens"] == 100 and last["completion_tokens"] == 6
    assert last["finish_reason"] == {"type": "length", "length": 6}
    assert last["e2e_latency"] > 0 and "cached_tokens" in last and "id" in last
    assert "spec_verify_ct" not in last and "sim_t_sched" not in chunks[0]
    # same prompt again: deterministic text, and the prefix cache reports a hit
    again, _, _ = _stream(sim.base_url + "/generate", body)
    assert again[-1]["text"] == chunks[-1]["text"] and again[-1]["meta_info"]["cached_tokens"] == 99


def test_generate_non_stream_and_batch(sim: SimProcess) -> None:
    one = httpx.post(
        sim.base_url + "/generate",
        json={"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4}},
        timeout=30,
    ).json()
    assert one["meta_info"]["completion_tokens"] == 4 and len(one["output_ids"]) == 4
    assert one["meta_info"]["prompt_tokens"] == 6  # 24 bytes / 4
    assert len(one["text"].split()) >= 2 and "!" not in one["text"]
    batch = httpx.post(
        sim.base_url + "/generate",
        json={"text": ["a", "b b b b"], "sampling_params": {"max_new_tokens": 2}},
        timeout=30,
    ).json()
    assert isinstance(batch, list) and [b["meta_info"]["completion_tokens"] for b in batch] == [2, 2]
    bad = httpx.post(sim.base_url + "/generate", json={"sampling_params": {}})
    assert bad.status_code == 400


def test_openai_client_streams_chat_and_completions(sim: SimProcess) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=sim.base_url + "/v1", api_key="unused")
    pieces, usage = [], None
    for chunk in client.completions.create(
        model="nvidia/Qwen3.5-397B-A17B-NVFP4",
        prompt="Hello there",
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    ):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
        if chunk.usage:
            usage = chunk.usage
    assert len(pieces) == 5 and "".join(pieces).strip()
    assert usage is not None and usage.completion_tokens == 5 and usage.prompt_tokens == 3
    deltas, finish, usage = [], None, None
    stream = client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "Hi"}],
        max_completion_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices:
            deltas.append(chunk.choices[0].delta.content)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert deltas[0] == "" and finish == "length" and usage.completion_tokens == 4
    assert "".join(d or "" for d in deltas).strip()
    # without include_usage there is no usage chunk
    plain = list(client.completions.create(model="m", prompt=[1, 2, 3], max_tokens=2, stream=True))
    assert all(c.usage is None for c in plain) and len(plain) == 2
    full = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert full.choices[0].message.role == "assistant" and full.usage.completion_tokens <= 3


def test_single_stream_decode_rate_matches_calibration(sim: SimProcess) -> None:
    """The seed baseline decodes at its own calibration (72.0 tok/s at ~1k context), measured by a client."""
    rates = []
    for rep in range(2):
        body = {
            "input_ids": list(range(rep, 1024 + rep)),
            "sampling_params": {"max_new_tokens": 220, "ignore_eos": True},
            "stream": True,
        }
        chunks, times, _ = _stream(sim.base_url + "/generate", body)
        tokens = chunks[-1]["meta_info"]["completion_tokens"] - chunks[0]["meta_info"]["completion_tokens"]
        rates.append(tokens / (times[-1] - times[0]))
    assert max(rates) == pytest.approx(72.0, rel=0.01), rates  # main measured 69.2-70.8


def test_metrics_after_traffic(sim: SimProcess) -> None:
    httpx.post(sim.base_url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}}, timeout=30)
    text = httpx.get(sim.base_url + "/metrics").text
    assert "# TYPE sglang:generation_tokens_total counter" in text
    assert 'sglang:time_to_first_token_seconds_bucket{le="+Inf"' in text
    gen = next(ln for ln in text.splitlines() if ln.startswith("sglang:generation_tokens_total"))
    assert float(gen.rsplit(" ", 1)[1]) >= 2


def test_nvidia_smi_reflects_running_server(sim: SimProcess, sim_state: Path, tmp_path: Path) -> None:
    wrapper = install_nvidia_smi(tmp_path / "bin")
    assert os.access(wrapper, os.X_OK) and wrapper.read_text().startswith(f"#!{sys.executable}")
    env = {**os.environ, "BENCHBOT_SIM_STATE_DIR": str(sim_state), "PATH": f"{wrapper.parent}:{os.environ['PATH']}"}
    out = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=index,name,memory.used,memory.total,utilization.gpu,compute_cap",
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    rows = [r.split(", ") for r in out.strip().splitlines()]
    assert len(rows) == 8
    assert all(r[1] == "NVIDIA RTX PRO 6000 Blackwell Server Edition" and r[3] == "97887" for r in rows)
    assert all(int(r[2]) > 80_000 and r[5] == "12.0" for r in rows)
    apps = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.splitlines()
    assert apps[0] == "pid, used_memory [MiB]" and len(apps) == 9 and apps[1].endswith(" MiB")
    children = {c["pid"] for c in json.loads((sim_state / f"{sim.pid}.json").read_text())["procs"]}
    assert {int(a.split(", ")[0]) for a in apps[1:]} < children  # the schedulers, not the HTTP process
    plain = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.splitlines()
    assert plain[0].split(", ")[1] == "sglang::scheduler_TP0" and int(plain[0].split(", ")[2]) > 80_000
    bad = subprocess.run(["nvidia-smi", "--query-gpu=bogus", "--format=csv"], capture_output=True, text=True, env=env)
    assert bad.returncode != 0 and "not a valid field" in bad.stderr


def test_sigterm_unregisters_and_frees_memory(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {"BENCHBOT_SIM_STATE_DIR": str(state)}
    smi = [sys.executable, "-m", "workers.sim.nvidia_smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    run_env = {**os.environ, **env}
    with start_sim(free_port(), *BASELINE, "--skip-server-warmup", env=env) as proc:
        assert (state / f"{proc.pid}.json").exists()
        used = subprocess.run(smi, capture_output=True, text=True, env=run_env, cwd=ROOT).stdout.split()
        assert int(used[0]) > 80_000
        assert proc.stop() == 0
    assert not (state / f"{proc.pid}.json").exists()
    used = subprocess.run(smi, capture_output=True, text=True, env=run_env, cwd=ROOT).stdout.split()
    assert int(used[0]) < 100


def test_api_key_is_enforced(tmp_path: Path) -> None:
    with start_sim(
        free_port(),
        *BASELINE,
        "--api-key",
        "s3cret",
        "--skip-server-warmup",
        env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path)},
    ) as proc:
        denied = httpx.get(proc.base_url + "/v1/models")
        assert denied.status_code == 401 and denied.json() == {"error": "Unauthorized"}
        assert httpx.get(proc.base_url + "/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(proc.base_url + "/health").status_code == 200


def test_api_key_from_a_config_file_as_sglang_merges_it(tmp_path: Path) -> None:
    """``--config FILE.yaml`` (JSON is YAML) is merged first and the command line wins, as in SGLang;
    the key is then enforced and logged in server_args like SGLang does (benchbot's scrubber hides it)."""
    config = tmp_path / "private.yaml"
    config.write_text(json.dumps({"api-key": "sk-from-file", "enable-metrics": True, "tp-size": 2}))
    log = tmp_path / "sim.log"
    with start_sim(
        free_port(),
        *BASELINE,
        "--config",
        str(config),
        "--skip-server-warmup",
        log_path=log,
        env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path)},
    ) as proc:
        assert httpx.get(proc.base_url + "/v1/models").status_code == 401
        authorised = {"Authorization": "Bearer sk-from-file"}
        assert httpx.get(proc.base_url + "/v1/models", headers=authorised).status_code == 200
        args = httpx.get(proc.base_url + "/server_info", headers=authorised).json()
        assert args["enable_metrics"] is True and args["tp_size"] == 8  # BASELINE's --tp-size 8 wins
        assert "api_key='sk-from-file'" in log.read_text()
        assert b"sk-from-file" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()


@pytest.mark.parametrize(
    ("name", "content", "code", "error"),
    [
        # SGLang's ConfigArgumentMerger raises ValueError before argparse runs, and launch_server does not
        # catch it: a traceback and exit 1 (0.5.9 srt/server_args_config_parser.py, 0.5.23 srt/utils/...).
        ("c.json", "{}", 1, "ValueError: Config file must be YAML format, got: .json"),
        ("missing.yaml", None, 1, "ValueError: Config file not found: "),
        ("list.yaml", "[1]", 1, "ValueError: Config file must contain a dictionary at root level"),
        # An unknown key becomes a flag, which argparse then refuses: exit 2.
        ("unknown.yaml", '{"no-such-option": 1}', 2, "unrecognized arguments: --no-such-option 1"),
    ],
)
def test_a_bad_config_file_is_refused_like_sglang(
    tmp_path: Path, name: str, content: str | None, code: int, error: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    done = subprocess.run(
        [sys.executable, "-m", "workers.sim.sglang", *BASELINE, "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == code and error in done.stderr, done.stderr
    assert (code == 1) == ("Traceback (most recent call last):" in done.stderr), done.stderr


def test_fixed_timing_is_ground_truth(tmp_path: Path) -> None:
    args = ["--sim-timing", "fixed", "--sim-ttft-ms", "50", "--sim-itl-ms", "10", "--skip-server-warmup"]
    with start_sim(free_port(), *BASELINE, *args, env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path)}) as proc:
        for path, body in (
            ("/v1/completions", {"prompt": "x", "max_tokens": 8, "stream": True, "ignore_eos": True}),
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "x"}], "max_tokens": 8, "stream": True, "ignore_eos": True},
            ),
            ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}, "stream": True}),
        ):
            chunks, times, _ = _stream(proc.base_url + path, body)
            timed = [(c, t) for c, t in zip(chunks, times, strict=True) if "sim_t_sched" in c]
            assert len(timed) == 8, path
            t_recv = timed[0][0]["sim_t_recv"]
            for i, (c, arrived) in enumerate(timed):
                assert c["sim_t_sched"] == pytest.approx(t_recv + 0.050 + 0.010 * i, abs=2e-6)
                assert c["sim_t_emit"] >= c["sim_t_sched"]
                assert c["sim_t_emit"] - c["sim_t_sched"] < 0.05
                # causality, robust on a loaded box (an upper bound on client gaps is not): no chunk reaches
                # the client before its scheduled time, so the pacing is real, not just stamped
                assert arrived >= c["sim_t_sched"] - 0.001, (path, i)


def test_metrics_count_requests_in_fixed_timing_too(tmp_path: Path) -> None:
    args = [
        "--sim-timing",
        "fixed",
        "--sim-ttft-ms",
        "5",
        "--sim-itl-ms",
        "1",
        "--skip-server-warmup",
        "--enable-metrics",
    ]
    with start_sim(free_port(), *BASELINE, *args, env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path)}) as proc:
        body = {"text": "count me", "sampling_params": {"max_new_tokens": 7, "ignore_eos": True}}
        for _ in range(2):
            assert httpx.post(proc.base_url + "/generate", json=body, timeout=10).status_code == 200
        metrics = {
            ln.split("{")[0]: float(ln.rsplit(" ", 1)[1])
            for ln in httpx.get(proc.base_url + "/metrics").text.splitlines()
            if ln.startswith("sglang:") and "{" in ln and "_bucket" not in ln
        }
    assert metrics["sglang:num_requests_total"] == 2 and metrics["sglang:generation_tokens_total"] == 14
    assert metrics["sglang:prompt_tokens_total"] == 4 and metrics["sglang:cached_tokens_total"] == 1
    assert metrics["sglang:e2e_request_latency_seconds_count"] == 2


def test_cache_report_only_with_enable_cache_report(tmp_path: Path) -> None:
    body = {"prompt": "the same prompt, twice over", "max_tokens": 2, "ignore_eos": True}
    for flag, expected in ((["--enable-cache-report"], {"cached_tokens": 6}), ([], None)):
        with start_sim(
            free_port(), *BASELINE, "--skip-server-warmup", *flag, env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path)}
        ) as proc:
            first = httpx.post(proc.base_url + "/v1/completions", json=body, timeout=10).json()["usage"]
            second = httpx.post(proc.base_url + "/v1/completions", json=body, timeout=10).json()["usage"]
            chunks, _, _ = _stream(
                proc.base_url + "/v1/chat/completions",
                {
                    "messages": [{"role": "user", "content": "same"}],
                    "max_tokens": 2,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            )
            chunks2, _, _ = _stream(
                proc.base_url + "/v1/chat/completions",
                {
                    "messages": [{"role": "user", "content": "same"}],
                    "max_tokens": 2,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            )
        assert first["prompt_tokens_details"] is None  # nothing cached yet: SGLang leaves it out
        assert second["prompt_tokens_details"] == expected and second["prompt_tokens"] == 7
        assert list(second) == [
            "prompt_tokens",
            "total_tokens",
            "completion_tokens",
            "prompt_tokens_details",
            "reasoning_tokens",
        ]
        streamed = chunks2[-1]["usage"]["prompt_tokens_details"]
        assert (streamed is not None) is bool(flag) and chunks[-1]["usage"]["prompt_tokens_details"] is None


def test_continuous_usage_stats_put_usage_in_the_content_chunks(sim: SimProcess) -> None:
    opts = {"include_usage": True, "continuous_usage_stats": True}
    chunks, _, _ = _stream(
        sim.base_url + "/v1/completions",
        {"prompt": "abcd", "max_tokens": 4, "stream": True, "ignore_eos": True, "stream_options": opts},
    )
    content = [c for c in chunks if c["choices"]]
    assert [c["usage"]["completion_tokens"] for c in content] == [1, 2, 3, 4]
    assert all(
        c["usage"]["prompt_tokens"] == 1 and c["usage"]["total_tokens"] == 1 + c["usage"]["completion_tokens"]
        for c in content
    )
    assert chunks[-1]["choices"] == [] and "prompt_tokens_details" not in chunks[-1]["usage"]  # exclude_none
    chat, _, _ = _stream(
        sim.base_url + "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "stream": True, "stream_options": opts},
    )
    role, *deltas, finish, usage = chat
    assert role["usage"] is None and finish["usage"] is None and finish["choices"][0]["finish_reason"]
    assert [d["usage"]["completion_tokens"] for d in deltas] == [1, 2, 3] and usage["usage"]["completion_tokens"] == 3
    plain, _, _ = _stream(sim.base_url + "/v1/completions", {"prompt": "abcd", "max_tokens": 2, "stream": True})
    assert all(c["usage"] is None for c in plain)


def test_capacity_bench_quick_prints_json() -> None:
    out = subprocess.run(
        [sys.executable, "bench/sim_capacity.py", "--quick"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["schema"] == 1 and len(data["levels"]) == 2
    assert all(level["complete"] and level["jitter_p50_ms"] < 5 for level in data["levels"])
    assert {"max_streams", "max_tok_s"} <= set(data)
