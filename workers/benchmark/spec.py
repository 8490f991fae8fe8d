"""The typed shapes of what a person asked the workers to do, as carried in job payloads.

Made once at the edge (the grammar in ``bot/commands.py``), serialised into the RQ job as JSON
(schema 1, new keys optional so older payloads still read), and read back by ``workers/jobs/runner.py``,
which turns a spec into the load generator's ``BenchParams`` with its own config (dataset paths live
on the worker's side: a payload names a dataset, never a path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.benchmark.limits import DEFAULT_LIMITS, ResponseLimits, format_bytes

DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 256
DEFAULT_API = "generate"
DEFAULT_ARRIVALS = "poisson"


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
    num_requests: int | None = None  # None: scales with the level (see workers/benchmark/client.py)
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

    def to_dict(self) -> dict[str, Any]:
        """JSON shape (schema 1): the original keys always, the newer ones only when set."""
        data: dict[str, Any] = {
            "levels": list(self.levels),
            "input_len": self.input_len,
            "output_len": self.output_len,
            "num_requests": self.num_requests,
            "warmup": self.warmup,
        }
        extra: dict[str, Any] = {
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
    def from_dict(cls, data: dict[str, Any]) -> BenchSpec:
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
        asked = self.limits.to_dict()
        for key, word in (("timeout_s", "timeout"), ("first_byte_s", "first-byte"), ("idle_s", "idle")):
            if key in asked:
                text += f" {word}={asked[key]:g}s"
        if asked.get("max_bytes"):
            text += f" max-bytes={format_bytes(asked['max_bytes'])}"
        if self.profile_steps:
            text += f" profile={self.profile_steps}"
        return text
