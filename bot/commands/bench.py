"""``/bench``: levels, rates or an SLO search, and their options -> one :class:`BenchSpec`.

``launch ... then bench`` and ``/sweep ... bench`` reuse :func:`_bench_spec`, so a bench option is
spelled once whichever command carries it; the help text sits beside the grammar it describes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from bot.commands.requests import BenchRequest, CommandSpec
from bot.commands.tokens import GROUP_OK, _fail, _host_or_any, _int, _option, _take_levels
from workers.benchmark import schedule
from workers.benchmark.lengths import Fixed, FromDataset, LengthDist, UniformRange, parse_length
from workers.benchmark.limits import DEFAULT_LIMITS, ResponseLimits, parse_bytes
from workers.benchmark.slo import DEFAULT_MAX_ERROR_PCT, SLO_METRICS, parse_slo
from workers.benchmark.spec import (
    APIS,
    DEFAULT_INPUT_LEN,
    DEFAULT_OPEN_LOOP_S,
    DEFAULT_OUTPUT_LEN,
    BenchSpec,
    default_open_loop_requests,
)
from workers.benchmark.units import parse_duration_s
from workers.config import Config, Limits
from workers.engines.profiling import MAX_PROFILE_STEPS
from workers.presets import suggest


def parse_levels(text: str, config: Config) -> tuple[int, ...]:
    """``"1,8,32"`` -> ``(1, 8, 32)``: whole numbers >= 1, no duplicates, at most the configured count."""
    limits = config.limits
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(p == "" for p in parts):
        raise _fail('concurrency levels look like "1,8,32" (numbers separated by commas)')
    levels: list[int] = []
    for part in parts:
        if re.fullmatch(r"-[0-9]+", part):
            raise _fail(f"concurrency levels must be at least 1, not {part}")
        if not re.fullmatch(r"[0-9]{1,9}", part):
            raise _fail(f'"{part}" is not a concurrency level: levels look like "1,8,32"')
        level = int(part)
        if level < 1:
            raise _fail("concurrency levels start at 1 (0 requests in flight measures nothing)")
        if level > limits.max_concurrency:
            raise _fail(f"concurrency {level} is above this team's maximum of {limits.max_concurrency}")
        if level in levels:
            raise _fail(f"concurrency level {level} is given twice")
        levels.append(level)
    if len(levels) > limits.max_levels:
        raise _fail(f"at most {limits.max_levels} concurrency levels per benchmark, got {len(levels)}")
    return tuple(sorted(levels))


BENCH_OPTIONS = {
    "in": "input tokens: 1024, a range 512-2048, or dataset",
    "out": "output tokens: 256, a range, or dataset",
    "n": "requests per level",
    "warmup": "unmeasured requests first",
    "rate": "open loop: requests per second, e.g. rate=2,4,8 (instead of concurrency levels)",
    "arrivals": "open loop: poisson (default) or constant",
    "duration": "open loop: seconds of arrivals per level (default 20s), e.g. duration=1m",
    "prefix": "tokens every request of a level shares (measures the prefix cache)",
    "api": "generate (default), completions or chat",
    "data": "prompts from a dataset named in the config's [datasets]",
    "repeat": "run every level N times: mean, 95 % interval, and verdicts in /compare",
    "max": "the highest concurrency an SLO search may try (/bench slo ...)",
    "timeout": "the longest one request may take (default 15m)",
    "first-byte": "the longest wait for a response's head (default 5m)",
    "idle": "the longest silence inside a response, the first token's wait included (default 5m)",
    "max-bytes": "the most one response may send, e.g. max-bytes=500MB (default grows with out=)",
    "profile": f"an engine profile of N forward steps (1-{MAX_PROFILE_STEPS}) at the highest level: where the trace is",
}
#: An SLO search over concurrency goes up to this unless max= says otherwise (or the team's limit is lower).
DEFAULT_SEARCH_MAX = 256
MAX_REPEAT = 10


def parse_rates(text: str) -> tuple[float, ...]:
    """``"2,4,8"`` -> ``(2.0, 4.0, 8.0)``: positive rates, no duplicates, ascending."""
    rates: list[float] = []
    for part in text.split(","):
        rate = schedule.parse_rate(part, what="rate=")
        if rate in rates:
            raise _fail(f"rate {rate:g} is given twice")
        rates.append(rate)
    return tuple(sorted(rates))


def _bench_spec(
    tokens: list[str], config: Config, *, allow: set[str], stop: frozenset[str] = frozenset()
) -> tuple[BenchSpec, dict[str, object]]:
    """Levels (or ``rate=``) then options; returns the spec and the extra words seen (``on``, ``any``).

    A word in ``stop`` (``then``, a sweep's ``eval``) ends the bench and is left in ``tokens``."""
    if not tokens:
        raise _fail('give the concurrency levels, e.g. "1,8,32" (or request rates: "rate=2,4,8")')
    levels: tuple[int, ...] = ()
    slo_words: list[str] = []
    if tokens[0] == "slo":
        tokens.pop(0)
        while tokens and tokens[0].partition("=")[0].lower() in (*SLO_METRICS, "errors"):
            slo_words.append(tokens.pop(0))
        if not slo_words:
            raise _fail('"slo" names p99 limits, e.g. "/bench slo ttft=500ms itl=50ms"')
    elif "=" not in tokens[0] and tokens[0] not in allow and tokens[0] not in stop:
        levels = parse_levels(_take_levels(tokens), config)
    values: dict[str, str] = {}
    extras: dict[str, object] = {}
    limits = config.limits
    while tokens:
        word = tokens.pop(0)
        if word in stop:
            tokens.insert(0, word)
            break
        if _host_or_any(word, tokens, config, allow, extras):
            continue
        if "=" in word:
            key, value = _option(word, BENCH_OPTIONS, values, "option")
            if key == "max" and not slo_words:
                raise _fail('"max=" is the top of an SLO search: "/bench slo ttft=500ms max=64"')
            if key == "rate":  # "rate=2, 4" with a space after the comma is one list
                tokens.insert(0, value)
                value = _take_levels(tokens)
            values[key] = value
        else:
            words = sorted(a for a in allow if a not in ("host", GROUP_OK))
            allowed = ", ".join(["in=", "out=", "n=", "rate=", "...", *words])
            raise _fail(f'unexpected "{word}" after the levels (expected {allowed}; /help bench lists them all)')
    if slo_words:
        return _search_spec(slo_words, values, config, limits), extras
    return _spec_from(levels, values, config, limits), extras


def _search_spec(slo_words: list[str], values: dict[str, str], config: Config, limits: Limits) -> BenchSpec:
    """``/bench slo ttft=500ms itl=50ms [max=N | rate=LO-HI] [opts]``: the levels are searched for."""
    slo = parse_slo(slo_words)
    rate_range = None
    if "rate" in values:
        low, sep, high = values.pop("rate").partition("-")
        if not sep:
            raise _fail("an SLO search over rates takes a range, e.g. rate=0.5-32 (it picks the rates itself)")
        rate_range = (schedule.parse_rate(low, what="rate="), schedule.parse_rate(high, what="rate="))
        if rate_range[1] <= rate_range[0]:
            raise _fail(f"rate={values.get('rate', low + '-' + high)}: the range goes from low to high")
        if "max" in values:
            raise _fail("give max= (concurrency search) or rate=LO-HI (rate search), not both")
    if "profile" in values:
        raise _fail("profile= captures one level of a /bench with levels or rates, not an SLO search's many")
    top = min(DEFAULT_SEARCH_MAX, limits.max_concurrency)
    search_max = _int(values.pop("max"), "max=", 1, limits.max_concurrency) if "max" in values else top
    base = _spec_from((), values, config, limits, search=True)
    return replace(
        base,
        slo=slo.limits_ms,
        slo_errors_pct=None if slo.max_error_pct == DEFAULT_MAX_ERROR_PCT else slo.max_error_pct,
        search_max=None if rate_range else search_max,
        search_rates=rate_range,
    )


def parse_bench_spec(words: Sequence[str], config: Config) -> BenchSpec:
    """The bench part of the grammar alone (``benchbot bench URL ...``): BenchbotError on bad input."""
    tokens = list(words)
    spec, _ = _bench_spec(tokens, config, allow=set())
    return spec


def _spec_from(
    levels: tuple[int, ...], values: dict[str, str], config: Config, limits: Limits, *, search: bool = False
) -> BenchSpec:
    """Check the options against each other and the team's limits; build the spec."""
    rates = parse_rates(values["rate"]) if "rate" in values else ()
    if levels and rates:
        raise _fail("give concurrency levels or rate=, not both: a level is a closed loop or an open loop")
    if not levels and not rates and not search:
        raise _fail('give the concurrency levels first, e.g. "1,8,32", or request rates: "rate=2,4,8"')
    if len(rates) > limits.max_levels:
        raise _fail(f"at most {limits.max_levels} rates per benchmark, got {len(rates)}")
    for key in ("arrivals", "duration"):
        if key in values and not rates and not search:
            raise _fail(f'"{key}=" is for an open loop: add rate=..., e.g. "rate=4 {key}={values[key]}"')
    dists: dict[str, LengthDist] = {
        k: parse_length(values[k], k, max_tokens=limits.max_tokens) for k in ("in", "out") if k in values
    }
    dataset = values.get("data")
    if dataset is not None:
        config.dataset_path(dataset)  # an unknown name is refused here, before anything is queued
        if isinstance(dists.get("in"), Fixed) or "in" not in dists:
            dists["in"] = FromDataset()  # a dataset's prompts bring their own length
    for key, dist in dists.items():
        if isinstance(dist, FromDataset) and dataset is None:
            raise _fail(f"{key}=dataset needs a dataset: add data=NAME (names from the config's [datasets])")
    n = _int(values["n"], "n=", 1, limits.max_requests) if "n" in values else None
    if n is not None and levels and n < max(levels):
        raise _fail(
            f"n={n} is fewer requests than the highest concurrency ({max(levels)}): "
            "every level needs at least as many requests as it keeps in flight"
        )
    duration = parse_duration_s(values["duration"], "duration=") if "duration" in values else None
    if rates and n is None:
        most = max(default_open_loop_requests(r, duration) for r in rates)
        if most > limits.max_requests:
            raise _fail(
                f"rate={max(rates):g} for {duration or DEFAULT_OPEN_LOOP_S:g} s is {most} requests, above this "
                f"team's maximum of {limits.max_requests} per level: lower the rate or the duration"
            )
    api = values.get("api", "generate")
    if api not in APIS:
        raise _fail(f'unknown api "{api}"{suggest(api, list(APIS))}: use one of {", ".join(APIS)}')
    prefix = _int(values["prefix"], "prefix=", 0, limits.max_tokens) if "prefix" in values else 0
    fixed_in = dists.get("in")
    if prefix and isinstance(fixed_in, Fixed | UniformRange) and prefix >= fixed_in.bounds[0]:
        raise _fail(f"prefix={prefix} must be shorter than the shortest prompt (in={fixed_in.describe()})")
    if prefix and "in" not in values and dataset is None and prefix >= DEFAULT_INPUT_LEN:
        raise _fail(f"prefix={prefix} must be shorter than the prompt (in={DEFAULT_INPUT_LEN})")
    arrivals = values.get("arrivals", "poisson")
    if arrivals not in schedule.PATTERNS:
        raise _fail(f'unknown arrivals "{arrivals}": use one of {", ".join(schedule.PATTERNS)}')

    def fixed_len(key: str, default: int) -> tuple[int, str | None]:
        dist = dists.get(key)
        if dist is None:
            return default, None
        if isinstance(dist, Fixed):
            return dist.tokens, None
        return (round(dist.mean) if isinstance(dist, UniformRange) else default), dist.describe()

    input_len, input_text = fixed_len("in", DEFAULT_INPUT_LEN)
    output_len, output_text = fixed_len("out", DEFAULT_OUTPUT_LEN)
    return BenchSpec(
        levels=levels,
        input_len=input_len,
        output_len=output_len,
        num_requests=n,
        warmup=_int(values["warmup"], "warmup=", 0, 10000) if "warmup" in values else None,
        rates=rates,
        arrivals=arrivals,
        duration_s=duration,
        input=input_text,
        output=output_text,
        prefix_tokens=prefix,
        api=api,
        dataset=dataset,
        repeat=_int(values["repeat"], "repeat=", 1, MAX_REPEAT) if "repeat" in values else 1,
        limits=_response_limits(values),
        profile_steps=_profile_steps(values),
    )


def _profile_steps(values: Mapping[str, str]) -> int | None:
    """``profile=STEPS``: a bounded capture only (a whole bench's trace would fill the host's disk)."""
    if "profile" not in values:
        return None
    text = values["profile"]
    if not re.fullmatch(r"[0-9]{1,9}", text) or int(text) == 0:  # "²".isdigit() is True; int("²") raises
        raise _fail(
            f"profile={text}: give the number of forward steps to capture, e.g. profile=5 "
            f"(at most {MAX_PROFILE_STEPS}; benchbot never starts an unbounded profile)"
        )
    return _int(text, "profile=", 1, MAX_PROFILE_STEPS)


def _response_limits(values: Mapping[str, str]) -> ResponseLimits:
    """``timeout=``, ``first-byte=``, ``idle=``, ``max-bytes=`` over the defaults (workers.benchmark.limits)."""
    if not any(key in values for key in ("timeout", "first-byte", "idle", "max-bytes")):
        return DEFAULT_LIMITS

    def seconds(key: str, default: float) -> float:
        return parse_duration_s(values[key], f"{key}=") if key in values else default

    return ResponseLimits(
        timeout_s=seconds("timeout", DEFAULT_LIMITS.timeout_s),
        first_byte_s=seconds("first-byte", DEFAULT_LIMITS.first_byte_s),
        idle_s=seconds("idle", DEFAULT_LIMITS.idle_s),
        max_bytes=parse_bytes(values["max-bytes"], "max-bytes=") if "max-bytes" in values else None,
    )


def _parse_bench(tokens: list[str], config: Config) -> BenchRequest:
    spec, extras = _bench_spec(tokens, config, allow={"on", "any", GROUP_OK})
    return BenchRequest(
        host=str(extras.get("host", config.default_host)), spec=spec, any_config=bool(extras.get("any", False))
    )


BENCH = CommandSpec(
    "bench",
    "/bench <levels | rate=R,R | slo ttft=MS itl=MS> [in=TOKENS] [out=TOKENS] [n=REQUESTS] "
    "[warmup=N] [api=chat] [prefix=N] [data=NAME] [repeat=N] [profile=STEPS] [on HOST|GROUP] [any]",
    "benchmark the running server at several concurrency levels",
    "Benchmarks whatever runs now, and refuses if it is not the config that was running when you "
    "asked (or your own queued launch) unless you add 'any'. Levels are sorted; defaults "
    f"in={DEFAULT_INPUT_LEN} out={DEFAULT_OUTPUT_LEN}, n scales with the level. rate=R,R runs an open "
    "loop instead: requests arrive at R per second (arrivals=poisson|constant, duration=20s) whatever "
    "is in flight, and the schedule lag is reported. in=/out= take a range (512-2048) or 'dataset'; "
    "api=chat uses /v1/chat/completions; prefix=N shares N tokens across a level's requests; "
    "data=NAME sends prompts from a configured dataset. repeat=N runs each level N times and reports "
    "the mean with its 95 % interval; /compare then says whether a difference is significant. "
    "profile=STEPS captures an engine profile of that many forward steps at the highest level and says "
    "where the trace is on the host and how big (an engine that needs a launch flag for it, or cannot "
    "profile, says so). "
    "'/bench slo ttft=500ms itl=50ms' searches for the highest concurrency (max=N, or rate=LO-HI "
    "for request rates) whose p99s meet the limits, and reports the knee and its goodput. "
    "'on GROUP' benchmarks the gang a /launch ... on GROUP started, through its head, holding every member's "
    "lease: it first checks that every rank the launch started is still alive and runs the head's config "
    "(else it is refused naming the rank and its host), and the run's fingerprint lists every member. A host "
    "that serves as a rank of a running gang is benched only through its group.",
    "bench",
    _parse_bench,
    (
        "/bench 1,8,32",
        "/bench 1,8 in=512 out=128 n=32",
        "/bench rate=2,4,8 arrivals=poisson duration=30s in=512-2048",
        "/bench 8 api=chat data=sharegpt out=dataset",
        "/bench slo ttft=500ms itl=50ms max=128",
        "/bench 1,32 profile=5",
    ),
)
