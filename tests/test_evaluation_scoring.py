"""Scoring on hand-made replies, Wilson intervals and exact tests against hand-computed values, and the
baseline comparison on synthetic results whose answer is known."""

from __future__ import annotations

import pytest

from workers.evaluation.scoring import (
    Accuracy,
    ItemResult,
    compare,
    extract_last_number,
    fisher_exact_p,
    mcnemar_exact_p,
    score_item,
    strip_reasoning,
    wilson_interval,
)
from workers.evaluation.tasks import Item

NUM = Item(
    id="0001-add",
    prompt="What is 711913 + 362676? Answer with the final number.",
    expected="1074589",
    method="number",
    kind="add",
)
COPY = Item(
    id="0002-copy",
    prompt="Repeat ...:\namber falcon K7q-29x",
    expected="amber falcon K7q-29x",
    method="exact",
    kind="copy",
)
LETTER = Item(
    id="line-3", prompt="Pick", expected="B", method="regex", pattern=r"answer is \(?([A-D])\)?", kind="jsonl"
)
GSM = Item(id="line-9", prompt="Janet...", expected="18", method="regex", pattern=r"#### (\S+)", kind="jsonl")


# ------------------------------------------------------------------------------------------ extraction


@pytest.mark.parametrize(
    "reply",
    [
        "The answer is 1074589.",
        "711913 + 362676 = 1,074,589",
        "Let me compute it: the result is **1074589**.",
        "Answer: 1,074,589\n",
        "$$\\boxed{1074589}$$",
        "I first got 1074588, but checking again: 1074589!",
        "1074589.0",
        "<think>711913 + 362676 ... maybe 1074590?</think>\nThe sum is 1074589",
    ],
)
def test_numbers_inside_prose_are_found(reply: str) -> None:
    result = score_item(NUM, reply)
    assert result.correct and result.extracted in ("1074589", "1074589.0") and result.reason == "matched"


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("The answer is 1074588.", "expected 1074589, got 1074588"),
        ("1074589 is what the intern said, but it is 17.", "expected 1074589, got 17"),
        ("I cannot compute that.", "no number in the reply"),
        ("", "garbage: the output is empty"),
        ("!!!!!!!!!!!!!!!!", "garbage: the output is only '!'"),
    ],
)
def test_wrong_numbers_say_why(reply: str, reason: str) -> None:
    result = score_item(NUM, reply)
    assert not result.correct and result.reason.startswith(reason)


def test_last_number_keeps_thousands_groups_apart_from_lists_and_words() -> None:
    assert extract_last_number("totals 3, 4 and 5") == "5"
    assert extract_last_number("1,234,567 units") == "1234567"
    assert extract_last_number("step2 of 3: x = -12.") == "-12"
    assert extract_last_number("version v2") is None


def test_cut_off_replies_and_unfinished_reasoning_are_explained() -> None:
    cut = score_item(NUM, "Let me add 711913 and 362676 step by", finish_reason="length")
    assert not cut.correct and cut.reason == "expected 1074589, got 362676 (cut off at max_tokens)"
    thinking = score_item(NUM, "<think>711913 + 362676, carry the", finish_reason="length")
    assert not thinking.correct and "ended inside <think>" in thinking.reason
    assert strip_reasoning("<think>a</think>b<think>c</think>d") == "bd"


def test_failed_request_is_wrong_with_the_error() -> None:
    result = score_item(NUM, None, error="HTTP 500: boom")
    assert not result.correct and result.reason == "no reply: HTTP 500: boom"


@pytest.mark.parametrize(
    "reply",
    [
        "amber falcon K7q-29x",
        "  amber   falcon\nK7q-29x \n",
        '"amber falcon K7q-29x"',
        "`amber falcon K7q-29x`",
        "```text\namber falcon K7q-29x\n```",
    ],
)
def test_exact_copy_forgives_whitespace_and_one_wrapping(reply: str) -> None:
    assert score_item(COPY, reply).correct


@pytest.mark.parametrize(
    "reply", ["amber falcon K7q-29X", "amber falcon K7q-29x.", "Sure! amber falcon K7q-29x", "amberfalcon K7q-29x"]
)
def test_exact_copy_refuses_any_other_character(reply: str) -> None:
    result = score_item(COPY, reply)
    assert not result.correct and result.reason.startswith("expected 'amber falcon K7q-29x', got ")


def test_regex_items_take_the_last_match_and_its_group() -> None:
    assert score_item(LETTER, "Not A. The answer is (B).").correct
    assert score_item(LETTER, "the answer is A, no wait, the answer is B").correct
    wrong = score_item(LETTER, "The answer is C")
    assert not wrong.correct and wrong.extracted == "C" and wrong.reason == "expected 'B', got 'C'"
    missing = score_item(LETTER, "B")
    assert not missing.correct and missing.reason == "the item's regex found nothing in the reply"
    assert score_item(GSM, "She pays 9 * 2 = 18 dollars.\n#### 18.00").correct  # numeric equality
    assert score_item(Item("x", "q", "5", "regex", r"\d+"), "3 then 5").correct  # no group: the whole match


# ------------------------------------------------------------------------------------------ statistics


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [
        # by hand: lo/hi = (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n), z = 1.96, z² = 3.8415
        (0, 10, 0.0, 0.2775),  # hi = z²/(n + z²) = 3.8415 / 13.8415
        (5, 10, 0.2366, 0.7634),  # centre 0.5, half = 1.4160 · sqrt(0.025 + 0.0096) = 0.2634
        (95, 100, 0.8882, 0.9785),  # centre 0.96921/1.03841 = 0.93335, half = 1.88746 · 0.023896 = 0.04510
        (300, 300, 0.98735, 1.0),  # lo = n/(n + z²) = 300/303.8415
    ],
)
def test_wilson_interval_matches_hand_computed_values(k: int, n: int, lo: float, hi: float) -> None:
    got = wilson_interval(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)


def test_wilson_interval_with_no_items_says_nothing_is_known() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert str(Accuracy(288, 300)) == "96.0 % (288/300, 95 % CI 93.1-97.7 %)"


def test_exact_tests_match_hand_computed_values() -> None:
    assert mcnemar_exact_p(7, 0) == 1 / 128
    assert mcnemar_exact_p(10, 3) == pytest.approx((286 + 78 + 13 + 1) / 8192)  # C(13,10..13) / 2^13
    assert mcnemar_exact_p(0, 0) == 1.0
    # 3/10 vs 8/10: P(X <= 3), X hypergeometric (20 items, 11 right, 10 drawn) = (11 + 495 + 5940) / C(20,10)
    assert fisher_exact_p(3, 10, 8, 10) == pytest.approx(6446 / 184756)
    assert fisher_exact_p(10, 10, 10, 10) == 1.0


# ------------------------------------------------------------------------------------------ comparison


def _results(pattern: list[bool], prefix: str = "q") -> list[ItemResult]:
    return [
        ItemResult(
            id=f"{i}",
            key=f"{prefix}{i}",
            kind="add",
            correct=ok,
            expected="1",
            extracted="1",
            reason="matched" if ok else "expected 1, got 2",
        )
        for i, ok in enumerate(pattern)
    ]


def _flip(base: list[bool], worse: int, better: int) -> list[bool]:
    """``base`` with ``worse`` right answers made wrong and ``better`` wrong ones made right."""
    out = list(base)
    rights = [i for i, ok in enumerate(base) if ok][:worse]
    wrongs = [i for i, ok in enumerate(base) if not ok][:better]
    for i in rights:
        out[i] = False
    for i in wrongs:
        out[i] = True
    return out


BASE_300 = [i % 20 != 0 for i in range(300)]  # 285/300 = 95.0 %


def test_identical_results_are_within_noise() -> None:
    c = compare(_results(BASE_300), _results(BASE_300))
    assert c.verdict == "within_noise" and not c.flagged and c.test == "mcnemar_exact"
    assert c.summary() == "accuracy 95.0 % (baseline 95.0 %, difference within noise)"


def test_small_noise_both_ways_is_within_noise() -> None:
    c = compare(_results(_flip(BASE_300, worse=5, better=2)), _results(BASE_300))
    assert (c.worse, c.better) == (5, 2) and c.p_drop == pytest.approx(29 / 128)
    assert c.verdict == "within_noise" and not c.flagged
    assert c.summary() == "accuracy 94.0 % (baseline 95.0 %, difference within noise)"


def test_a_real_drop_is_flagged() -> None:
    c = compare(_results(_flip(BASE_300, worse=16, better=1)), _results(BASE_300))
    assert c.flagged and c.verdict == "drop" and c.p_drop < 0.001
    assert c.summary().startswith("ACCURACY DROP: 90.0 % (baseline 95.0 %, 5.0 points lower, beyond noise: p = ")
    assert "16 right only on the baseline, 1 right only here" in c.detail()


def test_seven_one_way_flips_is_the_least_that_300_paired_items_flag() -> None:
    assert compare(_results(_flip(BASE_300, 7, 0)), _results(BASE_300)).flagged
    assert not compare(_results(_flip(BASE_300, 6, 0)), _results(BASE_300)).flagged


def test_a_real_improvement_is_reported_not_flagged() -> None:
    c = compare(_results(BASE_300), _results(_flip(BASE_300, worse=15, better=0)))
    assert c.verdict == "improved" and not c.flagged and "better, beyond noise" in c.summary()


def test_a_significant_but_tiny_drop_is_not_a_red_flag() -> None:
    base = [i % 10 != 0 for i in range(5000)]
    c = compare(_results(_flip(base, worse=40, better=5)), _results(base))
    assert c.p_drop < 0.01 and abs(c.difference) < 0.01 and not c.flagged
    unpaired = compare(_results(_flip(base, worse=40, better=0), prefix="other"), _results(base))
    assert unpaired.test == "fisher_exact" and abs(unpaired.difference) < 0.01 and not unpaired.flagged


def test_small_n_says_how_big_a_drop_it_could_see() -> None:
    base = [True] * 20
    c = compare(_results(_flip(base, worse=2, better=0)), _results(base))
    assert c.verdict == "within_noise" and c.detectable_drop == pytest.approx(7 / 20)
    assert c.summary().endswith("only a drop of 35+ points would show")
    few = compare(_results([False] * 5), _results([True] * 5))
    assert few.verdict == "too_few" and not few.flagged  # 5 of 5 lost is still only p = 1/32
    assert "5 questions are too few" in few.summary()


def test_unpaired_runs_fall_back_to_fisher() -> None:
    base = _results([True] * 300, prefix="a")
    drop = compare(_results([i >= 15 for i in range(300)], prefix="b"), base)
    assert drop.test == "fisher_exact" and drop.shared == 0 and drop.flagged
    noise = compare(_results([i >= 3 for i in range(300)], prefix="b"), base)
    assert noise.test == "fisher_exact" and not noise.flagged and noise.verdict == "within_noise"


def test_paired_comparison_uses_only_the_shared_questions() -> None:
    base = _results(BASE_300)
    cand = _results(_flip(BASE_300[:100], worse=0, better=0))  # the first 100 questions, same answers
    c = compare(cand, base)
    assert c.shared == 100 and c.baseline.n == 100 and c.baseline.correct == sum(BASE_300[:100])
    assert c.verdict == "within_noise"


def test_compare_needs_results_on_both_sides() -> None:
    with pytest.raises(ValueError, match="at least one"):
        compare([], _results([True]))
