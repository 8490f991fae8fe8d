"""Open-loop arrivals: when each request is due, a pacer that sends on time, and how late it really was.

A closed loop (``workers.benchmark.client``) answers "what does the server do with C users who never think"; an
open loop answers "what happens when requests arrive at 8 per second whether or not the server keeps
up", which is how real traffic behaves. The traps other clients fell into
(docs/metrics.md, "Open-loop arrivals") decide the design:

- The schedule is computed **before** the run (as vLLM does, unlike SGLang's sleep-between-yields), from
  a seed, so two configurations see exactly the same arrival times and a run can be repeated.
- Sleeping on an event loop is late by ~1 ms and by whatever else the loop is doing. A client that
  falls behind sends the overdue requests back to back: the server then sees bursts the schedule never
  had, while the report still says "Poisson at 8/s". So every send is stamped, the **schedule lag**
  (actual send - scheduled send) is summarised per level, and the level is marked ``behind`` when the
  lag's p99 passes a limit (vllm#54101: a semaphore in front of the timer hid 1.4 s of queueing).
- Latency "from the scheduled send" is reported beside latency "from the actual send", so
  coordinated omission (a late send hiding queueing) shows instead of vanishing.

Nothing here does I/O except :func:`pace`, which only sleeps and calls back.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypedDict, cast

from workers.benchmark.metrics import RequestRecord, percentile, summarize
from workers.errors import BenchbotError

PATTERNS = ("poisson", "constant")
#: A level is ``behind`` when its schedule lag p99 passes this. The client's own event-loop lag limit
#: is 5 ms (workers.benchmark.metrics.LAG_LIMIT_MS); a send also waits for its task to start, so allow twice that.
DEFAULT_LAG_LIMIT_MS = 10.0
#: No schedule longer than this: the offsets are held in memory and every request gets a record.
MAX_SCHEDULED_REQUESTS = 1_000_000
MAX_RATE = 100_000.0
_RATE_RE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<unit>/s|rps|qps)?")


# --- the schedule ------------------------------------------------------------------------------------


class ScheduleInfo(TypedDict):
    """An open-loop level's schedule as stored (``ArrivalSchedule.to_dict``)."""

    rate: float
    pattern: str
    seed: int | None
    requests: int
    span_s: float
    mean_rate: float


class LagInfo(TypedDict):
    """How late an open-loop level's sends were against its schedule (``ScheduleLag.to_dict``)."""

    requests: int
    requested: int
    mean_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    over_limit: int
    limit_ms: float
    scheduled_rate: float | None
    achieved_rate: float | None
    behind: bool
    reason: str | None


class Arrivals(ScheduleInfo):
    """What an open-loop level reports about its arrivals (``LevelMetrics.arrivals``): the schedule, how
    late the sends were, and TTFT / E2E measured from the scheduled sends (coordinated omission)."""

    lag: LagInfo
    from_schedule: dict[str, dict[str, float | None]]


@dataclass(frozen=True)
class ArrivalSchedule:
    """Send offsets in seconds from the start of the measured phase, non-decreasing, the first at 0.

    ``rate`` is what was asked for; :attr:`mean_rate` is what this particular draw delivers (a Poisson
    draw of 100 requests at 8/s spans about 12.4 s, give or take 1.2 s).
    """

    rate: float
    pattern: str
    seed: int | None
    offsets_s: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.offsets_s)

    @property
    def span_s(self) -> float:
        """First to last scheduled send."""
        return self.offsets_s[-1] if self.offsets_s else 0.0

    @property
    def mean_rate(self) -> float:
        """Requests per second of this draw: (n - 1) gaps over the span; the asked rate for n < 2."""
        n = len(self.offsets_s)
        return (n - 1) / self.span_s if n > 1 and self.span_s > 0 else self.rate

    def gaps_s(self) -> list[float]:
        """Inter-arrival times."""
        t = self.offsets_s
        return [t[i] - t[i - 1] for i in range(1, len(t))]

    def interarrival_cv(self) -> float | None:
        """Coefficient of variation of the gaps: ~1 for Poisson, 0 for constant; None under 2 gaps."""
        gaps = self.gaps_s()
        if len(gaps) < 2:
            return None
        mean = math.fsum(gaps) / len(gaps)
        if mean == 0:
            return None
        var = math.fsum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1)
        return math.sqrt(var) / mean

    def offsets_ns(self) -> tuple[int, ...]:
        """Offsets in integer nanoseconds, for a ``perf_counter_ns`` hot path."""
        return tuple(round(t * 1e9) for t in self.offsets_s)

    def to_dict(self) -> ScheduleInfo:
        """What a result stores about the schedule (the offsets can be rebuilt from rate, pattern and seed)."""
        return {
            "rate": self.rate,
            "pattern": self.pattern,
            "seed": self.seed,
            "requests": len(self),
            "span_s": self.span_s,
            "mean_rate": self.mean_rate,
        }


def make_schedule(
    rate: float,
    *,
    pattern: str = "poisson",
    num_requests: int | None = None,
    duration_s: float | None = None,
    seed: int | None = 0,
) -> ArrivalSchedule:
    """Arrival offsets for ``num_requests`` requests, or for every arrival in ``[0, duration_s)``.

    ``poisson``: exponential gaps with mean ``1/rate`` from ``random.Random(seed)`` (a Poisson process;
    the first request goes at 0 so no level starts with idle time). ``constant``: one every ``1/rate`` s.
    The draw is not rescaled to make the last arrival land on ``n/rate`` (vLLM does): the spread between
    seeds is real run-to-run variation, which ``repeat=N`` should see. ``seed=None`` draws a fresh seed.
    """
    if pattern not in PATTERNS:
        raise BenchbotError(f'unknown arrival pattern "{pattern}": use one of {", ".join(PATTERNS)}')
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
        raise BenchbotError(f"the request rate must be a positive number of requests per second, not {rate!r}")
    if rate > MAX_RATE:
        raise BenchbotError(f"a rate of {rate:g} requests/s is above the most one client can pace ({MAX_RATE:g}/s)")
    if (num_requests is None) == (duration_s is None):
        raise BenchbotError("give either a number of requests or a duration for an open-loop level, not both")
    if num_requests is not None:
        if num_requests < 1:
            raise BenchbotError("an open-loop level needs at least 1 request")
    elif not math.isfinite(duration_s or 0.0) or (duration_s or 0.0) <= 0:
        raise BenchbotError("an open-loop level needs a duration of more than zero seconds")
    expected = num_requests if num_requests is not None else rate * (duration_s or 0.0)
    if expected > MAX_SCHEDULED_REQUESTS:
        raise BenchbotError(
            f"that schedule has about {expected:.0f} requests; at most {MAX_SCHEDULED_REQUESTS} "
            "per level (lower the rate or the duration)"
        )
    used_seed = seed if seed is not None else random.randrange(2**31)
    if pattern == "constant":
        n = num_requests if num_requests is not None else math.ceil(rate * (duration_s or 0.0) - 1e-9)
        offsets = [i / rate for i in range(n)]
    else:
        rng = random.Random(f"arrivals:{used_seed}")
        offsets = [0.0]
        t = 0.0
        while num_requests is None or len(offsets) < num_requests:
            t += rng.expovariate(rate)
            if duration_s is not None and t >= duration_s:
                break
            offsets.append(t)
    return ArrivalSchedule(rate=float(rate), pattern=pattern, seed=used_seed, offsets_s=tuple(offsets))


def parse_rate(text: str, *, what: str = "rate=") -> float:
    """``"8"``, ``"0.5"``, ``"8/s"`` -> requests per second; friendly errors for anything else."""
    match = _RATE_RE.fullmatch(text.strip())
    if not match:
        raise BenchbotError(f"{what}{text} is not a request rate: write requests per second, e.g. {what}8 or {what}0.5")
    rate = float(match["number"])
    if rate <= 0:
        raise BenchbotError(f"{what}{text}: the rate must be more than zero requests per second")
    if rate > MAX_RATE:
        raise BenchbotError(f"{what}{text}: at most {MAX_RATE:g} requests per second")
    return rate


def parse_pattern(text: str, *, what: str = "arrivals=") -> str:
    """``poisson`` or ``constant`` (``const``, ``uniform`` and ``fixed`` are read as constant)."""
    word = text.strip().lower()
    aliases = {
        "poisson": "poisson",
        "exp": "poisson",
        "constant": "constant",
        "const": "constant",
        "uniform": "constant",
        "fixed": "constant",
    }
    if word not in aliases:
        raise BenchbotError(f'{what}{text}: arrivals are "poisson" (random, the default) or "constant" (evenly spaced)')
    return aliases[word]


# --- pacing ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PacedRun:
    """What the pacer did: per fired request its index, scheduled and actual fire time (perf_counter_ns)."""

    origin_ns: int
    indices: tuple[int, ...]
    scheduled_ns: tuple[int, ...]
    fired_ns: tuple[int, ...]
    requested: int
    stopped: str | None = None

    @property
    def complete(self) -> bool:
        return self.stopped is None and len(self.indices) == self.requested


async def pace(
    schedule: ArrivalSchedule,
    fire: Callable[[int], Awaitable[Any] | Any],
    *,
    origin_ns: int | None = None,
    give_up_lag_s: float | None = None,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> PacedRun:
    """Call ``fire(i)`` at each request's due time; return when every request has been fired.

    ``fire`` should start the request (``loop.create_task(send(i))``) and return. If it returns an
    awaitable it is awaited before the next request is considered, so a sender that blocks (a
    concurrency cap, a full connection pool) turns into schedule lag rather than into a hidden queue.
    When the pacer is late it fires at once, one request per loop turn (a ``sleep(0)`` between them, so
    each started request reaches its send before the next is fired): the burst is real and the lag of
    each request says so. With ``give_up_lag_s`` the pacer stops sending once it is that far behind,
    and ``stopped`` says why: a level that late measures the client, not the server.
    """
    offsets = schedule.offsets_ns()
    origin = clock() if origin_ns is None else origin_ns
    give_up_ns = None if give_up_lag_s is None else int(give_up_lag_s * 1e9)
    indices: list[int] = []
    scheduled: list[int] = []
    fired: list[int] = []
    stopped = None
    for i, offset in enumerate(offsets):
        due = origin + offset
        now = clock()
        if now >= due:
            await asyncio.sleep(0)
            now = clock()
        while now < due:  # uvloop's timers are in whole ms and may wake a little early: never send early
            await asyncio.sleep((due - now) / 1e9)
            now = clock()
        if give_up_ns is not None and now - due > give_up_ns:
            stopped = (
                f"the client fell {(now - due) / 1e9:.1f} s behind the schedule at request {i + 1} of "
                f"{len(offsets)} and stopped sending"
            )
            break
        indices.append(i)
        scheduled.append(due)
        fired.append(now)
        result = fire(i)
        if inspect.isawaitable(result):
            await result
    return PacedRun(
        origin_ns=origin,
        indices=tuple(indices),
        scheduled_ns=tuple(scheduled),
        fired_ns=tuple(fired),
        requested=len(offsets),
        stopped=stopped,
    )


# --- lag ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleLag:
    """How late the requests went out against their schedule, and whether that spoils the level."""

    requests: int
    requested: int
    mean_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    over_limit: int
    limit_ms: float
    scheduled_rate: float | None
    achieved_rate: float | None
    behind: bool
    reason: str | None

    def to_dict(self) -> LagInfo:
        return cast(LagInfo, asdict(self))  # its fields are LagInfo's keys


def _rate(times_ns: Sequence[int]) -> float | None:
    if len(times_ns) < 2:
        return None
    span = (max(times_ns) - min(times_ns)) / 1e9
    return (len(times_ns) - 1) / span if span > 0 else None


def schedule_lag(
    scheduled_ns: Sequence[int],
    actual_ns: Sequence[int],
    *,
    limit_ms: float = DEFAULT_LAG_LIMIT_MS,
    requested: int | None = None,
    stopped: str | None = None,
) -> ScheduleLag:
    """Summarise ``actual - scheduled`` per request (ms) and decide whether the level kept its schedule.

    ``actual_ns`` should be each request's send stamp (``RequestRecord.t_send_ns``), not the pacer's
    fire time, so the task start and anything else before the POST counts. ``requested`` is the
    schedule's length: fewer sends than that (the pacer gave up: ``stopped``) also marks the level.
    A level is ``behind`` when the lag p99 passes ``limit_ms`` or not every request was sent.
    """
    if len(scheduled_ns) != len(actual_ns):
        raise ValueError("scheduled and actual send times must pair up")
    lags = sorted((a - s) / 1e6 for s, a in zip(scheduled_ns, actual_ns, strict=True))
    requested = len(lags) if requested is None else requested
    stats = summarize(lags)
    over = sum(1 for x in lags if x > limit_ms)
    reasons = []
    if lags and percentile(lags, 99) > limit_ms:
        reasons.append(
            f"requests went out late: schedule lag p99 {percentile(lags, 99):.1f} ms "
            f"(limit {limit_ms:g} ms), so the server saw bursts the schedule did not have"
        )
    if len(lags) < requested:
        reasons.append(stopped or f"only {len(lags)} of {requested} scheduled requests were sent")
    return ScheduleLag(
        requests=len(lags),
        requested=requested,
        mean_ms=stats["mean"],
        p50_ms=stats["p50"],
        p90_ms=stats["p90"],
        p99_ms=stats["p99"],
        max_ms=stats["max"],
        over_limit=over,
        limit_ms=limit_ms,
        scheduled_rate=_rate(scheduled_ns),
        achieved_rate=_rate(actual_ns),
        behind=bool(reasons),
        reason="; ".join(reasons) or None,
    )


def latencies_from_schedule(
    records: Sequence[RequestRecord], scheduled_ns: Sequence[int]
) -> dict[str, dict[str, float | None]]:
    """TTFT and E2E measured from each request's *scheduled* send (what a user arriving then would see).

    Beside the usual figures (from the actual send) this exposes coordinated omission: when the client
    sent late, the difference between the two is the queueing the usual figure hides (vllm#54101).
    Errored requests are left out, as in ``workers.benchmark.metrics``.
    """
    if len(records) != len(scheduled_ns):
        raise ValueError("one scheduled send time per record")
    ttft, e2e = [], []
    for rec, sched in zip(records, scheduled_ns, strict=True):
        if not rec.ok:
            continue
        e2e.append((rec.t_end_ns - sched) / 1e6)
        if rec.chunk_t_ns:
            ttft.append((rec.chunk_t_ns[0] - sched) / 1e6)
    return {"ttft_ms": summarize(ttft), "e2e_ms": summarize(e2e)}
