"""The whole path against a real engine: benchbot's real workers, lease and observer driving vLLM's CPU build.

One module, one host set (``tests/real/realhost.py``), tests in the order a team works: launch (with
``/status`` *loading* and a second launch waiting in line meanwhile), relaunch with another flag, bench,
eval, stop; then the real failures benchbot must diagnose from vLLM's own words. Each assertion is on what
the real process did or said: its argv, ``/version``, ``/v1/models``, ``/metrics``, its log, its exit.

Measured figures (start-up time, tok/s as the client and the server saw them) are written to
``$BENCHBOT_REAL_REPORT`` (default: the test's folder) as JSON, for the closing note and docs/sim.md.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.harness import first
from tests.real.realhost import BAD_MODEL, BROKEN, MAIN, PROFILED, RealHost, vllm_tree
from tests.util import wait_until
from workers.engines.vllm.driver import metric_totals
from workers.jobs import events
from workers.results import store

pytestmark = pytest.mark.timeout(900)

REPORT: dict[str, Any] = {}


def report(key: str, value: Any) -> None:
    """Keep a measured figure; written out at the end of the module."""
    REPORT[key] = value
    path = Path(os.environ.get("BENCHBOT_REAL_REPORT", "real-report.json"))
    path.write_text(json.dumps(REPORT, indent=1, sort_keys=True) + "\n")


def api_servers(host: RealHost, name: str = MAIN) -> list[int]:
    """vLLM API servers on the host's port (the roots of vLLM trees): never more than one may exist."""
    tree = set(vllm_tree(host.ports[name]))
    out = []
    for pid in tree:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if b"serve" in argv and ppid not in tree:
            out.append(pid)
    return out


def status_of(host: RealHost, name: str = MAIN) -> dict[str, Any]:
    reply = host.run("alice", f"/status {name}")
    assert reply.ok, reply.text
    views = reply.data["hosts"]
    assert len(views) == 1
    fresh = views[0]["fresh"]
    assert fresh is not None, f"no fresh observation: {reply.text}"
    return dict(fresh) | {"_text": reply.text}


def metric(base: str, name: str) -> float:
    """One counter of the server's own ``/metrics``, summed over its label sets (the driver's own reading)."""
    return metric_totals(httpx.get(base + "/metrics", timeout=10).text, (name,)).get(name, 0.0)


ITL = ("vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count")


def stream_ms(event: events.Event) -> int:
    """When Redis stored the event (its stream id's milliseconds): one clock for every event."""
    return int(event.id.split("-", 1)[0])


def wait_job(host: RealHost, job_id: str, timeout: float = 400) -> tuple[events.Event, list[events.Event]]:
    return host.wait(job_id, timeout=timeout)


# ---------------------------------------------------------------- launch, loading, the line, relaunch


def test_launch_while_loading_status_says_loading_and_a_second_launch_waits(real_host: RealHost) -> None:
    h = real_host
    t0 = time.monotonic()
    a = h.run("alice", f"/launch eager on {MAIN}")
    assert a.ok and a.job_id, a.text

    # Real vLLM: the process exists for ~40 s before its port listens. /status must call that loading.
    seen_states: list[str] = []

    def loading() -> bool:
        view = status_of(h)
        state = str(view.get("state"))
        if not seen_states or seen_states[-1] != state:
            seen_states.append(state)
        return state == "loading"

    try:
        wait_until(loading, timeout=120, interval=0.5, what="/status to say the real vLLM is loading")
    except AssertionError as exc:  # say what /status did say, and what the job and the worker did meanwhile
        job = [(e.type, e.data.get("phase") or e.data.get("message")) for e in events.job_events(h.r, a.job_id)]
        raise AssertionError(f"{exc}; /status said {seen_states}; job events {job}\n{h.worker_logs()}") from exc
    loading_view = status_of(h)
    assert "loading" in loading_view["_text"].lower(), loading_view["_text"]

    b = h.run("bob", f"/launch eager seqs8 on {MAIN}")
    assert b.ok and b.job_id, b.text
    assert "queued #2" in b.text or "#2" in b.text, b.text

    # While alice's engine loads, bob's launch waits: never a second vLLM on the port.
    most = 0
    while not events.is_terminal(h.r, a.job_id):
        servers = api_servers(h)
        most = max(most, len(servers))
        assert len(servers) <= 1, f"two vLLM servers on one port: {servers}"
        assert not events.job_events(h.r, b.job_id) or all(
            e.type in ("queued", "waiting") for e in events.job_events(h.r, b.job_id)
        ), [e.type for e in events.job_events(h.r, b.job_id)]
        assert time.monotonic() - t0 < 400, "alice's launch did not end"
        h.r.xread({events.job_stream(a.job_id): "$"}, block=500)  # until alice's job says more (or 0.5 s)
    assert most == 1
    terminal_a, seen_a = wait_job(h, a.job_id)
    assert terminal_a.type == "succeeded", (terminal_a.data, h.worker_logs())
    ready_a = first(seen_a, "ready").data
    fp_a = ready_a["config"]["fingerprint"]
    spawned = next(e for e in seen_a if e.type == "progress" and e.data.get("phase") == "spawn")
    report("spawn_to_ready_s", round((stream_ms(first(seen_a, "ready")) - stream_ms(spawned)) / 1000, 1))

    terminal_b, seen_b = wait_job(h, b.job_id)
    assert terminal_b.type == "succeeded", (terminal_b.data, h.worker_logs())
    ready_b = first(seen_b, "ready").data
    config_b = ready_b["config"]
    fp_b = config_b["fingerprint"]
    assert fp_b != fp_a, "another flag (--max-num-seqs 8) must change the fingerprint"
    assert ready_b.get("replaced"), "bob's launch replaced alice's server and says so"

    # The verified config is the real process's: its argv, /version, /v1/models; twice the same fingerprint.
    one, two = status_of(h), status_of(h)
    assert one["fingerprint"] == two["fingerprint"] == fp_b
    assert one["instance_id"] == two["instance_id"]
    server = one["server"]
    assert server["version"] == "0.32.0"
    assert server["model_path"] == str(h.config.hosts[MAIN].engine.model)
    assert server["args"]["max_num_seqs"] == 8
    assert server["args"]["served_max_model_len"] == 512
    assert server["args"]["dtype"] == "float32"
    argv = one["process"]["argv"]
    assert argv[1].endswith("/bin/vllm") and argv[2] == "serve", argv
    assert "--max-num-seqs" in argv and "8" in argv
    assert one["launched_by"]["user"] == "bob"
    # /metrics: the KV cache the server resolved (vllm:cache_config_info), here 1 GiB of 16-token blocks
    cache = one["extra"]["cache_config"]
    assert cache["kv_cache_memory_bytes"] == str(1 << 30) and int(cache["num_gpu_blocks"]) > 0, cache
    assert "KV cache (the server's own)" in one["_text"]
    assert "UNMANAGED" not in one["_text"]


# ---------------------------------------------------------------- bench: the server's own counts


def test_bench_token_counts_are_the_servers_own(real_host: RealHost) -> None:
    h = real_host
    base = h.config.hosts[MAIN].base_url
    before = {n: metric(base, n) for n in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")}
    itl_before = (
        metric(base, "vllm:inter_token_latency_seconds_sum"),
        metric(base, "vllm:inter_token_latency_seconds_count"),
    )
    terminal, _seen = h.launch_ok("bob", f"/bench 1,4 in=64 out=32 n=8 warmup=0 on {MAIN}", timeout=400)
    after = {n: metric(base, n) for n in before}
    itl_after = (
        metric(base, "vllm:inter_token_latency_seconds_sum"),
        metric(base, "vllm:inter_token_latency_seconds_count"),
    )
    run_ids = terminal.data.get("runs") or [terminal.data.get("run_id")]
    run = store.get_run(h.r, str(run_ids[0]))
    assert run.valid, run.invalid_reason
    levels = run.levels
    assert [lv["concurrency"] for lv in levels] == [1, 4]
    for lv in levels:
        assert lv["errors"] == 0 and lv["completed"] == 8, lv["error_samples"]
        assert lv["output_tokens"] == 8 * 32, lv
    client_out = sum(lv["output_tokens"] for lv in levels)
    client_in = sum(lv["input_tokens"] for lv in levels)
    # Every token the client counted, the server counted too, and nothing else was generated meanwhile.
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == client_out
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == client_in
    server_itl_ms = 1000 * (itl_after[0] - itl_before[0]) / max(1.0, itl_after[1] - itl_before[1])
    # Timing is not compared with a bound: under load the real API server coalesces tokens into fewer SSE
    # chunks (its ITL histogram times production, the client times arrival); both are reported.
    # Each level again on its own, to read the server's own view of it: its per-request decode time and ITL.
    per_level = []
    for level in (1, 4):
        names = ("vllm:generation_tokens_total", "vllm:request_decode_time_seconds_sum", *ITL)
        was = {n: metric(base, n) for n in names}
        done, _ = h.launch_ok("bob", f"/bench {level} in=64 out=32 n=8 warmup=0 on {MAIN}", timeout=400)
        now = {n: metric(base, n) for n in names}
        lv = store.get_run(h.r, str((done.data.get("runs") or [done.data.get("run_id")])[0])).levels[0]
        tokens = now[names[0]] - was[names[0]]
        assert tokens == lv["output_tokens"] == 8 * 32
        decode_s = now[names[1]] - was[names[1]]  # summed over requests: per-stream decode time
        per_level.append(
            {
                "concurrency": level,
                "client_output_tok_s": round(lv["output_tok_s"], 1),
                "client_per_stream_tok_s": round(lv["per_user_tok_s"] or 0.0, 1),
                "server_per_stream_decode_tok_s": round(tokens / decode_s, 1) if decode_s else None,
                "server_aggregate_tok_s": round(tokens / decode_s * level, 1) if decode_s else None,
                "client_itl_mean_ms": round(lv["itl_ms"]["mean"], 2),
                "server_itl_mean_ms": round(
                    1000 * (now[ITL[0]] - was[ITL[0]]) / max(1.0, now[ITL[1]] - was[ITL[1]]), 2
                ),
                "client_ttft_p50_ms": round(lv["ttft_ms"]["p50"], 1),
            }
        )
    report(
        "bench",
        {
            "bench_1_4": [
                {
                    "concurrency": lv["concurrency"],
                    "output_tok_s": round(lv["output_tok_s"], 1),
                    "tokens": lv["output_tokens"],
                }
                for lv in levels
            ],
            "server_generation_tokens": after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"],
            "server_itl_mean_ms_both_levels": round(server_itl_ms, 2),
            "per_level": per_level,
        },
    )


# ---------------------------------------------------------------- the client's view beside the server's


def test_each_level_puts_the_servers_own_latency_beside_the_clients_and_names_the_gap(real_host: RealHost) -> None:
    """vLLM's histograms (TTFT, ITL, E2E), read after the warmup and at the end of each level, sit beside the
    client's means: at c=1 the request ends agree within 50 ms, and the first token's gap, the engine's
    milliseconds against the client's hundred or more, is named in the table, once per level it shows at."""
    h = real_host
    line = f"/bench 1,4 in=64 out=32 n=8 warmup=2 on {MAIN}"
    if status_of(h).get("state") != "running":  # alone (-k): launch first, as the tier's first test does
        line = f"/launch eager on {MAIN} then bench 1,4 in=64 out=32 n=8 warmup=2"
    terminal, _ = h.launch_ok("bob", line, timeout=600)
    bench = terminal.data.get("bench") or terminal.data
    run = store.get_run(h.r, str((bench.get("runs") or [bench.get("run_id")])[0]))
    table = str(bench.get("table") or "")
    figures = []
    for lv in run.levels:
        view = lv["server_view"]
        assert view["requests"] == lv["completed"] == 8, (view, lv["completed"])  # the warmup is left out
        figures.append(
            {
                "concurrency": lv["concurrency"],
                "client_ttft_ms": round(lv["ttft_ms"]["mean"], 1),
                "server_ttft_ms": view["ttft_ms"],
                "client_e2e_ms": round(lv["e2e_ms"]["mean"], 1),
                "server_e2e_ms": view["e2e_ms"],
                "client_itl_ms": round(lv["itl_ms"]["mean"], 2),
                "server_itl_ms": view["itl_ms"],
                "tokens_per_chunk": lv["delivery"]["tokens_per_chunk"],
                "client": {k: lv["client"].get(k) for k in ("cause", "cpu_pct", "lag_p99_ms", "run_delay_pct")},
            }
        )
    report("client_vs_server", {"levels": figures, "table": table.splitlines()})
    one = run.levels[0]
    assert abs(one["e2e_ms"]["mean"] - one["server_view"]["e2e_ms"]) < 50, figures
    assert one["ttft_ms"]["mean"] > one["server_view"]["ttft_ms"], figures
    assert "TTFT mean client/server" in table, table
    assert "c=1: first token out of the engine at" in table, table
    # never a per-user rate above the aggregate without its reason, never a lag warning on every level
    for lv in run.levels:
        if (lv["per_user_tok_s"] or 0) > lv["output_tok_s"]:
            assert f"c={lv['concurrency']} {lv['per_user_tok_s']:,.0f} against" in table, table
    assert table.count("client timing (") <= 1, table


# ---------------------------------------------------------------- a bounded profile, vLLM's own trace


def test_a_bench_profile_leaves_vllms_own_trace_files_and_says_where(real_host: RealHost) -> None:
    """Issue 22.5 on the real engine: ``profile=3`` on a vLLM started with ``--profiler-config``. A plain
    server (``real-1``) has no ``/start_profile``: the bench is refused with how to launch one, and nothing
    is sent to the server."""
    h = real_host
    refused = h.run("alice", f"/bench 1 in=32 out=8 n=4 warmup=0 profile=3 on {MAIN} any")
    assert refused.ok and refused.job_id, refused.text  # the worker decides: it reads the serving process's flags
    terminal, _ = wait_job(h, refused.job_id)
    assert terminal.type == "failed" and "--profiler-config" in json.dumps(terminal.data), terminal.data
    assert not list((h.work / "vllm-traces").glob("*")), "nothing was profiled"
    terminal, _ = h.launch_ok(
        "alice", f"/launch eager on {PROFILED} then bench 1,2 in=32 out=8 n=4 warmup=0 profile=3", timeout=400
    )
    bench = terminal.data["bench"]
    run = store.get_run(h.r, str(bench["run_id"]))
    profile = run.extra["profile"]
    traces = h.work / "vllm-traces"
    assert (profile["steps"], profile["load"], profile["trace_dir"]) == (3, 2.0, str(traces)), profile
    assert profile["note"] == "", profile
    names = [Path(f["path"]).name for f in profile["files"]]
    # vLLM names the worker's trace <prefix>_rank0.<ns>.pt.trace.json.gz (and the front end's beside it)
    assert any("_rank0." in n and n.endswith(".pt.trace.json.gz") for n in names), names
    assert all(n.startswith("benchbot-") for n in names), names
    for f in profile["files"]:
        assert Path(f["path"]).stat().st_size == f["size_bytes"] > 0
    assert "profile: 3 steps at c=2:" in bench["table"]
    report("profile", {"files": names, "total_bytes": profile["total_bytes"]})
    h.launch_ok("alice", f"/stop {PROFILED}", timeout=120)
    # the next tests count vLLM processes: this host's tree must be gone before they start
    wait_until(lambda: not vllm_tree(h.ports[PROFILED]), timeout=60, what="the profiled vLLM to exit")


# ---------------------------------------------------------------- eval on a model that knows nothing


def test_eval_runs_scores_near_zero_and_is_stored(real_host: RealHost) -> None:
    h = real_host
    terminal, _seen = h.launch_ok("bob", f"/eval n=20 on {MAIN}", timeout=400)
    run_ids = terminal.data.get("runs") or [terminal.data.get("run_id")]
    run = store.get_run(h.r, str(run_ids[0]))
    assert run.eval is not None
    assert run.eval["n"] == 20
    assert run.eval["accuracy"] <= 0.1, run.eval  # the successor model answers nonsense
    listed = h.run("bob", "/runs 5")
    assert listed.ok and run.id in listed.text, listed.text
    report("eval", {"n": run.eval["n"], "accuracy": run.eval["accuracy"]})


# ---------------------------------------------------------------- stop: nothing left


def test_stop_takes_the_whole_tree_and_frees_the_port(real_host: RealHost) -> None:
    h = real_host
    tree = vllm_tree(h.ports[MAIN])
    titles = {Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0] for p in tree}
    assert any(t.startswith(b"VLLM::EngineCore") for t in titles), titles
    h.launch_ok("bob", f"/stop {MAIN}", timeout=120)
    wait_until(lambda: not vllm_tree(h.ports[MAIN]), timeout=30, what="every vLLM process to exit")
    for pid in tree:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"pid {pid} outlived /stop"
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", h.ports[MAIN]))  # the port is free again
    assert status_of(h)["state"] == "none", status_of(h)["_text"]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


# ---------------------------------------------------------------- real failures, real words


def failed_launch(h: RealHost, user: str, line: str) -> dict[str, Any]:
    reply = h.run(user, line)
    assert reply.ok and reply.job_id, reply.text
    terminal, _ = wait_job(h, reply.job_id)
    assert terminal.type == "failed", terminal.data
    return dict(terminal.data)


def test_a_missing_model_path_is_diagnosed_from_vllms_own_text(real_host: RealHost) -> None:
    data = failed_launch(real_host, "alice", f"/launch eager on {BAD_MODEL}")
    diagnosis = data["diagnosis"]
    assert diagnosis["category"] == "config_error", diagnosis
    assert str(real_host.config.hosts[BAD_MODEL].engine.model) in diagnosis["summary"] + diagnosis.get("evidence", "")
    assert not api_servers(real_host, BAD_MODEL)


def test_kv_space_too_small_for_the_context_is_diagnosed(real_host: RealHost) -> None:
    # 512 KiB: vLLM says it holds 128 tokens of this model ("the estimated maximum model length is 128"), not 512.
    data = failed_launch(real_host, "alice", f"/launch eager --kv-cache-memory-bytes 524288 on {MAIN}")
    diagnosis = data["diagnosis"]
    assert diagnosis["category"] == "oom", diagnosis
    assert "512" in diagnosis["summary"], diagnosis  # the model's max length, from vLLM's own line
    assert "--kv-cache-memory-bytes" in diagnosis["summary"], diagnosis
    # and a cache too small for even one block says so in vLLM's other words
    tiny = failed_launch(real_host, "alice", f"/launch eager --kv-cache-memory-bytes 16384 on {MAIN}")["diagnosis"]
    assert tiny["category"] == "oom" and "--kv-cache-memory-bytes" in tiny["summary"], tiny
    assert not api_servers(real_host)


def test_an_unknown_flag_is_refused_before_spawning_and_vllm_would_say_so_too(real_host: RealHost) -> None:
    h = real_host
    refused = h.run("alice", f"/launch eager --no-such-flag 1 on {MAIN}")
    # The worker checks the flag against the recorded 0.32.0 parser of the version the host runs, before it
    # spawns anything (the bot may not know the host's version, so it queues the launch).
    if refused.job_id:
        terminal, seen = wait_job(h, refused.job_id)
        assert terminal.type == "failed", terminal.data
        assert terminal.data["diagnosis"]["category"] == "config_error", terminal.data
        assert "--no-such-flag" in json.dumps(terminal.data)
        assert not [e for e in seen if e.type == "progress" and e.data.get("phase") == "spawn"], "it spawned"
    else:
        assert "--no-such-flag" in refused.text
    # vLLM itself, same flag: the text the recorded contract holds, and the rule benchbot diagnoses with.
    venv = Path(h.config.hosts[MAIN].engine.command[0]).parents[1]
    done = subprocess.run(
        [str(venv / "bin" / "vllm"), "serve", str(h.config.hosts[MAIN].engine.model), "--no-such-flag", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(h.work), "HF_HUB_OFFLINE": "1"},
        check=False,
    )
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last == "vllm: error: unrecognized arguments: --no-such-flag 1"
    from workers.engines.vllm.driver import DRIVER

    found = DRIVER.diagnose(done.stderr, exited=True, timed_out=False, contract=None)
    assert found.category == "config_error" and "--no-such-flag" in found.summary


def test_degenerate_output_of_a_broken_model_is_caught_by_the_smoke_test(real_host: RealHost) -> None:
    data = failed_launch(real_host, "alice", f"/launch eager on {BROKEN}")
    diagnosis = data["diagnosis"]
    assert diagnosis["category"] == "garbage_output", diagnosis
    assert not api_servers(real_host, BROKEN), "a launch that failed its smoke test leaves no server"


def test_the_port_held_by_an_unrelated_process_is_left_alone(real_host: RealHost) -> None:
    h = real_host
    holder = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(h.ports[MAIN]), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: _listening(h.ports[MAIN]), timeout=20, what="the unrelated server to listen")
        reply = h.run("alice", f"/launch eager on {MAIN}")
        if reply.job_id:
            terminal, _ = wait_job(h, reply.job_id)
            assert terminal.type == "failed", terminal.data
            text = json.dumps(terminal.data)
        else:
            text = reply.text
        assert str(holder.pid) in text, text
        assert holder.poll() is None, "the unrelated process was signalled"
        assert not api_servers(h), "no vLLM was started on a port someone else holds"
    finally:
        holder.kill()
        holder.wait(timeout=10)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
