"""The simulator's accuracy model: which backends answer right, how the degraded path goes wrong, and how
an answer is served (EOS after it, or the usual words with ignore_eos)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.util import free_port
from workers.evaluation.scoring import score_item
from workers.evaluation.tasks import DEFAULT_N, builtin_task
from workers.sim import answers
from workers.sim import args as sim_args
from workers.sim.launcher import SimProcess, start_sim
from workers.sim.text import EOS_TOKEN_ID

MODEL = "nvidia/Qwen3.5-397B-A17B-NVFP4"
BASE = ["--model-path", MODEL, "--tp", "8", "--quantization", "modelopt_fp4"]
QUESTION = "What is 123 * 45? Answer with the final number."
REPLY = "Answer: 5,535\n"  # the prose shape is chosen by a hash of the question


def _quality(flags: list[str], version: str = "0.5.9", sm: int = 120) -> str:
    ns = sim_args.parse([*BASE, *flags], {"BENCHBOT_SIM_SGLANG_VERSION": version})
    return answers.quality_for(ns, version, sm)


@pytest.mark.parametrize(
    ("flags", "version", "sm", "quality"),
    [
        (
            ["--moe-runner-backend", "flashinfer_cutlass", "--fp4-gemm-backend", "flashinfer_cudnn"],
            "0.5.9",
            120,
            "good",
        ),
        (
            ["--moe-runner-backend", "flashinfer_cutlass", "--fp4-gemm-backend", "flashinfer_cutlass"],
            "0.5.9",
            120,
            "degraded",
        ),
        (["--moe-runner-backend", "flashinfer_cutlass"], "0.5.9", 120, "degraded"),  # 0.5.9's default FP4 GEMM
        (["--moe-runner-backend", "flashinfer_cutlass"], "0.5.23", 120, "degraded"),  # auto -> cutlass on SM120
        (["--moe-runner-backend", "flashinfer_cutlass"], "0.5.23", 100, "good"),  # auto -> cutedsl FP4 on SM100
        (["--fp4-gemm-backend", "flashinfer_cutlass"], "0.5.9", 120, "good"),  # MoE runner auto
        (["--moe-runner-backend", "cutlass", "--fp4-gemm-backend", "flashinfer_cutlass"], "0.5.9", 120, "good"),
    ],
)
def test_one_backend_combination_is_degraded(flags: list[str], version: str, sm: int, quality: str) -> None:
    assert _quality(flags, version, sm) == quality


def test_the_degraded_path_misses_about_five_percent_and_enough_at_the_default_n() -> None:
    prompts = [item.prompt for item in builtin_task(5000).items]
    share = sum(map(answers.degraded_wrong, prompts)) / len(prompts)
    assert 0.04 <= share <= 0.06
    # at the default n, more misses than the 7 one-way discordant pairs McNemar needs at alpha 0.01
    assert sum(map(answers.degraded_wrong, prompts[:DEFAULT_N])) >= 7


def test_degraded_answers_are_one_character_off_and_good_ones_are_right() -> None:
    for item in builtin_task(3000).items:
        good = answers.reply_for(item.prompt, answers.GOOD)
        bad = answers.reply_for(item.prompt, answers.DEGRADED)
        assert good is not None and score_item(item, good).correct, good
        if not answers.degraded_wrong(item.prompt):
            assert bad == good
            continue
        result = score_item(item, bad)
        assert not result.correct and result.extracted is not None
        if item.kind != "copy":  # still a number of the same length, one digit changed
            got = result.extracted
            assert len(got) == len(item.expected) and sum(a != b for a, b in zip(got, item.expected, strict=True)) == 1
        else:
            assert len(bad) == len(item.expected) and sum(a != b for a, b in zip(bad, item.expected, strict=True)) == 1


def test_other_prompts_are_not_answered() -> None:
    assert answers.reply_for("The capital of France is", answers.GOOD) is None
    oracle = answers.Oracle(answers.GOOD)
    assert oracle.replies([[1, 2, 3], "x", QUESTION]) == [None, None, REPLY]
    assert oracle.chat_replies([{"role": "system", "content": QUESTION}, {"role": "user", "content": "hi"}]) == [None]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    state = tmp_path_factory.mktemp("sim-state")
    with start_sim(
        free_port(),
        *BASE,
        "--moe-runner-backend",
        "flashinfer_cutlass",
        "--fp4-gemm-backend",
        "flashinfer_cudnn",
        "--sim-timing",
        "fixed",
        "--sim-ttft-ms",
        "2",
        "--sim-itl-ms",
        "0.2",
        "--skip-server-warmup",
        env={"BENCHBOT_SIM_STATE_DIR": str(state)},
    ) as proc:
        yield proc


def test_an_answer_ends_with_eos_like_a_model_that_is_done(sim: SimProcess) -> None:
    out = httpx.post(
        sim.base_url + "/generate",
        json={"text": QUESTION, "sampling_params": {"temperature": 0, "max_new_tokens": 100}},
        timeout=30,
    ).json()
    assert out["text"] == REPLY and out["meta_info"]["completion_tokens"] == len(REPLY)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS_TOKEN_ID}
    cut = httpx.post(
        sim.base_url + "/v1/completions", json={"model": MODEL, "prompt": QUESTION, "max_tokens": 10}, timeout=30
    ).json()
    assert cut["choices"][0]["text"] == REPLY[:10] and cut["choices"][0]["finish_reason"] == "length"


def test_with_ignore_eos_the_answer_is_followed_by_the_usual_words(sim: SimProcess) -> None:
    out = httpx.post(
        sim.base_url + "/generate",
        json={"text": [QUESTION, "hello"], "sampling_params": {"max_new_tokens": 60, "ignore_eos": True}},
        timeout=30,
    ).json()
    assert out[0]["text"].startswith(REPLY)
    assert len(out[0]["text"]) > 50 and out[0]["meta_info"]["completion_tokens"] == 60
    assert "5,535" not in out[1]["text"] and out[1]["meta_info"]["completion_tokens"] == 60


def test_chat_answers_the_last_user_message_and_streams_it(sim: SimProcess) -> None:
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": 100,
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": QUESTION}],
    }
    deltas = []
    with httpx.stream("POST", sim.base_url + "/v1/chat/completions", json=body, timeout=30) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                choices = json.loads(line[len("data: ") :])["choices"]
                deltas += [c["delta"].get("content") or "" for c in choices]
    assert "".join(deltas) == REPLY
    assert len([d for d in deltas if d]) == len(REPLY)  # one token per character


def test_cutedsl_still_answers_bangs_to_a_question(tmp_path: Path) -> None:
    with start_sim(
        free_port(),
        *BASE,
        "--moe-runner-backend",
        "flashinfer_cutedsl",
        "--skip-server-warmup",
        "--sim-timing",
        "fixed",
        "--sim-ttft-ms",
        "2",
        "--sim-itl-ms",
        "0.2",
        env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path)},
    ) as proc:
        out = httpx.post(
            proc.base_url + "/generate", json={"text": QUESTION, "sampling_params": {"max_new_tokens": 12}}, timeout=30
        ).json()
    assert out["text"] == "!" * 12 and out["output_ids"] == [0] * 12


def test_the_batch_scheduler_with_speculative_chunks_serves_the_same_answer(tmp_path: Path) -> None:
    """Model timing (the default) and NEXTN's multi-token verify steps: the text is the answer all the same."""
    with start_sim(
        free_port(),
        *BASE,
        "--moe-runner-backend",
        "flashinfer_cutlass",
        "--fp4-gemm-backend",
        "flashinfer_cudnn",
        "--speculative-algorithm",
        "NEXTN",
        "--mamba-scheduler-strategy",
        "extra_buffer",
        "--skip-server-warmup",
        env={"BENCHBOT_SIM_STATE_DIR": str(tmp_path), "SGLANG_ENABLE_SPEC_V2": "1"},
    ) as proc:
        out = httpx.post(
            proc.base_url + "/generate",
            json={"text": QUESTION, "sampling_params": {"temperature": 0, "max_new_tokens": 64}},
            timeout=30,
        ).json()
    assert out["text"] == REPLY and out["meta_info"]["finish_reason"]["type"] == "stop"
    assert out["meta_info"]["spec_verify_ct"] < len(REPLY)  # several tokens per verify step
