"""The eval runner against the real simulator on 127.0.0.1: good configs answer right and are not flagged,
cutedsl answers garbage, the degraded FP4 path is flagged against the good baseline at the default n."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.util import free_port
from workers.errors import LeaseLostError
from workers.evaluation.runner import EvalError, EvalParams, EvalRun, run_eval
from workers.evaluation.tasks import DEFAULT_N, builtin_task
from workers.sim.launcher import SimProcess, start_sim

MODEL = "nvidia/Qwen3.5-397B-A17B-NVFP4"
# Fixed timing with tiny latencies: the accuracy does not depend on the timing model, and 300 questions
# then take about a second.
FAST = [
    "--model-path",
    MODEL,
    "--tp",
    "8",
    "--quantization",
    "modelopt_fp4",
    "--sim-timing",
    "fixed",
    "--sim-ttft-ms",
    "2",
    "--sim-itl-ms",
    "0.2",
    "--skip-server-warmup",
]
GOOD = ["--moe-runner-backend", "flashinfer_cutlass", "--fp4-gemm-backend", "flashinfer_cudnn"]  # the seed's
DEGRADED = ["--moe-runner-backend", "flashinfer_cutlass", "--fp4-gemm-backend", "flashinfer_cutlass"]
CUTEDSL = ["--moe-runner-backend", "flashinfer_cutedsl", "--fp4-gemm-backend", "flashinfer_cudnn"]
NEXTN = ["--speculative-algorithm", "NEXTN", "--mamba-scheduler-strategy", "extra_buffer"]


def _sim(state: Path, *args: str) -> SimProcess:
    """A sim with its own state dir: simulated hosts sharing one would share (and run out of) GPU memory."""
    return start_sim(free_port(), *FAST, *args, env={"BENCHBOT_SIM_STATE_DIR": str(state)})


@pytest.fixture(scope="module")
def good_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    with _sim(tmp_path_factory.mktemp("good-sim"), *GOOD, "--enable-metrics") as sim:
        yield sim


@pytest.fixture(scope="module")
def good_run(good_sim: SimProcess) -> EvalRun:
    """The host's baseline: the seed's good config, the built-in task at the default n, chat API."""
    return asyncio.run(run_eval(good_sim.base_url, builtin_task()))


def _requests_served(sim: SimProcess) -> float:
    metrics = httpx.get(sim.base_url + "/metrics", timeout=10).text
    line = next(ln for ln in metrics.splitlines() if ln.startswith("sglang:num_requests_total"))
    return float(line.rsplit(" ", 1)[1])


def test_good_config_answers_every_builtin_question(good_run: EvalRun) -> None:
    assert len(good_run.items) == DEFAULT_N and good_run.accuracy.correct == DEFAULT_N
    assert good_run.failed_requests == 0 and good_run.model == MODEL and good_run.api == "chat"
    assert good_run.task == "builtin" and good_run.task_fingerprint == builtin_task().fingerprint
    assert good_run.completion_tokens > 0
    shapes = {r.reply.split(" ")[0] for r in good_run.items if r.kind != "copy"}
    assert {"The", "Let", "Answer:"} <= shapes  # the answers come in prose, not just bare numbers


@pytest.mark.parametrize("api", ["completions", "generate"])
def test_good_config_answers_right_on_the_other_apis_too(good_sim: SimProcess, api: str) -> None:
    progress: list[tuple[int, int]] = []
    run = asyncio.run(
        run_eval(
            good_sim.base_url,
            builtin_task(60),
            EvalParams(api=api, concurrency=8),
            on_progress=lambda done, total: progress.append((done, total)),
        )
    )
    assert run.accuracy.correct == 60 and run.api == api
    assert len(progress) == 60 and progress[-1] == (60, 60)


def test_degraded_fp4_path_is_flagged_against_the_good_baseline_at_the_default_n(
    tmp_path: Path, good_run: EvalRun
) -> None:
    with _sim(tmp_path, *DEGRADED) as sim:
        run = asyncio.run(run_eval(sim.base_url, builtin_task()))
        again = asyncio.run(run_eval(sim.base_url, builtin_task(100), EvalParams(api="completions")))
    assert 0.90 <= run.accuracy.value <= 0.98  # a few points down: the smoke test would never notice
    verdict = run.compare_to(good_run)
    assert verdict.flagged and verdict.test == "mcnemar_exact" and verdict.shared == DEFAULT_N
    assert verdict.better == 0 and verdict.worse == DEFAULT_N - run.accuracy.correct
    assert verdict.summary().startswith("ACCURACY DROP: ")
    wrong = [r for r in run.items if not r.correct]
    assert all(r.reason.startswith("expected ") and r.extracted is not None for r in wrong)
    # deterministic by question, whatever the API or n: the same items fail
    assert {r.id for r in again.items if not r.correct} == {r.id for r in wrong if int(r.id[:4]) < 100}


def test_other_good_configs_are_not_flagged(tmp_path: Path, good_run: EvalRun) -> None:
    with _sim(tmp_path, *GOOD, *NEXTN) as sim:
        run = asyncio.run(run_eval(sim.base_url, builtin_task()))
    verdict = run.compare_to(good_run)
    assert run.accuracy.correct == DEFAULT_N and not verdict.flagged and verdict.verdict == "within_noise"
    assert verdict.summary() == "accuracy 100.0 % (baseline 100.0 %, difference within noise)"


def test_cutedsl_answers_garbage_and_scores_zero(tmp_path: Path, good_run: EvalRun) -> None:
    with _sim(tmp_path, *CUTEDSL) as sim:
        run = asyncio.run(run_eval(sim.base_url, builtin_task(30), EvalParams(max_tokens=32)))
    assert run.accuracy.correct == 0 and len(run.items) == 30
    assert all(r.reply == "!" * 32 and r.reason.startswith("garbage: the output is only '!'") for r in run.items)
    assert run.compare_to(good_run).flagged


def test_gate_runs_before_every_request_and_what_it_raises_stops_the_eval(good_sim: SimProcess) -> None:
    calls = 0

    def gate() -> None:
        nonlocal calls
        calls += 1

    run = asyncio.run(run_eval(good_sim.base_url, builtin_task(12), EvalParams(concurrency=4), gate=gate))
    assert run.accuracy.correct == 12 and calls == 12 + 1  # every item, and the model lookup before them

    before = _requests_served(good_sim)

    def fence(allowed: int = 4) -> None:
        nonlocal calls
        calls += 1
        if calls > allowed:
            raise LeaseLostError("the lease on sim was taken over")

    calls = 0
    with pytest.raises(LeaseLostError, match="taken over"):
        asyncio.run(run_eval(good_sim.base_url, builtin_task(12), EvalParams(concurrency=1), gate=fence))
    assert _requests_served(good_sim) - before == 3  # model lookup + 3 questions passed; nothing after


def test_a_server_that_refuses_every_request_is_an_error_not_an_accuracy(good_sim: SimProcess) -> None:
    with pytest.raises(EvalError, match=r"the server failed 4 of the 4 requests .*HTTP 400: .*maximum context"):
        asyncio.run(run_eval(good_sim.base_url, builtin_task(30), EvalParams(max_tokens=10**7, concurrency=1)))


def test_nothing_listening_is_an_eval_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EvalError, match="ConnectError"):
        asyncio.run(run_eval(url, builtin_task(5), EvalParams(api="generate", retries=1)))
    with pytest.raises(EvalError, match="could not read the model name from /v1/models"):
        asyncio.run(run_eval(url, builtin_task(5)))


def test_api_key_is_sent_when_the_server_wants_one(tmp_path: Path) -> None:
    with _sim(tmp_path, *GOOD, "--api-key", "sk-eval-test") as sim:
        run = asyncio.run(run_eval(sim.base_url, builtin_task(6), EvalParams(api_key="sk-eval-test")))
        assert run.accuracy.correct == 6
        with pytest.raises(EvalError, match="401"):
            asyncio.run(run_eval(sim.base_url, builtin_task(6)))
    assert "sk-eval-test" not in json.dumps(EvalParams(api_key="sk-eval-test").to_dict())


def test_eval_run_round_trips_through_json_and_compares_only_the_same_task(good_run: EvalRun) -> None:
    data = json.loads(json.dumps(good_run.to_dict()))
    assert data["accuracy"]["correct"] == DEFAULT_N and len(data["items"]) == DEFAULT_N
    assert EvalRun.from_dict(data) == good_run
    other = EvalRun.from_dict({**data, "task": "gsm8k"})
    with pytest.raises(EvalError, match="the baseline ran task 'gsm8k', this run 'builtin'"):
        good_run.compare_to(other)
    with pytest.raises(EvalError, match="schema 2"):
        EvalRun.from_dict({**data, "schema": 2})
    with pytest.raises(EvalError, match="malformed"):
        EvalRun.from_dict({**data, "items": [{"id": "x"}]})


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"api": "grpc"}, "use one of chat, completions, generate"),
        ({"concurrency": 0}, "concurrency 0"),
        ({"max_tokens": 0}, "max_tokens 0"),
        ({"concurrency": "8"}, "concurrency '8'"),
        ({"retries": 9}, "retries 9: use 0 to 5"),
        ({"timeout_s": 0}, "timeout_s 0"),
    ],
)
def test_eval_params_refuse_bad_values(kwargs: dict, needle: str) -> None:
    with pytest.raises(EvalError, match=needle):
        EvalParams(**kwargs)
