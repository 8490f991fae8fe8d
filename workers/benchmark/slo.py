"""Where does it break? The highest load that still meets the p99 SLOs, its goodput, and every point.

``/bench slo ttft=500ms itl=50ms`` asks a capacity question: "how many users (or requests per second)
can this config serve while 99 % of them see TTFT <= 500 ms and ITL <= 50 ms?" Answering it by a full
sweep wastes hours, so the search here measures few loads:

1. **Exponential (galloping) phase** over the allowed loads, in index order ``0, 1, 3, 7, 15, ...``
   (load roughly squared in a geometric grid), until a load fails the SLO or the top load passes;
2. **Binary search** between the highest passing and the lowest failing index, until they are adjacent:
   the passing one is the **knee**;
3. **Confirmation**: the knee is measured once more, and counts only if it passes again (noise can let
   one run of an overloaded level through); if it fails, the search goes on below it. Other loads are
   measured once, and everything stays within a ``budget`` of measurements.

A level **meets** the SLO when each named metric's p99 (over the level's successful requests; ITL
pooled over all tokens, as ``itl_ms`` is) is within its limit and at most ``max_error_pct`` of its
requests failed. **Goodput** is per request (DistServe / vLLM ``--goodput``): completed requests whose
own TTFT, TPOT (for ``itl=`` and ``tpot=``: a request's mean inter-token time, as AIPerf's per-request
ITL) and E2E are within the limits, per second of the level; failed requests never count as good.

The strategy is pure: it asks a ``measure(load)`` callable (a bench level at that concurrency or rate)
and never touches the network itself, so it is tested on synthetic capacity curves.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from workers.benchmark.metrics import RequestRecord, e2e_ms, tpot_ms, ttft_ms
from workers.benchmark.units import format_duration_ms, parse_duration_s
from workers.errors import BenchbotError
from workers.json_value import JsonObject, opt_float, opt_int

#: SLO key -> the ``LevelMetrics`` latency it limits.
SLO_METRICS = {"ttft": "ttft_ms", "itl": "itl_ms", "tpot": "tpot_ms", "e2e": "e2e_ms"}
SLO_LABELS = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "E2E"}
PERCENTILE = "p99"
DEFAULT_MAX_ERROR_PCT = 1.0
DEFAULT_BUDGET = 10


# --- the SLO -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slo:
    """Latency limits in ms (by SLO key, in the order given) and the failed-request allowance."""

    limits_ms: tuple[tuple[str, float], ...]
    max_error_pct: float = DEFAULT_MAX_ERROR_PCT
    percentile: str = PERCENTILE

    def describe(self) -> str:
        """``p99 TTFT <= 500 ms, p99 ITL <= 50 ms``."""
        return ", ".join(f"{self.percentile} {SLO_LABELS[k]} <= {format_duration_ms(v)}" for k, v in self.limits_ms)

    def to_dict(self) -> JsonObject:
        return {"limits_ms": dict(self.limits_ms), "percentile": self.percentile, "max_error_pct": self.max_error_pct}


def parse_slo(words: str | Sequence[str]) -> Slo:
    """``"ttft=500ms itl=50ms"`` (or its words) -> :class:`Slo`. A bare number is milliseconds.

    Keys: ``ttft``, ``itl``, ``tpot``, ``e2e``, and ``errors=`` (the % of requests allowed to fail,
    default 1). At least one latency limit; each key once.
    """
    tokens = words.split() if isinstance(words, str) else list(words)
    keys = ", ".join(f"{k}=" for k in SLO_METRICS)
    if not tokens:
        raise BenchbotError(f"an SLO names at least one limit, e.g. ttft=500ms itl=50ms (limits: {keys})")
    limits: dict[str, float] = {}
    max_errors = DEFAULT_MAX_ERROR_PCT
    seen_errors = False
    for word in tokens:
        key, eq, value = word.partition("=")
        key = key.strip().lower()
        if not eq or not value.strip():
            raise BenchbotError(f'"{word}" is not an SLO limit: write it like ttft=500ms (limits: {keys})')
        if key == "errors":
            if seen_errors:
                raise BenchbotError('"errors=" is given twice')
            seen_errors = True
            max_errors = _parse_pct(value)
            continue
        if key not in SLO_METRICS:
            raise BenchbotError(f'unknown SLO "{key}=": the limits are {keys} and errors=')
        if key in limits:
            raise BenchbotError(f'"{key}=" is given twice')
        limits[key] = round(parse_duration_s(value, f"{key}=", default_unit="ms") * 1000.0, 9)
    if not limits:
        raise BenchbotError(f"an SLO needs at least one latency limit, e.g. ttft=500ms (limits: {keys})")
    return Slo(tuple(limits.items()), max_errors)


def _parse_pct(value: str) -> float:
    text = value.strip().rstrip("%").strip()
    if not re.fullmatch(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+", text):  # ASCII only: float() takes "１" and "nan"
        raise BenchbotError(f"errors={value}: write the % of requests allowed to fail, e.g. errors=1%")
    pct = float(text)
    if not math.isfinite(pct) or not 0 <= pct <= 100:
        raise BenchbotError(f"errors={value}: a percentage from 0 to 100")
    return pct


# --- one measured load -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """What the search needs from one bench level: the p99s, the request counts, the good requests."""

    p99_ms: Mapping[str, float | None]
    num_requests: int
    errors: int
    duration_s: float
    good_requests: int | None = None
    request_s: float | None = None

    @property
    def goodput_rps(self) -> float | None:
        if self.good_requests is None:
            return None
        return self.good_requests / self.duration_s if self.duration_s > 0 else 0.0


def good_requests(records: Sequence[RequestRecord], slo: Slo) -> int:
    """Completed requests whose own TTFT, TPOT (for ``itl``/``tpot``) and E2E meet every limit."""
    good = 0
    for rec in records:
        if not rec.ok:
            continue
        ok = True
        for key, limit in slo.limits_ms:
            if key == "ttft":
                value = ttft_ms(rec)
            elif key in ("itl", "tpot"):
                value = tpot_ms(rec)
                if value is None:  # one output token: no inter-token time, nothing to violate
                    continue
            else:
                value = e2e_ms(rec)
            if value is None or value > limit:
                ok = False
                break
        good += ok
    return good


def measurement_from_level(
    level: Mapping[str, object], slo: Slo, records: Sequence[RequestRecord] | None = None
) -> Measurement:
    """Build a :class:`Measurement` from a ``LevelMetrics.to_dict()`` (+ its records, for goodput)."""
    p99 = {}
    for key, _ in slo.limits_ms:
        stats = level.get(SLO_METRICS[key])
        value = stats.get(slo.percentile) if isinstance(stats, Mapping) else None
        p99[key] = float(value) if isinstance(value, int | float) and math.isfinite(value) else None
    return Measurement(
        p99_ms=p99,
        num_requests=opt_int(level.get("num_requests")) or 0,
        errors=opt_int(level.get("errors")) or 0,
        duration_s=opt_float(level.get("duration_s")) or 0.0,
        good_requests=good_requests(records, slo) if records is not None else None,
        request_s=opt_float(level.get("request_s")),
    )


def check(m: Measurement, slo: Slo) -> tuple[bool, tuple[str, ...]]:
    """Does one measurement meet the SLO? ``(meets, the reasons it does not)``."""
    reasons = []
    if m.num_requests == 0:
        return False, ("no requests were measured",)
    error_pct = 100.0 * m.errors / m.num_requests
    if error_pct > slo.max_error_pct:
        reasons.append(f"{error_pct:.1f} % of requests failed (allowed {slo.max_error_pct:g} %)")
    for key, limit in slo.limits_ms:
        value = m.p99_ms.get(key)
        label = f"{slo.percentile} {SLO_LABELS[key]}"
        if value is None:
            reasons.append(f"no {label} (no request completed)")
        elif value > limit:
            reasons.append(f"{label} {value:.0f} ms > {format_duration_ms(limit)}")
    return not reasons, tuple(reasons)


# --- the search ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One measured load, in the order measured."""

    load: float
    measurement: Measurement
    meets: bool
    reasons: tuple[str, ...]

    @property
    def goodput_rps(self) -> float | None:
        return self.measurement.goodput_rps

    def to_dict(self) -> JsonObject:
        m = self.measurement
        return {
            "load": self.load,
            "meets": self.meets,
            "reasons": list(self.reasons),
            "p99_ms": dict(m.p99_ms),
            "num_requests": m.num_requests,
            "errors": m.errors,
            "duration_s": m.duration_s,
            "good_requests": m.good_requests,
            "goodput_rps": m.goodput_rps,
            "request_s": m.request_s,
        }


@dataclass(frozen=True)
class SloResult:
    """The answer: the knee (highest load meeting the SLO, None if even the lowest fails), the first
    failing load above it, every measured point (in order), and how sure the answer is: ``complete``
    (knee and first failing load are adjacent allowed loads, or the knee is the top), ``confirmed`` (the
    knee passed twice), ``unstable`` (a second look at a passing load failed)."""

    slo: Slo
    loads: tuple[float, ...]
    points: tuple[Point, ...]
    knee: float | None
    first_failing: float | None
    complete: bool
    confirmed: bool
    unstable: bool

    @property
    def top_reached(self) -> bool:
        """The highest allowed load met the SLO: the capacity is above what was allowed."""
        return self.knee is not None and self.knee == self.loads[-1]

    @property
    def knee_point(self) -> Point | None:
        return next((p for p in self.points if p.load == self.knee), None)

    @property
    def best_goodput(self) -> Point | None:
        scored = [p for p in self.points if p.goodput_rps is not None]
        return max(scored, key=lambda p: p.goodput_rps or 0.0) if scored else None

    def sorted_points(self) -> list[Point]:
        """Points by load, for a plot (load on x; p99s, goodput and pass/fail on y)."""
        return sorted(self.points, key=lambda p: p.load)

    def summary(self, unit: str = "concurrency") -> str:
        """One line for the reply, e.g. ``knee at concurrency 48 (64 fails: p99 TTFT 812 ms > 500 ms)``."""
        if self.knee is None:
            why = self.points[0].reasons[0] if self.points and self.points[0].reasons else "fails"
            return f"the SLO ({self.slo.describe()}) fails even at {unit} {_fmt(self.loads[0])}: {why}"
        text = f"knee at {unit} {_fmt(self.knee)}"
        kp = self.knee_point
        if kp is not None and kp.goodput_rps is not None:
            text += f", goodput {kp.goodput_rps:.2f} req/s"
        if self.top_reached:
            text += " (the highest load allowed: capacity is above it)"
        elif self.first_failing is not None:
            fail = next(p for p in self.points if p.load == self.first_failing)
            text += f" ({_fmt(self.first_failing)} fails: {'; '.join(fail.reasons)})"
        if not self.complete:
            text += "; measurement budget spent before the knee was pinned to adjacent loads"
        if self.unstable:
            text += "; a load passed once and failed on a second look: results near the knee are noisy"
        return text

    def to_dict(self) -> JsonObject:
        return {
            "slo": self.slo.to_dict(),
            "loads": list(self.loads),
            "knee": self.knee,
            "first_failing": self.first_failing,
            "complete": self.complete,
            "confirmed": self.confirmed,
            "unstable": self.unstable,
            "top_reached": self.top_reached,
            "points": [p.to_dict() for p in self.points],
        }


def _fmt(load: float) -> str:
    return f"{load:g}"


class KneeSearch:
    """The search as a state machine: ``next_load()`` -> measure it -> ``record(load, m)``, until None.

    Sync and async callers drive the same logic (:func:`search`, :func:`search_async`). With
    ``confirm`` the knee, once pinned, is measured a second time: a load counts as meeting the SLO only
    if every measurement of it did. When the second look fails (noise let an overloaded level pass) the
    search resumes below it and the result is marked ``unstable``.
    """

    def __init__(self, loads: Sequence[float], slo: Slo, budget: int = DEFAULT_BUDGET, confirm: bool = True) -> None:
        ordered = sorted(set(loads))
        if not ordered or any(not math.isfinite(x) or x <= 0 for x in ordered):
            raise BenchbotError("an SLO search needs at least one load above zero")
        if budget < 1:
            raise BenchbotError("an SLO search needs a budget of at least one measurement")
        self.loads = tuple(ordered)
        self.slo = slo
        self.budget = budget
        self.confirm = confirm
        self.points: list[Point] = []
        self.unstable = False
        self._results: dict[int, list[bool]] = {}
        self._lo = -1  # highest index known to pass
        self._hi = len(ordered)  # lowest index known to fail (len: none yet)
        self._galloping = True
        self._next_gallop = 0

    def _candidate(self) -> int | None:
        if self._hi - self._lo > 1:
            if self._galloping:
                return min(self._next_gallop, self._hi - 1)
            return (self._lo + self._hi) // 2
        if self.confirm and self._lo >= 0 and len(self._results[self._lo]) < 2:
            return self._lo
        return None

    def next_load(self) -> float | None:
        """The load to measure next, or None when the knee is pinned (and confirmed) or the budget is spent."""
        if len(self.points) >= self.budget:
            return None
        idx = self._candidate()
        return None if idx is None else self.loads[idx]

    def record(self, load: float, m: Measurement) -> Point:
        """Take one measurement of ``load`` (a value from :attr:`loads`) into the search."""
        idx = self.loads.index(load)
        meets, reasons = check(m, self.slo)
        point = Point(load, m, meets, reasons)
        self.points.append(point)
        runs = self._results.setdefault(idx, [])
        runs.append(meets)
        if len(runs) > 1:  # a confirmation
            if not meets and idx <= self._lo:
                self.unstable = True
                self._galloping = False
                self._hi = idx
                self._lo = max((i for i, r in self._results.items() if i < idx and all(r)), default=-1)
            return point
        if meets:
            self._lo = max(self._lo, idx)
            if self._galloping:
                self._next_gallop = 2 * idx + 1
        else:
            self._hi = min(self._hi, idx)
            self._galloping = False
        return point

    def result(self) -> SloResult:
        knee = self.loads[self._lo] if self._lo >= 0 else None
        first_fail = self.loads[self._hi] if self._hi < len(self.loads) else None
        complete = self._hi - self._lo <= 1
        confirmed = knee is not None and len(self._results[self._lo]) > 1
        return SloResult(self.slo, self.loads, tuple(self.points), knee, first_fail, complete, confirmed, self.unstable)


def search(
    measure: Callable[[float], Measurement],
    loads: Sequence[float],
    slo: Slo,
    *,
    budget: int = DEFAULT_BUDGET,
    confirm: bool = True,
) -> SloResult:
    """Find the knee with a synchronous ``measure(load)``."""
    state = KneeSearch(loads, slo, budget, confirm)
    while (load := state.next_load()) is not None:
        state.record(load, measure(load))
    return state.result()


async def search_async(
    measure: Callable[[float], Awaitable[Measurement]],
    loads: Sequence[float],
    slo: Slo,
    *,
    budget: int = DEFAULT_BUDGET,
    confirm: bool = True,
) -> SloResult:
    """Find the knee with an async ``measure(load)`` (a bench level on the running event loop)."""
    state = KneeSearch(loads, slo, budget, confirm)
    while (load := state.next_load()) is not None:
        state.record(load, await measure(load))
    return state.result()


def geometric_loads(low: float, high: float, *, per_doubling: int = 2, integer: bool = True) -> tuple[float, ...]:
    """Allowed loads from ``low`` to ``high``: ``per_doubling`` steps per factor of two.

    ``geometric_loads(1, 64)`` -> 1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64 (whole numbers for
    concurrency); ``integer=False`` for request rates, rounded to 3 significant figures
    (0.5, 0.707, 1, 1.41, ...). The knee is then known to within ~41 %.
    """
    if not (math.isfinite(low) and math.isfinite(high)) or low <= 0 or high < low:
        raise BenchbotError("the load range must go from a positive low to a high at least as large")
    if per_doubling < 1:
        raise BenchbotError("at least one step per doubling")
    out: list[float] = []
    k = 0
    while True:
        x = low * 2 ** (k / per_doubling)
        if x > high * (1 + 1e-9):
            break
        value = float(round(x)) if integer else float(f"{x:.3g}")
        if not out or value > out[-1]:
            out.append(value)
        k += 1
    if out[-1] < high:
        out.append(float(round(high)) if integer else float(high))
    return tuple(out)
