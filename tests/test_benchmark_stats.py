"""Repeats and verdicts: the t distribution, CI arithmetic by hand, and verdicts on synthetic results."""

from __future__ import annotations

import math
import random

import pytest

from workers.benchmark import stats as st

# Two-sided 95 % critical values of Student's t (any printed table).
T_975 = {
    1: 12.7062,
    2: 4.3027,
    3: 3.1824,
    4: 2.7764,
    5: 2.5706,
    9: 2.2622,
    10: 2.2281,
    29: 2.0452,
    30: 2.0423,
    60: 2.0003,
    120: 1.9799,
}


@pytest.mark.parametrize(("df", "value"), sorted(T_975.items()))
def test_t_quantile_matches_the_printed_table(df, value):
    assert st.t_quantile(0.975, df) == pytest.approx(value, abs=6e-5)
    assert st.t_quantile(0.025, df) == pytest.approx(-value, abs=6e-5)


def test_t_quantile_tends_to_the_normal_and_takes_fractional_df():
    assert st.t_quantile(0.975, math.inf) == pytest.approx(1.959964, abs=1e-6)
    assert st.t_quantile(0.5, 3) == 0.0
    assert st.t_quantile(0.975, 4) < st.t_quantile(0.975, 3.5) < st.t_quantile(0.975, 3)


@pytest.mark.parametrize("t", [-8.0, -1.3, -0.2, 0.0, 0.4, 1.0, 2.5, 6.1237, 40.0])
def test_t_cdf_matches_closed_forms(t):
    """df = 1, 2 and 4 have closed forms (Cauchy and two polynomial ones), independent of the beta function."""
    assert st.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
    assert st.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    x = t / math.sqrt(1 + t * t / 4)
    cdf4 = 0.5 + 3 / 8 * x * (1 - x * x / 12)
    assert st.t_cdf(t, 4) == pytest.approx(cdf4, abs=1e-12)
    assert st.t_two_sided_p(t, 4) == pytest.approx(2 * (1 - cdf4) if t >= 0 else 2 * cdf4, abs=1e-12)


# --- one config ----------------------------------------------------------------------------------------------


def test_estimate_by_hand():
    e = st.estimate([10.0, 12.0, 14.0])
    assert (e.n, e.mean, e.sd) == (3, 12.0, 2.0)
    assert e.half_width == pytest.approx(4.302653 * 2 / math.sqrt(3), abs=1e-5)  # 4.96828
    assert (e.low, e.high) == pytest.approx((12 - 4.968275, 12 + 4.968275), abs=1e-5)
    assert e.to_dict()["ci_low"] == e.low


def test_estimate_of_one_run_has_no_interval_and_missing_values_are_dropped():
    one = st.estimate([1234.0, None, float("nan")])
    assert (one.n, one.mean, one.sd, one.half_width, one.low) == (1, 1234.0, None, None, None)
    assert st.estimate([]).mean is None
    flat = st.estimate([5.0, 5.0, 5.0])
    assert flat.sd == 0.0 and flat.half_width == 0.0


def test_summarize_repeats_over_level_dicts():
    runs = [{"concurrency": 8, "output_tok_s": v, "ttft_ms": {"p99": p}} for v, p in ((100, 50), (110, 70), (90, None))]
    out = st.summarize_repeats(runs, metrics=("output_tok_s", "ttft_ms.p99", "itl_ms.p50"))
    assert out["output_tok_s"].mean == 100 and out["output_tok_s"].n == 3
    assert out["ttft_ms.p99"].n == 2 and out["ttft_ms.p99"].mean == 60
    assert out["itl_ms.p50"].n == 0
    grouped = st.group_by_level([{"concurrency": 8, "x": 1}, {"concurrency": 1}, {"concurrency": 8, "x": 2}])
    assert list(grouped) == [1, 8] and [r.get("x") for r in grouped[8]] == [1, 2]


# --- two configs ---------------------------------------------------------------------------------------------


def test_welch_by_hand_equal_sizes():
    """a = 10, 12, 14; b = 20, 22, 24: se = sqrt(4/3 + 4/3), df = 4, t = 6.1237, p = 0.003602."""
    w = st.welch_test([10, 12, 14], [20, 22, 24])
    assert w.diff == 10
    assert w.se == pytest.approx(math.sqrt(8 / 3))
    assert w.df == pytest.approx(4.0)
    assert w.t == pytest.approx(6.123724, abs=1e-6)
    assert w.p_value == pytest.approx(0.0036022, abs=1e-6)
    assert w.half_width == pytest.approx(2.776445 * math.sqrt(8 / 3), abs=1e-5)


def test_welch_by_hand_unequal_sizes_and_variances():
    """a = 1..4 (var 5/3), b = 2, 4, 6 (var 4): se^2 = 5/12 + 4/3 = 1.75, df = 1.75^2 / (0.41667^2/3 + 1.3333^2/2)."""
    w = st.welch_test([1, 2, 3, 4], [2, 4, 6])
    assert w.se == pytest.approx(math.sqrt(1.75))
    assert w.df == pytest.approx(3.0625 / ((5 / 12) ** 2 / 3 + (4 / 3) ** 2 / 2))  # 3.2347
    assert w.df == pytest.approx(3.2347, abs=1e-4)
    assert w.t == pytest.approx(1.5 / math.sqrt(1.75))
    assert st.welch_test([1.0], [2.0, 3.0]) is None


def test_verdict_significant_speedup():
    v = st.verdict([1000, 1010, 990], [1950, 1960, 1940], metric="output_tok_s", level=32)
    assert v.kind == "significant" and v.significant and v.better is True
    assert v.change_pct == pytest.approx(95.0)
    # ± = t(0.975, 4) * sqrt(100/3 + 100/3) / 1000 * 100 %
    assert v.ci_pct == pytest.approx(2.776445 * math.sqrt(200 / 3) / 10, abs=1e-4)
    assert v.text == "+95 % ± 2.3 % (significant)"
    assert v.test == st.TEST_NAME and "Welch" in v.to_dict()["test"]
    assert v.to_dict()["text"] == v.text


def test_verdict_within_noise():
    v = st.verdict([100, 108, 92], [103, 95, 110], level=8)
    assert v.kind == "no_difference" and not v.significant and v.better is None
    assert v.text.startswith("no difference within noise (+2.7 % ± ")


def test_latency_going_up_is_worse():
    v = st.verdict([50, 51, 49], [80, 81, 79], metric="ttft_ms.p99")
    assert v.significant and v.better is False and v.text.startswith("+60 % ± ")
    assert st.higher_is_better("itl_ms.p50") is False and st.higher_is_better("mystery") is None


def test_one_run_makes_no_claim():
    v = st.verdict([1000], [1950])
    assert v.kind == "single_run" and v.ci_pct is None and v.p_value is None and not v.significant
    assert v.text == "+95 % (1 run each: no confidence interval; use repeat=3 or more)"
    assert st.verdict([1000, 1001], [1950]).text.startswith("+95 % (2 runs vs 1: ")


def test_zero_variance():
    differ = st.verdict([100, 100, 100], [105, 105, 105])
    assert differ.significant and differ.zero_variance and differ.p_value == 0.0
    assert differ.text == "+5.0 % ± 0.0 % (significant; every run gave the same value)"
    same = st.verdict([100, 100], [100, 100])
    assert same.kind == "no_difference" and same.text == "no difference (every run gave the same value)"
    one_flat = st.verdict([100, 100, 100], [110, 111, 112])  # Welch takes the variance of one side only
    assert one_flat.df == pytest.approx(2.0) and one_flat.significant


def test_missing_levels_and_zero_baseline():
    base = {1: [{"output_tok_s": 100}, {"output_tok_s": 102}], 8: [{"output_tok_s": 700}, {"output_tok_s": 710}]}
    cand = {8: [{"output_tok_s": 900}, {"output_tok_s": 905}], 32: [{"output_tok_s": 2000}, {"output_tok_s": 1990}]}
    verdicts = st.compare_levels(base, cand)
    assert [v.level for v in verdicts] == [1, 8, 32]
    assert [v.kind for v in verdicts] == ["missing", "significant", "missing"]
    assert verdicts[0].text == "not measured in the candidate"
    assert verdicts[2].text == "not measured in the baseline"
    failed_level = st.compare_levels(
        {4: [{"ttft_ms": {"p99": None}}]}, {4: [{"ttft_ms": {"p99": None}}]}, metric="ttft_ms.p99"
    )
    assert failed_level[0].text == "not measured"
    zero = st.verdict([0, 0], [1, 2], metric="errors")
    assert zero.kind == "zero_baseline" and zero.text == "baseline is 0: no relative change"


def test_false_positive_rate_is_at_most_five_percent():
    """Same true mean, n=3 each, 4000 trials: Welch at 95 % calls at most ~5 % of them significant.

    At n=3 with equal variances Welch is conservative: 3.4 % in a 40000-trial run.
    """
    rng = random.Random(2026)
    trials = 4000
    hits = sum(
        st.verdict([rng.gauss(100, 5) for _ in range(3)], [rng.gauss(100, 5) for _ in range(3)]).significant
        for _ in range(trials)
    )
    # binomial sd at 3.4 % is 0.29 %: a broken test (always/never significant, wrong df) lands far outside
    assert 0.02 < hits / trials <= 0.05


def test_a_real_difference_is_found_and_its_interval_covers_the_truth_95_percent_of_the_time():
    rng = random.Random(7)
    trials, hits, covered = 1000, 0, 0
    for _ in range(trials):
        a = [rng.gauss(100, 2) for _ in range(5)]
        b = [rng.gauss(110, 3) for _ in range(4)]
        hits += st.verdict(a, b).significant
        w = st.welch_test(a, b)
        covered += w.diff - w.half_width <= 10.0 <= w.diff + w.half_width
        null = st.welch_test(a, [x - 10 for x in b])  # same data shifted: the test and the interval agree
        assert (null.p_value < 0.05) == (abs(null.diff) > null.half_width)
    assert hits / trials > 0.99
    assert 0.93 < covered / trials < 0.975  # Welch's interval is near-exact; binomial sd 0.7 %


def test_render_estimate():
    assert st.render_estimate(st.estimate([1000, 1010, 990]), "tok/s") == "1000 ± 25 tok/s (n=3)"
    assert st.render_estimate(st.estimate([12.345]), "ms") == "12.3 ms (1 run, no interval)"
    assert st.render_estimate(st.estimate([])) == "-"
    assert st.format_number(0.01234) == "0.0123" and st.format_number(5.678) == "5.68"
