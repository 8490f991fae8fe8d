"""Is it real? Mean and 95 % confidence interval over ``repeat=N`` runs, and the verdict of a comparison.

One run of a level gives one number per metric, and the next run of the same config gives another:
GPU clocks, the prefix cache, the box's other tenants and the arrival draw all move it. The only
honest way to say "NEXTN is 95 % faster" is to run each level N times and compare the N numbers of one
config with the N numbers of the other.

- Per metric and level, :func:`estimate` gives the mean and a Student-t 95 % confidence interval over
  the runs (``mean ± t(0.975, n-1) · sd / sqrt(n)``). One run has no interval, and says so.
- :func:`verdict` compares two configs with **Welch's t-test** on the per-run values (unequal variances
  allowed; Welch-Satterthwaite degrees of freedom). Why Welch and not a bootstrap: with the 3-5 runs a
  team can afford per level, a bootstrap has only a handful of distinct resamples (10 for n=3) and
  its percentile interval is too narrow, claiming significance too often; the t interval is exact for
  normal run means, and a run's mean is already an average over hundreds of requests.
- The "±" of a verdict is the 95 % interval of the difference of the means, as a percentage of the
  baseline mean; "significant" means that interval excludes 0 (equivalently p < 0.05).

The t distribution (CDF and quantile) is written out below from the regularized incomplete beta
function, so there is no SciPy dependency. docs/metrics.md defines every phrase rendered here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from workers.json_value import JsonObject

#: One level's metrics as stored (``LevelMetrics.to_dict``, or a stored run's level): read by dotted path, each
#: value narrowed where it is read (:func:`metric_value`).
Level = Mapping[str, object]
L = TypeVar("L", bound=Level)

CONFIDENCE = 0.95
TEST_NAME = "Welch's t-test on the per-run values (95 %)"
#: Metrics a repeated level summarises by default (paths into ``LevelMetrics.to_dict()``).
DEFAULT_METRICS = (
    "output_tok_s",
    "total_tok_s",
    "request_s",
    "per_user_tok_s",
    "ttft_ms.p50",
    "ttft_ms.p99",
    "itl_ms.p50",
    "itl_ms.p99",
    "tpot_ms.p50",
    "e2e_ms.p50",
    "e2e_ms.p99",
)
_HIGHER_IS_BETTER = (
    "output_tok_s",
    "total_tok_s",
    "request_s",
    "per_user_tok_s",
    "peak_output_tok_s",
    "steady.output_tok_s",
    "goodput_rps",
    "spec_accept_length",
    "completed",
)
_LOWER_IS_BETTER_SUFFIX = ("_ms",)
_LOWER_IS_BETTER = ("errors",)


# --- the t distribution ----------------------------------------------------------------------------------


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function, evaluated by the modified Lentz method."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` > 0 degrees of freedom (any real df, as Welch needs)."""
    if df <= 0:
        raise ValueError("degrees of freedom must be > 0")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    if math.isinf(df) or df > 1e7:
        return normal_cdf(t)
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|)."""
    if math.isinf(t):
        return 0.0
    if math.isinf(df) or df > 1e7:
        return math.erfc(abs(t) / math.sqrt(2.0))
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection on :func:`t_cdf`, to ~1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be strictly between 0 and 1")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


# --- one config: mean and interval ---------------------------------------------------------------------


def _clean(values: Iterable[float | None]) -> list[float]:
    return [
        float(v)
        for v in values
        if v is not None and not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)
    ]


@dataclass(frozen=True)
class Estimate:
    """Mean of a metric over runs, with its sample SD and confidence-interval half width (n >= 2)."""

    n: int
    mean: float | None
    sd: float | None
    half_width: float | None
    confidence: float = CONFIDENCE

    @property
    def low(self) -> float | None:
        return None if self.mean is None or self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.mean is None or self.half_width is None else self.mean + self.half_width

    def to_dict(self) -> JsonObject:
        """Stored shape: ``{n, mean, sd, ci_low, ci_high, half_width, confidence}``."""
        return {
            "n": self.n,
            "mean": self.mean,
            "sd": self.sd,
            "ci_low": self.low,
            "ci_high": self.high,
            "half_width": self.half_width,
            "confidence": self.confidence,
        }


def estimate(values: Iterable[float | None], confidence: float = CONFIDENCE) -> Estimate:
    """Mean ± ``t((1+confidence)/2, n-1) · sd / sqrt(n)``; missing (None/NaN) values are left out."""
    xs = _clean(values)
    n = len(xs)
    if n == 0:
        return Estimate(0, None, None, None, confidence)
    mean = math.fsum(xs) / n
    if n == 1:
        return Estimate(1, mean, None, None, confidence)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    return Estimate(n, mean, sd, half, confidence)


def metric_value(level: Level | None, path: str) -> float | None:
    """A number out of a ``LevelMetrics`` dict by dotted path (``"ttft_ms.p99"``); None if absent."""
    value: object = level
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def summarize_repeats(
    runs: Sequence[Level], metrics: Sequence[str] = DEFAULT_METRICS, confidence: float = CONFIDENCE
) -> dict[str, Estimate]:
    """Per metric path, the :class:`Estimate` over the repeated runs of one level."""
    return {m: estimate((metric_value(r, m) for r in runs), confidence) for m in metrics}


def group_by_level(levels: Iterable[L], key: str = "concurrency") -> dict[float, list[L]]:
    """``LevelMetrics`` dicts (repeats interleaved or not) -> ``{level: [run, run, ...]}``, in level order."""
    out: dict[float, list[L]] = {}
    for level in levels:
        value = level.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out.setdefault(value, []).append(level)
    return dict(sorted(out.items()))


def combine_repeats(runs: Sequence[Sequence[JsonObject]]) -> tuple[JsonObject, ...]:
    """``repeat=N`` sweeps (each a list of level dicts, same levels in the same order) -> one dict per level.

    Each level's dict is its **median run** by output tok/s (a real run, so its p50 and p99 belong
    together; a mean of percentiles would describe no run), plus, when there were several runs,
    ``repeats`` (every run's dict) and ``estimates`` (mean and 95 % interval per default metric).
    """
    if not runs:
        return ()
    out = []
    for position in range(len(runs[0])):
        same = [dict(sweep[position]) for sweep in runs if position < len(sweep)]
        ranked = sorted(same, key=lambda lv: metric_value(lv, "output_tok_s") or 0.0)
        level = dict(ranked[(len(ranked) - 1) // 2])
        if len(same) > 1:
            level["repeats"] = same
            level["estimates"] = {m: e.to_dict() for m, e in summarize_repeats(same).items()}
        out.append(level)
    return tuple(out)


def runs_of(level: Level) -> list[Level]:
    """The per-run dicts behind a stored level: its ``repeats`` when repeated, else the level itself."""
    repeats = level.get("repeats")
    if isinstance(repeats, list) and repeats:
        return [run for run in repeats if isinstance(run, Mapping)]
    return [level]


# --- two configs: the verdict --------------------------------------------------------------------------


@dataclass(frozen=True)
class Welch:
    """Welch's t-test of ``mean(b) - mean(a)``: the difference, its CI half width, df, t and p."""

    diff: float
    se: float
    df: float
    t: float
    p_value: float
    half_width: float


def welch_test(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Welch | None:
    """None when either side has fewer than 2 values (no variance, so nothing to test).

    Zero variance on both sides (every run gave the same value): a difference of the means is then
    exact as far as the runs can tell (t = ±inf, p = 0), equal means give p = 1; df = n_a + n_b - 2.
    """
    xs, ys = _clean(a), _clean(b)
    na, nb = len(xs), len(ys)
    if na < 2 or nb < 2:
        return None
    ma, mb = math.fsum(xs) / na, math.fsum(ys) / nb
    va = math.fsum((x - ma) ** 2 for x in xs) / (na - 1)
    vb = math.fsum((y - mb) ** 2 for y in ys) / (nb - 1)
    diff = mb - ma
    qa, qb = va / na, vb / nb
    se = math.sqrt(qa + qb)
    if se == 0:
        df = float(na + nb - 2)
        t = 0.0 if diff == 0 else math.copysign(math.inf, diff)
        return Welch(diff, 0.0, df, t, 1.0 if diff == 0 else 0.0, 0.0)
    df = (qa + qb) ** 2 / ((qa * qa / (na - 1) if qa else 0.0) + (qb * qb / (nb - 1) if qb else 0.0))
    t = diff / se
    half = t_quantile((1 + confidence) / 2, df) * se
    return Welch(diff, se, df, t, t_two_sided_p(t, df), half)


def higher_is_better(metric: str) -> bool | None:
    """Direction of a metric path: True for throughputs, False for latencies and errors, None if unknown."""
    if metric in _HIGHER_IS_BETTER:
        return True
    head = metric.split(".")[0]
    if head.endswith(_LOWER_IS_BETTER_SUFFIX) or metric in _LOWER_IS_BETTER:
        return False
    return None


#: Verdict kinds: ``significant``, ``no_difference``, ``single_run`` (a side has one run: no test),
#: ``missing`` (a side has no value at this level), ``zero_baseline`` (no relative change exists).
KINDS = ("significant", "no_difference", "single_run", "missing", "zero_baseline")


@dataclass(frozen=True)
class Verdict:
    """The comparison of one metric at one level: candidate against baseline."""

    metric: str
    level: float | None
    kind: str
    baseline: Estimate
    candidate: Estimate
    change_pct: float | None
    ci_pct: float | None
    p_value: float | None
    df: float | None
    better: bool | None
    zero_variance: bool = False
    test: str = TEST_NAME

    @property
    def significant(self) -> bool:
        return self.kind == "significant"

    @property
    def text(self) -> str:
        return render_verdict(self)

    def to_dict(self) -> JsonObject:
        return {
            "metric": self.metric,
            "level": self.level,
            "kind": self.kind,
            "significant": self.significant,
            "change_pct": self.change_pct,
            "ci_pct": self.ci_pct,
            "p_value": self.p_value,
            "df": self.df,
            "better": self.better,
            "zero_variance": self.zero_variance,
            "test": self.test,
            "baseline": self.baseline.to_dict(),
            "candidate": self.candidate.to_dict(),
            "text": self.text,
        }


def verdict(
    baseline: Iterable[float | None],
    candidate: Iterable[float | None],
    *,
    metric: str = "output_tok_s",
    level: float | None = None,
    confidence: float = CONFIDENCE,
) -> Verdict:
    """Compare the candidate's runs with the baseline's runs for one metric at one level.

    ``significant`` needs at least 2 runs on each side and a confidence interval of the difference that
    excludes 0; with 1 run on a side the change is shown but no claim is made (``single_run``).
    """
    a, b = _clean(baseline), _clean(candidate)
    ea, eb = estimate(a, confidence), estimate(b, confidence)
    direction = higher_is_better(metric)

    def make(
        kind: str,
        change: float | None = None,
        ci: float | None = None,
        p: float | None = None,
        df: float | None = None,
        zero_var: bool = False,
    ) -> Verdict:
        better = None
        if kind == "significant" and change is not None and direction is not None:
            better = (change > 0) == direction
        return Verdict(metric, level, kind, ea, eb, change, ci, p, df, better, zero_var)

    if ea.mean is None or eb.mean is None:
        return make("missing")
    if ea.mean == 0:
        return make("zero_baseline")
    change = (eb.mean - ea.mean) / abs(ea.mean) * 100.0
    test = welch_test(a, b, confidence)
    if test is None:
        return make("single_run", change)
    ci = test.half_width / abs(ea.mean) * 100.0
    alpha = 1.0 - confidence
    kind = "significant" if test.p_value < alpha and test.diff != 0 else "no_difference"
    return make(kind, change, ci, test.p_value, test.df, zero_var=test.se == 0)


def compare_levels(
    baseline: Mapping[float, Sequence[Level]],
    candidate: Mapping[float, Sequence[Level]],
    metric: str = "output_tok_s",
    confidence: float = CONFIDENCE,
) -> list[Verdict]:
    """One verdict per level measured by either side (``group_by_level`` output), in level order.

    A level only one side measured gets a ``missing`` verdict rather than disappearing from the table.
    """
    verdicts = []
    for level in sorted(set(baseline) | set(candidate)):
        a = [metric_value(r, metric) for r in baseline.get(level, ())]
        b = [metric_value(r, metric) for r in candidate.get(level, ())]
        verdicts.append(verdict(a, b, metric=metric, level=level, confidence=confidence))
    return verdicts


# --- text --------------------------------------------------------------------------------------------------


def _decimals(x: float) -> int:
    """Decimals that show three significant figures (none at 100 and above)."""
    if x == 0 or not math.isfinite(x):
        return 0
    return max(0, 2 - math.floor(math.log10(abs(x))))


def format_number(x: float, decimals: int | None = None) -> str:
    """Three significant figures or whole numbers, the precision a benchmark table can stand behind."""
    return f"{x:.{_decimals(x) if decimals is None else decimals}f}"


def _signed_pct(x: float) -> str:
    return f"{x:+.0f} %" if abs(x) >= 10 else f"{x:+.1f} %"


def _pct(x: float) -> str:
    return f"{x:.0f} %" if abs(x) >= 10 else f"{x:.1f} %"


def render_estimate(e: Estimate, unit: str = "") -> str:
    """``1234 ± 12 tok/s (n=3)``; ``1234 tok/s (1 run, no interval)``; ``-`` when nothing was measured."""
    suffix = f" {unit}" if unit else ""
    if e.mean is None:
        return "-"
    if e.half_width is None:
        return f"{format_number(e.mean)}{suffix} (1 run, no interval)"
    places = _decimals(e.mean)
    return f"{format_number(e.mean)} ± {format_number(e.half_width, places)}{suffix} (n={e.n})"


def runs_note(v: Verdict) -> str:
    """``1 run each: no confidence interval; use repeat=3 or more``: why a single-run verdict claims nothing."""
    nb, nc = v.baseline.n, v.candidate.n
    runs = "1 run each" if nb == nc == 1 else f"{nb} run{'s' * (nb != 1)} vs {nc}"
    return f"{runs}: no confidence interval; use repeat=3 or more"


def render_verdict(v: Verdict, *, runs_said: bool = False) -> str:
    """The phrase a table cell shows: ``+95 % ± 3.0 % (significant)``, ``no difference within noise``...

    ``runs_said``: the line says :func:`runs_note` once for all its cells, so a single-run cell is the change alone.
    """
    if v.kind == "missing":
        if v.baseline.mean is None and v.candidate.mean is None:
            return "not measured"
        return "not measured in the " + ("baseline" if v.baseline.mean is None else "candidate")
    if v.kind == "zero_baseline":
        return "baseline is 0: no relative change"
    assert v.change_pct is not None
    if v.kind == "single_run":
        change = _signed_pct(v.change_pct)
        return change if runs_said else f"{change} ({runs_note(v)})"
    assert v.ci_pct is not None
    if v.kind == "significant":
        note = "; every run gave the same value" if v.zero_variance else ""
        return f"{_signed_pct(v.change_pct)} ± {_pct(v.ci_pct)} (significant{note})"
    if v.zero_variance:
        return "no difference (every run gave the same value)"
    return f"no difference within noise ({_signed_pct(v.change_pct)} ± {_pct(v.ci_pct)})"
