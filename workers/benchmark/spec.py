"""The typed shape of a benchmark request, from the grammar to the load generator, unchanged.

Made once at the edge (the grammar in ``bot/commands/bench.py``), serialised into the RQ job as JSON
(schema 1, new keys optional so older payloads still read), read back by the bench job, and handed to
the load generator as it is: :class:`workers.benchmark.settings.ClientSettings` wraps it with what only
the worker knows (the loaded dataset, the engine's key), and every module of the client reads its
fields from the spec itself. A ``/bench`` option is one field here plus the code that acts on it.

The spec also answers what its ``None`` fields mean per level (:meth:`BenchSpec.requests_for`,
:meth:`BenchSpec.warmup_for`): the defaults below, shared by the grammar's help and the client.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from workers.benchmark.lengths import Fixed, LengthDist, parse_length
from workers.benchmark.limits import DEFAULT_LIMITS, ResponseLimits, format_bytes
from workers.benchmark.wire_apis import APIS as WIRE_API_NAMES
from workers.json_value import JsonObject, RawJson

DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 256
DEFAULT_API = "generate"
DEFAULT_ARRIVALS = "poisson"
#: The request APIs the client speaks (SGLang's ``/generate``, OpenAI ``completions`` and ``chat``): the
#: names of ``workers.benchmark.wire_apis.WIRE_APIS``, re-exported for the grammar.
APIS = WIRE_API_NAMES
#: An open-loop level without ``n=`` or ``duration=`` sends this many seconds of arrivals (at least 8).
DEFAULT_OPEN_LOOP_S = 20.0


def default_num_requests(level: int) -> int:
    """Four full waves of the closed loop (at least 8 requests): enough for a steady plateau."""
    return max(8, 4 * level)


def default_warmup(level: int) -> int:
    """Enough to open some connections and wake the server, cheap at every level."""
    return min(level, 8)


def default_open_loop_requests(rate: float, duration_s: float | None = None) -> int:
    """Arrivals in ``duration_s`` (default :data:`DEFAULT_OPEN_LOOP_S`) at ``rate``, at least 8."""
    return max(8, math.ceil(rate * (duration_s if duration_s is not None else DEFAULT_OPEN_LOOP_S)))


@dataclass(frozen=True)
class BenchSpec:
    """A benchmark request: its levels (concurrencies, or request rates) and the shape of each request.

    ``input``/``output`` hold a length distribution as typed (``512-2048``, ``dataset``) when it is
    not a fixed length; ``input_len``/``output_len`` are the fixed lengths (or the distribution's mean,
    for old readers). ``dataset`` is a name from the worker's ``[datasets]`` config.
    """

    levels: tuple[int, ...] = ()
    input_len: int = DEFAULT_INPUT_LEN
    output_len: int = DEFAULT_OUTPUT_LEN
    num_requests: int | None = None  # None: scales with the level (requests_for)
    warmup: int | None = None  # None: the load generator's default
    rates: tuple[float, ...] = ()
    arrivals: str = DEFAULT_ARRIVALS
    duration_s: float | None = None
    input: str | None = None
    output: str | None = None
    prefix_tokens: int = 0
    api: str = DEFAULT_API
    dataset: str | None = None
    repeat: int = 1  # run every level this many times (fresh prompts each): mean and 95 % CI per metric
    #: ``/bench slo ...``: p99 limits in ms by key (ttft, itl, tpot, e2e) and the failed-request allowance;
    #: the levels are then searched for (concurrency 1..search_max, or rates in search_rates) not listed.
    slo: tuple[tuple[str, float], ...] = ()
    slo_errors_pct: float | None = None
    search_max: int | None = None
    search_rates: tuple[float, float] | None = None
    #: Bounds on every response (``timeout=``, ``first-byte=``, ``idle=``, ``max-bytes=``): the defaults
    #: unless the person asked for others (issue 25: a hostile server cannot exhaust the client).
    limits: ResponseLimits = DEFAULT_LIMITS
    #: ``profile=STEPS``: a bounded engine profile of this many forward steps at the highest level (issue 22.5).
    profile_steps: int | None = None

    @property
    def is_search(self) -> bool:
        return bool(self.slo)

    # --- what the spec means per level (read by the load generator) ---------------------------------------

    @property
    def open_loop(self) -> bool:
        """Request rates (open loop) rather than concurrency levels (closed loop)."""
        return bool(self.rates)

    def loads(self) -> tuple[float, ...]:
        """The levels in order: concurrencies, or rates for an open loop."""
        return self.rates if self.open_loop else tuple(float(c) for c in self.levels)

    def at_load(self, load: float) -> BenchSpec:
        """This spec with the one level ``load`` (a rate for an open loop, else a concurrency)."""
        return replace(self, rates=(load,)) if self.open_loop else replace(self, levels=(int(load),))

    def requests_for(self, load: float) -> int:
        """Measured requests at ``load``: ``n=``, or a number that scales with the level."""
        if self.num_requests is not None:
            return self.num_requests
        if self.open_loop:
            return default_open_loop_requests(load, self.duration_s)
        return default_num_requests(int(load))

    def warmup_for(self, load: float) -> int:
        """Unmeasured requests before the level: ``warmup=``, or a few that scale with the level."""
        if self.warmup is not None:
            return self.warmup
        return default_warmup(max(1, math.ceil(load)))

    def input_dist(self) -> LengthDist:
        """The input length distribution: the typed ``in=`` when it was not a fixed length."""
        return parse_length(self.input, "in") if self.input else Fixed(self.input_len)

    def output_dist(self) -> LengthDist:
        """The output length distribution: the typed ``out=`` when it was not a fixed length."""
        return parse_length(self.output, "out") if self.output else Fixed(self.output_len)

    # --- the payload's JSON ------------------------------------------------------------------------------

    def to_dict(self) -> JsonObject:
        """JSON shape (schema 1): the original keys always, the newer ones only when set."""
        data: JsonObject = {
            "levels": list(self.levels),
            "input_len": self.input_len,
            "output_len": self.output_len,
            "num_requests": self.num_requests,
            "warmup": self.warmup,
        }
        extra: JsonObject = {
            "rates": list(self.rates),
            "arrivals": self.arrivals if self.rates else None,
            "duration_s": self.duration_s,
            "input": self.input,
            "output": self.output,
            "prefix_tokens": self.prefix_tokens or None,
            "api": self.api if self.api != DEFAULT_API else None,
            "dataset": self.dataset,
            "repeat": self.repeat if self.repeat != 1 else None,
            "slo": dict(self.slo) if self.slo else None,
            "slo_errors_pct": self.slo_errors_pct,
            "search_max": self.search_max,
            "search_rates": list(self.search_rates) if self.search_rates else None,
            "limits": self.limits.to_dict() or None,
            "profile_steps": self.profile_steps,
        }
        data.update({k: v for k, v in extra.items() if v})
        return data

    @classmethod
    def from_dict(cls, data: RawJson) -> BenchSpec:
        """Inverse of :meth:`to_dict`."""
        return cls(
            levels=tuple(int(x) for x in data.get("levels") or ()),
            input_len=int(data.get("input_len", DEFAULT_INPUT_LEN)),
            output_len=int(data.get("output_len", DEFAULT_OUTPUT_LEN)),
            num_requests=data.get("num_requests"),
            warmup=data.get("warmup"),
            rates=tuple(float(x) for x in data.get("rates") or ()),
            arrivals=str(data.get("arrivals") or DEFAULT_ARRIVALS),
            duration_s=float(data["duration_s"]) if data.get("duration_s") else None,
            input=data.get("input"),
            output=data.get("output"),
            prefix_tokens=int(data.get("prefix_tokens") or 0),
            api=str(data.get("api") or DEFAULT_API),
            dataset=data.get("dataset"),
            repeat=int(data.get("repeat") or 1),
            slo=tuple((str(k), float(v)) for k, v in (data.get("slo") or {}).items()),
            slo_errors_pct=float(data["slo_errors_pct"]) if data.get("slo_errors_pct") is not None else None,
            search_max=int(data["search_max"]) if data.get("search_max") else None,
            search_rates=(float(data["search_rates"][0]), float(data["search_rates"][1]))
            if data.get("search_rates")
            else None,
            limits=ResponseLimits.from_dict(data.get("limits")),
            profile_steps=int(data["profile_steps"]) if data.get("profile_steps") else None,
        )

    @property
    def label(self) -> str:
        """``1,8,32 in=1024 out=256``, ``rate=2,4 arrivals=constant in=512-2048 out=256 api=chat`` ..."""
        if self.slo:
            text = "slo " + " ".join(f"{k}={v:g}ms" for k, v in self.slo)
            if self.slo_errors_pct is not None:
                text += f" errors={self.slo_errors_pct:g}%"
            if self.search_rates:
                text += f" rate={self.search_rates[0]:g}-{self.search_rates[1]:g}"
            elif self.search_max:
                text += f" max={self.search_max}"
        elif self.rates:
            text = "rate=" + ",".join(f"{r:g}" for r in self.rates)
            if self.arrivals != DEFAULT_ARRIVALS:
                text += f" arrivals={self.arrivals}"
        else:
            text = ",".join(str(x) for x in self.levels)
        text += f" in={self.input or self.input_len} out={self.output or self.output_len}"
        if self.num_requests is not None:
            text += f" n={self.num_requests}"
        if self.duration_s is not None:
            text += f" duration={self.duration_s:g}s"
        if self.warmup is not None:
            text += f" warmup={self.warmup}"
        if self.prefix_tokens:
            text += f" prefix={self.prefix_tokens}"
        if self.api != DEFAULT_API:
            text += f" api={self.api}"
        if self.dataset:
            text += f" data={self.dataset}"
        if self.repeat != 1:
            text += f" repeat={self.repeat}"
        limits = self.limits
        for asked, default, word in (
            (limits.timeout_s, DEFAULT_LIMITS.timeout_s, "timeout"),
            (limits.first_byte_s, DEFAULT_LIMITS.first_byte_s, "first-byte"),
            (limits.idle_s, DEFAULT_LIMITS.idle_s, "idle"),
        ):
            if asked != default:
                text += f" {word}={asked:g}s"
        if limits.max_bytes:
            text += f" max-bytes={format_bytes(limits.max_bytes)}"
        if self.profile_steps:
            text += f" profile={self.profile_steps}"
        return text
