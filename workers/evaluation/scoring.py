"""Scoring: was each reply right (and if not, why), how accurate a run is, and whether it is worse than
the baseline beyond noise.

* Extraction: a reasoning model's ``<think>...</think>`` is dropped first; ``number`` items compare the
  last number of the reply (thousands commas and trailing punctuation allowed, ``12.0`` equals ``12``);
  ``exact`` items compare after whitespace normalisation (one layer of wrapping quotes, backticks or a
  code fence is forgiven); ``regex`` items take the pattern's last match (its group, if it has one).
* Accuracy comes with a 95 % Wilson score interval: honest at small n and near 0 or 100 %, where the
  textbook ``p ± 1.96·sqrt(p(1-p)/n)`` interval collapses to zero width.
* The baseline comparison pairs the items both runs asked (same question, same answer) and runs
  McNemar's exact test on the discordant pairs: questions asked of the same model differ only where the
  backends do, so the pairs carry the signal and the shared easy/hard questions cancel out. Without
  enough shared items it falls back to Fisher's exact test on the two proportions. One-sided: the gate
  asks "did it get worse?". docs/eval.md explains the choice and the numbers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from decimal import Decimal, InvalidOperation

from workers.engines.readiness import is_garbage
from workers.evaluation.tasks import Item
from workers.json_value import JsonObject, RawJson

Z_95 = 1.959963984540054  # the 97.5th percentile of the standard normal: a two-sided 95 % interval
#: Flag a drop when its one-sided p-value is at most this (docs/eval.md: why 0.01, and why n=300).
DEFAULT_ALPHA = 0.01
#: ... and it is at least this large: a significant 0.3-point drop on 5000 items is not a red flag.
DEFAULT_MIN_DROP = 0.01
#: Pair the runs item by item when at least this share of the candidate's questions was also asked of
#: the baseline; else compare the two proportions unpaired.
PAIRED_MIN_SHARE = 0.5
REPLY_CLIP = 300

_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)
_NUMBER_RE = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_WRAPPERS = (("```", "```"), ('"', '"'), ("'", "'"), ("`", "`"), ("“", "”"))


# ------------------------------------------------------------------------------------------ extraction


def strip_reasoning(text: str) -> str:
    """The reply without ``<think>...</think>`` blocks; an unclosed ``<think>`` (cut off) drops the rest."""
    text = _THINK_RE.sub("", text)
    head, sep, _ = text.partition("<think>")
    return head if sep else text


def normalise_whitespace(text: str) -> str:
    """Runs of whitespace become one space; leading and trailing whitespace goes."""
    return " ".join(text.split())


def extract_last_number(text: str) -> str | None:
    """The last number written in ``text``, without thousands commas (``"= 1,234."`` -> ``"1234"``)."""
    found = _NUMBER_RE.findall(text)
    return found[-1].replace(",", "") if found else None


def numbers_equal(a: str, b: str) -> bool:
    """Numeric equality of two number strings (``"12.0" == "12"``, commas ignored); False if either is not one."""
    try:
        return Decimal(a.replace(",", "")) == Decimal(b.replace(",", ""))
    except InvalidOperation:
        return False


def extract_regex(text: str, pattern: str) -> str | None:
    """The last match of ``pattern`` in ``text``: its first group when it has one, else the whole match."""
    matches = list(re.finditer(pattern, text))
    if not matches:
        return None
    m = matches[-1]
    return m.group(1) if m.re.groups else m.group(0)


def _unwrap(text: str) -> str:
    """``text`` without one layer of wrapping quotes, backticks or a code fence (with its language tag)."""
    for left, right in _WRAPPERS:
        if len(text) > len(left) + len(right) and text.startswith(left) and text.endswith(right):
            inner = text[len(left) : -len(right)]
            if left == "```" and "\n" in inner:
                first, rest = inner.split("\n", 1)
                inner = rest if first.strip().isalnum() or not first.strip() else inner
            return inner.strip()
    return text


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------------------ per item


@dataclass(frozen=True)
class ItemResult:
    """How one question went: right or wrong, what was found in the reply, and why it was judged so."""

    id: str
    key: str
    kind: str
    correct: bool
    expected: str
    extracted: str | None
    reason: str
    finish_reason: str | None = None
    reply: str = ""  # clipped to REPLY_CLIP characters

    def to_dict(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: RawJson) -> ItemResult:
        return cls(
            id=str(data["id"]),
            key=str(data["key"]),
            kind=str(data.get("kind") or ""),
            correct=bool(data["correct"]),
            expected=str(data["expected"]),
            extracted=None if data.get("extracted") is None else str(data["extracted"]),
            reason=str(data.get("reason") or ""),
            finish_reason=data.get("finish_reason"),
            reply=str(data.get("reply") or ""),
        )


def _judge(item: Item, answer: str) -> tuple[bool, str | None, str]:
    """``(correct, extracted, reason)`` for a reply with reasoning already removed."""
    if item.method == "number":
        got = extract_last_number(answer)
        if got is None:
            return False, None, "no number in the reply"
        if numbers_equal(got, item.expected):
            return True, got, "matched"
        return False, got, f"expected {item.expected}, got {got}"
    if item.method == "regex":
        got = extract_regex(answer, item.pattern or "")
        if got is None:
            return False, None, "the item's regex found nothing in the reply"
        got = got.strip()
        same = numbers_equal(got, item.expected) or normalise_whitespace(got) == normalise_whitespace(item.expected)
        return (True, got, "matched") if same else (False, got, f"expected {item.expected!r}, got {_clip(got)!r}")
    want = normalise_whitespace(item.expected)
    got = normalise_whitespace(answer)
    if got == want:
        return True, got, "matched"
    if normalise_whitespace(_unwrap(answer.strip())) == want:
        return True, got, "matched inside quotes"
    return False, got, f"expected {_clip(want)!r}, got {_clip(got)!r}"


def score_item(item: Item, reply: str | None, finish_reason: str | None = None, error: str | None = None) -> ItemResult:
    """Judge one reply. ``error`` (the request failed) and garbage replies are wrong, with that as reason."""

    def result(correct: bool, extracted: str | None, reason: str) -> ItemResult:
        return ItemResult(
            id=item.id,
            key=item.key,
            kind=item.kind,
            correct=correct,
            expected=item.expected,
            extracted=extracted,
            reason=reason,
            finish_reason=finish_reason,
            reply=(reply or "")[:REPLY_CLIP],
        )

    if error is not None or reply is None:
        return result(False, None, f"no reply: {error or 'the server sent no text'}")
    answer = strip_reasoning(reply)
    if not answer.strip() and "<think>" in reply:
        return result(False, None, "the reply ended inside <think>: raise max_tokens or turn thinking off")
    correct, extracted, reason = _judge(item, answer)
    if not correct:
        garbage = is_garbage(answer)
        if garbage:
            reason = f"garbage: {garbage}"
        if finish_reason == "length":
            reason += " (cut off at max_tokens)"
    return result(correct, extracted, reason)


# ------------------------------------------------------------------------------------------ accuracy


def wilson_interval(correct: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval for ``correct`` successes out of ``n`` (``(0, 1)`` when n is 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def pct(value: float) -> str:
    """``0.96`` -> ``"96.0 %"`` (the house style: one decimal, a space before the sign)."""
    return f"{100 * value:.1f} %"


@dataclass(frozen=True)
class Accuracy:
    """``correct`` out of ``n``, with its 95 % Wilson interval."""

    correct: int
    n: int

    @property
    def value(self) -> float:
        return self.correct / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.correct, self.n)

    def __str__(self) -> str:
        lo, hi = self.interval
        return f"{pct(self.value)} ({self.correct}/{self.n}, 95 % CI {100 * lo:.1f}-{100 * hi:.1f} %)"

    def to_dict(self) -> JsonObject:
        lo, hi = self.interval
        return {"correct": self.correct, "n": self.n, "accuracy": self.value, "ci95": [lo, hi]}


def accuracy(results: Iterable[ItemResult]) -> Accuracy:
    """How many of ``results`` were right."""
    items = list(results)
    return Accuracy(sum(1 for r in items if r.correct), len(items))


# ------------------------------------------------------------------------------------------ tests


def mcnemar_exact_p(worse: int, better: int) -> float:
    """One-sided exact McNemar p-value that the candidate is worse: P(X >= worse), X ~ Bin(worse+better, 1/2).

    ``worse``: questions the baseline got right and the candidate wrong; ``better``: the other way round.
    Under "no difference" each discordant question is a fair coin. 1.0 when there are none.
    """
    m = worse + better
    if m == 0:
        return 1.0
    return sum(math.comb(m, k) for k in range(worse, m + 1)) / 2**m


def fisher_exact_p(correct_a: int, n_a: int, correct_b: int, n_b: int) -> float:
    """One-sided Fisher exact p-value that run A is less accurate than run B (unpaired).

    With the margins fixed, A's count of right answers is hypergeometric; p = P(X <= correct_a). Terms in
    log space (``lgamma``): exact big-integer binomials took seconds at n = 5000.
    """
    total, right = n_a + n_b, correct_a + correct_b
    lo, hi = max(0, n_a - (total - right)), min(n_a, right)
    log_denom = _log_comb(total, n_a)
    tail = sum(
        math.exp(_log_comb(right, x) + _log_comb(total - right, n_a - x) - log_denom)
        for x in range(lo, min(correct_a, hi) + 1)
    )
    return min(1.0, tail)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _paired_min_worse(alpha: float) -> int:
    """The fewest one-way discordant questions McNemar can flag at ``alpha`` (7 at 0.01, 5 at 0.05)."""
    return max(1, math.ceil(math.log2(1 / alpha)))


def _unpaired_detectable(correct_b: int, n_b: int, n_a: int, alpha: float) -> float | None:
    """The smallest drop (as a fraction) Fisher's test flags for a run of ``n_a`` against this baseline."""
    base = correct_b / n_b
    if fisher_exact_p(0, n_a, correct_b, n_b) > alpha:
        return None
    lo, hi = 0, min(n_a, math.floor(base * n_a))  # find the largest flagged count: p is increasing in it
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fisher_exact_p(mid, n_a, correct_b, n_b) <= alpha:
            lo = mid
        else:
            hi = mid - 1
    return base - lo / n_a


VERDICTS = ("within_noise", "drop", "improved", "too_few")


@dataclass(frozen=True)
class Comparison:
    """A run against its baseline: the verdict, the numbers behind it, and the words for a person.

    When paired, both accuracies are over the shared questions only (like for like).
    """

    verdict: str  # one of VERDICTS
    candidate: Accuracy
    baseline: Accuracy
    test: str  # mcnemar_exact | fisher_exact
    p_drop: float
    p_rise: float
    shared: int
    worse: int  # paired: right on the baseline, wrong here
    better: int  # paired: wrong on the baseline, right here
    alpha: float
    min_drop: float
    detectable_drop: float | None  # the smallest drop this n can flag (None: none can)

    @property
    def flagged(self) -> bool:
        """The red flag: worse than the baseline beyond noise."""
        return self.verdict == "drop"

    @property
    def difference(self) -> float:
        """Candidate minus baseline accuracy (a fraction; negative is a drop)."""
        return self.candidate.value - self.baseline.value

    def summary(self) -> str:
        """One line: ``accuracy 96.0 % (baseline 96.5 %, difference within noise)`` or the red flag."""
        here, base = pct(self.candidate.value), pct(self.baseline.value)
        points = abs(100 * self.difference)
        if self.verdict == "drop":
            return (
                f"ACCURACY DROP: {here} (baseline {base}, {points:.1f} points lower, beyond noise: "
                f"p = {self.p_drop:.2g})"
            )
        if self.verdict == "improved":
            return f"accuracy {here} (baseline {base}, {points:.1f} points better, beyond noise)"
        if self.verdict == "too_few":
            return (
                f"accuracy {here} (baseline {base}; {self.candidate.n} questions are too few to tell a drop from noise)"
            )
        text = f"accuracy {here} (baseline {base}, difference within noise)"
        if self.detectable_drop is not None and self.detectable_drop > 0.05:
            text += f"; at this n only a drop of {100 * self.detectable_drop:.0f}+ points would show"
        return text

    def detail(self) -> str:
        """How the verdict was reached, for a thread reply or a --verbose line."""
        if self.test == "mcnemar_exact":
            how = (
                f"McNemar exact test on the {self.shared} questions both runs asked: {self.worse} right only "
                f"on the baseline, {self.better} right only here"
            )
        else:
            how = (
                f"Fisher exact test on two unpaired samples ({self.candidate.n} vs {self.baseline.n} "
                f"questions, {self.shared} shared)"
            )
        return (
            f"{how}; one-sided p = {self.p_drop:.2g} for a drop (flagged at p <= {self.alpha:g} and a drop of "
            f">= {100 * self.min_drop:g} point(s)); here {self.candidate}, baseline {self.baseline}"
        )

    def to_dict(self) -> JsonObject:
        out = asdict(self)
        out["candidate"], out["baseline"] = self.candidate.to_dict(), self.baseline.to_dict()
        out["flagged"], out["summary"] = self.flagged, self.summary()
        return out


def compare(
    candidate: Sequence[ItemResult],
    baseline: Sequence[ItemResult],
    *,
    alpha: float = DEFAULT_ALPHA,
    min_drop: float = DEFAULT_MIN_DROP,
) -> Comparison:
    """Is ``candidate`` less accurate than ``baseline`` beyond noise? (same task; see the module doc)."""
    if not candidate or not baseline:
        raise ValueError("compare() needs at least one scored item on each side")
    base_by_key = {r.key: r.correct for r in baseline}
    pairs = [(r.correct, base_by_key[r.key]) for r in candidate if r.key in base_by_key]
    shared = len(pairs)
    if shared and shared >= PAIRED_MIN_SHARE * len(candidate):
        worse = sum(1 for here, base in pairs if base and not here)
        better = sum(1 for here, base in pairs if here and not base)
        cand = Accuracy(sum(1 for here, _ in pairs if here), shared)
        base = Accuracy(sum(1 for _, b in pairs if b), shared)
        p_drop, p_rise = mcnemar_exact_p(worse, better), mcnemar_exact_p(better, worse)
        need = _paired_min_worse(alpha)
        detectable = max(need / shared, min_drop) if shared >= need else None
        test = "mcnemar_exact"
    else:
        cand, base = accuracy(candidate), accuracy(baseline)
        worse = better = 0
        p_drop = fisher_exact_p(cand.correct, cand.n, base.correct, base.n)
        p_rise = fisher_exact_p(base.correct, base.n, cand.correct, cand.n)
        found = _unpaired_detectable(base.correct, base.n, cand.n, alpha)
        detectable = None if found is None else max(found, min_drop)
        test = "fisher_exact"
    drop = base.value - cand.value
    if p_drop <= alpha and drop >= min_drop:
        verdict = "drop"
    elif p_rise <= alpha and -drop >= min_drop:
        verdict = "improved"
    elif detectable is None:
        verdict = "too_few"
    else:
        verdict = "within_noise"
    return Comparison(
        verdict=verdict,
        candidate=cand,
        baseline=base,
        test=test,
        p_drop=p_drop,
        p_rise=p_rise,
        shared=shared,
        worse=worse,
        better=better,
        alpha=alpha,
        min_drop=min_drop,
        detectable_drop=detectable,
    )
