"""``/bench ... profile=STEPS``: a bounded engine profile at one level, and where its trace is (issue 22.5).

Grammar (bounded only), the engines' request shapes (SGLang's num_steps; vLLM's max_iterations on a server
started with --profiler-config, refused otherwise), and the capture around a real level against the
simulators over HTTP on 127.0.0.1, the trace files found through a real LocalTransport. A capture whose
fence check fails sends nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from bot.commands import ParseError, parse
from tests.test_sim import BASELINE
from tests.util import free_port, wait_until
from workers.benchmark.client import run_bench
from workers.benchmark.settings import ClientSettings
from workers.benchmark.spec import BenchSpec
from workers.config import EMBEDDED_TOML, parse_config
from workers.engines.profiling import MAX_PROFILE_STEPS, ProfileCall
from workers.engines.registry import driver_for
from workers.errors import BenchbotError, LeaseLostError
from workers.host.local import LocalTransport
from workers.jobs.profile_capture import LevelProfile, describe, parse_listing, profile_id
from workers.sim.launcher import start_sim

CONFIG = parse_config(EMBEDDED_TOML)


def bench(text: str) -> BenchSpec:
    result = parse(f"/bench {text}", CONFIG)
    assert not isinstance(result, ParseError), result
    return result.spec  # type: ignore[union-attr]


def refusal(text: str) -> str:
    result = parse(f"/bench {text}", CONFIG)
    assert isinstance(result, ParseError), result
    return result.message


# ------------------------------------------------------------------ grammar: bounded only


def test_profile_steps_are_parsed_labelled_and_carried_in_the_payload():
    spec = bench("1,32 in=64 out=16 profile=5")
    assert spec.profile_steps == 5
    assert "profile=5" in spec.label
    assert BenchSpec.from_dict(spec.to_dict()) == spec
    assert "profile_steps" not in bench("1,32").to_dict()  # old payload shape when not asked


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("8 profile=0", "never starts an unbounded profile"),
        ("8 profile=", "never starts an unbounded profile"),
        ("8 profile=all", "never starts an unbounded profile"),
        ("8 profile=²", "never starts an unbounded profile"),  # isdigit() is True for it (issue 39 round 4)
        ("8 profile=٣", "never starts an unbounded profile"),
        (f"8 profile={MAX_PROFILE_STEPS + 1}", f"from 1 to {MAX_PROFILE_STEPS}"),
        ("slo ttft=500ms profile=5", "not an SLO search"),
    ],
)
def test_an_unbounded_or_misplaced_profile_is_refused(text: str, said: str):
    assert said in refusal(text)


# ------------------------------------------------------------------ the engines' request shapes


def test_sglang_asks_for_num_steps_into_a_directory_benchbot_chooses():
    call = driver_for("sglang").profile_call(5, "benchbot-7-1", "/var/tmp/benchbot/profiles", {})
    # it stops by itself after num_steps; /stop_profile disarms one whose level ended first (issue 39)
    assert call.start_path == "/start_profile" and call.stop_path == "/stop_profile" and call.stops_itself
    assert call.start_body["num_steps"] == 5 and call.start_body["output_dir"] == "/var/tmp/benchbot/profiles"
    assert call.trace_dir == "/var/tmp/benchbot/profiles" and call.file_prefix == "benchbot-7-1"


def test_vllm_without_a_profiler_is_refused_before_anything_is_sent_and_says_how_to_launch_it():
    with pytest.raises(BenchbotError, match="--profiler-config"):
        driver_for("vllm").profile_call(5, "benchbot-7-1", "/unused", {"--model": "m"})
    config = json.dumps({"profiler": "torch", "torch_profiler_dir": "/srv/traces"})
    call = driver_for("vllm").profile_call(5, "benchbot-7-1", "/unused", {"--profiler-config": config})
    assert call.start_body == {"max_iterations": 5, "profile_prefix": "benchbot-7-1"}
    assert call.stop_path == "/stop_profile" and call.trace_dir == "/srv/traces"
    dotted = {"--profiler-config.profiler": "torch", "--profiler-config.torch_profiler_dir": "/d"}
    assert driver_for("vllm").profile_call(2, "p", "/unused", dotted).trace_dir == "/d"


def test_the_profile_id_is_one_both_engines_accept():
    pid = profile_id("job/17 x", now=1733300000)
    assert pid == "benchbot-job-17-x-1733300000"
    assert pid[0].isalnum() and all(c.isalnum() or c in "._-" for c in pid)


def test_the_trace_listing_parses_find_output_and_skips_junk():
    files = parse_listing("120\t/d/b.trace.json.gz\nnot a line\n\t/x\n80\t/d/a.trace.json.gz\n")
    assert [(f.path, f.size_bytes) for f in files] == [("/d/a.trace.json.gz", 80), ("/d/b.trace.json.gz", 120)]


# ------------------------------------------------------------------ the capture around a real level


def _level_profile(url: str, call: ProfileCall, gate=lambda: None, target: float = 4.0) -> LevelProfile:
    return LevelProfile(
        base_url=url,
        api_key=None,
        transport=LocalTransport("box"),
        call=call,
        steps=3,
        target_load=target,
        gate=gate,
        trace_wait_s=20,
        poll_s=0.05,
    )


PARAMS = ClientSettings(BenchSpec(levels=(1, 4), input_len=32, output_len=16, num_requests=8, warmup=0))


def test_a_capture_at_the_highest_level_leaves_one_trace_per_tp_rank_on_the_host(tmp_path: Path):
    out = tmp_path / "profiles"
    port = free_port()
    with start_sim(port, *BASELINE, env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path / "sim")}) as sim:
        call = driver_for("sglang").profile_call(3, "benchbot-t-1", str(out), {})
        capture = _level_profile(sim.base_url, call)
        levels = asyncio.run(run_bench(sim.base_url, PARAMS, around_level=capture.level))
    assert [lv.metrics.completed for lv in levels] == [8, 8]  # the bench itself is untouched
    result = capture.result
    assert result is not None and result.load == 4.0 and result.note == ""
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"benchbot-t-1-TP-{rank}.trace.json.gz" for rank in range(8)]  # TP 8 in BASELINE
    assert [Path(f.path).name for f in result.files] == names
    assert all(f.size_bytes == (out / Path(f.path).name).stat().st_size > 0 for f in result.files)
    trace = json.loads(gzip.decompress((out / names[0]).read_bytes()))
    assert len(trace["traceEvents"]) >= 3  # at least the steps asked for
    text = describe(result, open_loop=False)
    assert text.startswith("profile: 3 steps at c=4: 8 trace file(s), ") and str(out) in text


def test_a_profile_never_outlives_its_job(tmp_path: Path):
    """Round 4, item 5 (issue 39), against the SGLang simulator: a level shorter than its steps leaves no
    capture armed (the next bench's /start_profile is accepted) and says the steps were not reached; a
    cancelled level disarms it too; a capture an earlier job left armed is stopped before a new one starts;
    benchbot's older traces in the profiles directory are pruned by age and size, this capture's kept."""
    out = tmp_path / "profiles"
    out.mkdir()
    old = out / "benchbot-old-1-TP-0.trace.json.gz"
    old.write_bytes(b"x" * 1000)
    os.utime(old, (1_000_000_000, 1_000_000_000))  # 2001: past any age limit
    big = out / "benchbot-big-2-TP-0.trace.json.gz"
    big.write_bytes(b"x" * 5000)
    foreign = out / "someone-elses.trace"
    foreign.write_bytes(b"x" * 5000)

    def armed(url: str) -> bool:
        """Is a capture running? A start is refused while one runs (the probe's own capture is stopped)."""
        body = {"output_dir": str(tmp_path / "probe"), "profile_id": "probe"}
        if httpx.post(url + "/start_profile", json=body, timeout=10).status_code != 200:
            return True
        assert httpx.post(url + "/stop_profile", timeout=10).status_code == 200
        return False

    with start_sim(free_port(), *BASELINE, env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path / "sim")}) as sim:
        call = driver_for("sglang").profile_call(1000, "benchbot-t-9", str(out), {})
        capture = replace(_level_profile(sim.base_url, call), steps=1000, prune_dir=str(out), max_bytes=4000)
        asyncio.run(run_bench(sim.base_url, PARAMS, around_level=capture.level))
        assert capture.result is not None and not armed(sim.base_url)
        note = capture.result.note
        assert "ended before the capture's 1000 steps were reached: benchbot stopped it" in note, note
        assert capture.result.files  # the shortened trace was written and found
        assert not old.exists() and not big.exists() and foreign.exists()  # by age, then by size; not ours kept
        assert all(Path(f.path).exists() for f in capture.result.files) and "removed 2 older trace" in note

        async def cancelled() -> None:
            again = replace(_level_profile(sim.base_url, call), steps=1000)
            task = asyncio.create_task(_hold(again))
            await asyncio.sleep(0.5)
            assert armed_async_check(sim.base_url)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        asyncio.run(cancelled())
        assert not armed(sim.base_url)

        left = {"output_dir": str(tmp_path / "left"), "profile_id": "left"}  # an earlier job's, never stopped
        assert httpx.post(sim.base_url + "/start_profile", json=left, timeout=10).status_code == 200
        fresh = _level_profile(sim.base_url, driver_for("sglang").profile_call(3, "benchbot-t-10", str(out), {}))
        asyncio.run(run_bench(sim.base_url, PARAMS, around_level=fresh.level))
        assert fresh.result is not None and "a capture left armed on the engine was stopped first" in fresh.result.note
        assert fresh.result.files and not armed(sim.base_url)


async def _hold(capture: LevelProfile) -> None:
    async with capture.level(0, capture.target_load):
        await asyncio.sleep(60)


def armed_async_check(url: str) -> bool:
    """From inside a running loop: a start is refused while a capture runs (nothing is started if not)."""
    with httpx.Client(timeout=10) as client:
        return client.post(url + "/start_profile", json={"output_dir": "/nonexistent-unused"}).status_code != 200


def test_a_capture_whose_fence_check_fails_sends_nothing(tmp_path: Path):
    out = tmp_path / "profiles"
    port = free_port()

    def lost() -> None:
        raise LeaseLostError("the lease on the host was lost")

    with start_sim(port, *BASELINE, env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path / "sim")}) as sim:
        call = driver_for("sglang").profile_call(3, "benchbot-t-2", str(out), {})
        capture = _level_profile(sim.base_url, call, gate=lost)
        with pytest.raises(LeaseLostError):
            asyncio.run(run_bench(sim.base_url, PARAMS, around_level=capture.level))
        # Nothing was started: a stop now is the engine's "not in progress" refusal, and no file exists.
        assert httpx.post(sim.base_url + "/stop_profile", timeout=10).status_code == 500
    assert not out.exists()


def test_the_simulator_refuses_a_second_capture_while_one_runs(tmp_path: Path):
    port = free_port()
    with start_sim(port, *BASELINE, env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path / "sim")}) as sim:
        body = {"output_dir": str(tmp_path / "p"), "profile_id": "x"}  # no num_steps: runs until stopped
        assert httpx.post(sim.base_url + "/start_profile", json=body, timeout=10).status_code == 200
        assert httpx.post(sim.base_url + "/start_profile", json=body, timeout=10).status_code == 500
        stop = httpx.post(sim.base_url + "/stop_profile", timeout=10)
        assert stop.status_code == 200 and "take some time" in stop.text
    assert len(list((tmp_path / "p").glob("x-TP-*.trace.json.gz"))) == 8


@contextlib.contextmanager
def vllm_sim(tmp_path: Path, *flags: str) -> Iterator[str]:
    """A vLLM simulator (its own personality, tiny model) on a free port; killed with its group on exit."""
    port = free_port()
    argv = [sys.executable, "-m", "workers.sim.vllm", "serve", "Qwen/Qwen3-0.6B", "--port", str(port), *flags]
    log = tmp_path / f"vllm-{port}.log"
    env = {**os.environ, "BENCHBOT_SIM_STATE_DIR": str(tmp_path / "sim")}
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the vLLM simulator exited: {log.read_text()[-2000:]}")
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, timeout=60, what="the vLLM simulator to serve")
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_vllm_serves_start_profile_only_when_started_with_a_profiler(tmp_path: Path):
    with vllm_sim(tmp_path) as url:
        assert httpx.post(url + "/start_profile", json={}, timeout=10).status_code == 404
    traces = tmp_path / "vtraces"
    config = json.dumps({"profiler": "torch", "torch_profiler_dir": str(traces)})
    with vllm_sim(tmp_path, "--profiler-config", config) as url:
        call = driver_for("vllm").profile_call(3, "benchbot-v-1", "/unused", {"--profiler-config": config})
        capture = _level_profile(url, call, target=1.0)
        params = ClientSettings(
            BenchSpec(levels=(1,), input_len=32, output_len=16, num_requests=4, warmup=0, api="completions")
        )
        asyncio.run(run_bench(url, params, around_level=capture.level))
        # the session was closed by /stop_profile: a new one may start
        assert httpx.post(url + "/start_profile", json={"max_iterations": 1}, timeout=10).status_code == 200
    assert capture.result is not None and capture.result.note == ""
    names = [Path(f.path).name for f in capture.result.files]
    assert len(names) == 2 and all(n.startswith("benchbot-v-1_") for n in names), names
    assert any("_rank0." in n for n in names) and any(".async_llm." in n for n in names), names
