"""The command language: text -> a typed request, or a friendly error that changes nothing.

One grammar for every front end (Slack, console, ``benchbot say``). :data:`COMMANDS` is the one
place a command is added: its name, syntax, one-line help, details, access action and parser; the
dispatcher finds its handler as ``handle_<name>``. :func:`parse` never raises, whatever the input.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from workers.benchmark import schedule
from workers.benchmark.client import APIS, DEFAULT_OPEN_LOOP_S, default_open_loop_requests
from workers.benchmark.lengths import Fixed, FromDataset, LengthDist, UniformRange, parse_length
from workers.benchmark.limits import DEFAULT_LIMITS, ResponseLimits, parse_bytes
from workers.benchmark.slo import DEFAULT_MAX_ERROR_PCT, SLO_METRICS, parse_slo
from workers.benchmark.spec import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, BenchSpec
from workers.benchmark.units import parse_duration_s
from workers.config import FLAG_RE, NAME_RE, Config, FlagValue, Limits, Preset
from workers.errors import BenchbotError
from workers.evaluation.spec import EvalSpec
from workers.evaluation.tasks import MAX_N as MAX_EVAL_N
from workers.presets import check_preset_words, check_reserved_flag, suggest

SHELL_METACHARACTERS = set(";|&$`<>\\")
MAX_VALUE_LENGTH = 200
RUN_ID_RE = re.compile(r"^r?([0-9]{1,9})$")
JOB_ID_RE = re.compile(r"^(?:#|job-?)?([0-9]{1,12})$")
FILTER_RE = re.compile(r"^[A-Za-z0-9_.:@/-]{1,64}$")
KEYWORDS = {"on", "then"}


# --------------------------------------------------------------------------- typed requests


@dataclass(frozen=True)
class EngineConfigWords:
    """One engine configuration as typed: preset words and raw ``--flag value`` pairs."""

    presets: tuple[str, ...] = ()
    flags: tuple[tuple[str, FlagValue], ...] = ()

    @property
    def label(self) -> str:
        """How the person wrote it, normalised."""
        parts = list(self.presets) + [f if v is True else f"{f} {v}" for f, v in self.flags]
        return " ".join(parts) or "base"


@dataclass(frozen=True)
class LaunchRequest:
    """``/launch <presets> [--flag value ...] [on HOST] [then bench LEVELS ...] [then eval [TASK] [n=N]]``."""

    host: str
    config: EngineConfigWords
    then_bench: BenchSpec | None = None
    then_eval: EvalSpec | None = None
    command: str = "launch"


@dataclass(frozen=True)
class BenchRequest:
    """``/bench LEVELS [in=] [out=] [n=] [warmup=] [on HOST] [any]``."""

    host: str
    spec: BenchSpec
    any_config: bool = False
    command: str = "bench"


@dataclass(frozen=True)
class EvalRequest:
    """``/eval [TASK] [n=N] [seed=S] [on HOST] [any]``."""

    host: str
    spec: EvalSpec
    any_config: bool = False
    command: str = "eval"


@dataclass(frozen=True)
class StatusRequest:
    """``/status [HOST]``: None means every host."""

    host: str | None
    command: str = "status"


@dataclass(frozen=True)
class QueueRequest:
    """``/queue [HOST]``: None means every host."""

    host: str | None
    command: str = "queue"


@dataclass(frozen=True)
class CancelRequest:
    """``/cancel JOB``."""

    job_id: str
    command: str = "cancel"


@dataclass(frozen=True)
class StopRequest:
    """``/stop [HOST]``."""

    host: str
    command: str = "stop"


@dataclass(frozen=True)
class RunsRequest:
    """``/runs [N] [filter]`` or ``/runs tag RUN TAG``."""

    limit: int = 10
    filter: str | None = None
    tag_run: str | None = None
    tag: str | None = None
    command: str = "runs"


@dataclass(frozen=True)
class CompareRequest:
    """``/compare RUN RUN ...``."""

    run_ids: tuple[str, ...]
    command: str = "compare"


@dataclass(frozen=True)
class SweepRequest:
    """``/sweep CONFIG, CONFIG, ... bench LEVELS [opts] [eval [TASK] [n=N]] [on HOST]``."""

    host: str
    configs: tuple[EngineConfigWords, ...]
    spec: BenchSpec
    eval: EvalSpec | None = None
    command: str = "sweep"


@dataclass(frozen=True)
class HelpRequest:
    """``/help [command]``."""

    topic: str | None = None
    command: str = "help"


Request = (
    LaunchRequest
    | BenchRequest
    | EvalRequest
    | StatusRequest
    | QueueRequest
    | CancelRequest
    | StopRequest
    | RunsRequest
    | CompareRequest
    | SweepRequest
    | HelpRequest
)


@dataclass(frozen=True)
class ParseError:
    """A refusal: the message tells the person what was wrong and how to write it."""

    message: str
    command: str | None = None


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class CommandSpec:
    """A command's name, syntax, help and parser, side by side."""

    name: str
    syntax: str
    summary: str
    details: str
    action: str  # what access control checks: launch, bench, stop, sweep, cancel, read
    parser: Callable[[list[str], Config], Request]
    examples: tuple[str, ...] = field(default=())


def _fail(message: str) -> BenchbotError:
    return BenchbotError(message)


# --------------------------------------------------------------------------- token helpers


def _host(word: str, config: Config) -> str:
    if word not in config.hosts:
        raise _fail(f'unknown host "{word}"{suggest(word, config.hosts)}. Hosts: {", ".join(config.hosts)}')
    return word


def _host_or_any(word: str, tokens: list[str], config: Config, allow: set[str], extras: dict[str, object]) -> bool:
    """``on HOST`` / ``any`` where the command allows them: taken into ``extras``; False for any other word."""
    if word == "on" and "on" in allow:
        if not tokens:
            raise _fail('"on" needs a host name, e.g. "on gpu-1"')
        extras["host"] = _host(tokens.pop(0), config)
        return True
    if word == "any" and "any" in allow:
        extras["any"] = True
        return True
    return False


def _option(word: str, options: Mapping[str, str], values: Mapping[str, str], what: str) -> tuple[str, str]:
    """``key=value`` split, refused when the key is not one of ``options`` or was given before."""
    key, _, value = word.partition("=")
    if key not in options:
        raise _fail(
            f'unknown {what} "{key}="{suggest(key + "=", [k + "=" for k in options])}. '
            f"Options: {', '.join(k + '=' for k in options)}"
        )
    if key in values:
        raise _fail(f'"{key}=" is given twice')
    return key, value


def _int(value: str, what: str, lo: int, hi: int) -> int:
    if not re.fullmatch(r"[0-9]{1,9}", value):
        raise _fail(f"{what} must be a whole number from {lo} to {hi}, not {value!r}")
    number = int(value)
    if not lo <= number <= hi:
        raise _fail(f"{what} must be from {lo} to {hi}, not {number}")
    return number


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


def _take_levels(tokens: list[str]) -> str:
    """Pop the levels, letting ``1, 8, 32`` (spaces after commas) count as one list."""
    text = tokens.pop(0)
    while tokens and (text.endswith(",") or tokens[0].startswith(",")):
        text += tokens.pop(0)
    return text


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
            allowed = ", ".join(["in=", "out=", "n=", "rate=", "...", *sorted(a for a in allow if a != "host")])
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
    )


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


def _engine_words(tokens: list[str], config: Config, *, stop: set[str]) -> EngineConfigWords:
    """Preset words and ``--flag [value]`` pairs, up to a stop word (consumed tokens are popped)."""
    presets: list[str] = []
    flags: list[tuple[str, FlagValue]] = []
    while tokens and tokens[0] not in stop:
        word = tokens.pop(0)
        if word.startswith("-"):
            if not FLAG_RE.match(word):
                raise _fail(f'"{word}" is not an engine flag: engine flags look like --lower-case-words')
            check_reserved_flag(word)  # admin-only flags are the dispatcher's call: it knows who asks
            if any(f == word for f, _ in flags):
                raise _fail(f"{word} is given twice")
            if tokens and not tokens[0].startswith("--") and tokens[0] not in stop:
                value = tokens.pop(0)
                if len(value) > MAX_VALUE_LENGTH:
                    raise _fail(f"the value of {word} is longer than {MAX_VALUE_LENGTH} characters")
                flags.append((word, value))
            else:
                flags.append((word, True))
        else:
            if not NAME_RE.match(word):
                raise _fail(f'"{word}" is not a preset word{suggest(word.lower(), config.presets_for(None))}')
            presets.append(word)
    # Any engine's word here: "on HOST" comes later; the dispatcher checks the words against that host's engine.
    check_preset_words(config, presets, kind=None)
    return EngineConfigWords(presets=tuple(presets), flags=tuple(flags))


def _no_more(tokens: list[str], command: str) -> None:
    if tokens:
        raise _fail(f'unexpected "{tokens[0]}": see /help {command}')


# --------------------------------------------------------------------------- parsers


def _parse_launch(tokens: list[str], config: Config) -> LaunchRequest:
    words = _engine_words(tokens, config, stop=KEYWORDS)
    host = config.default_host
    then_bench: BenchSpec | None = None
    then_eval: EvalSpec | None = None
    while tokens:
        word = tokens.pop(0)
        if word == "on":
            if not tokens:
                raise _fail('"on" needs a host name, e.g. "on gpu-1"')
            host = _host(tokens.pop(0), config)
        elif word == "then":
            what = tokens.pop(0) if tokens else ""
            if what == "bench" and then_bench is None:
                then_bench, _ = _bench_spec(tokens, config, allow=set(), stop=frozenset({"then"}))
            elif what == "eval" and then_eval is None:
                then_eval, _ = _eval_spec(tokens, config, allow=set(), stop=frozenset({"then"}))
            else:
                raise _fail(
                    'after "then" comes "bench LEVELS" or "eval [TASK] [n=N]", once each, e.g. '
                    '"then bench 1,8,32 then eval"'
                )
        else:
            raise _fail(
                f'unexpected "{word}": presets and --flags come first, then "on HOST", then "then bench" / "then eval"'
            )
    if not words.presets and not words.flags:
        raise _fail('say what to launch, e.g. "/launch cutlass cudnn" (see /help launch for the presets)')
    return LaunchRequest(host=host, config=words, then_bench=then_bench, then_eval=then_eval)


def _parse_bench(tokens: list[str], config: Config) -> BenchRequest:
    spec, extras = _bench_spec(tokens, config, allow={"on", "any"})
    return BenchRequest(
        host=str(extras.get("host", config.default_host)), spec=spec, any_config=bool(extras.get("any", False))
    )


EVAL_OPTIONS = {"n": "questions to ask (default from the config, 300)", "seed": "which questions (default 0)"}


def _eval_spec(
    tokens: list[str], config: Config, *, allow: set[str], stop: frozenset[str] = frozenset()
) -> tuple[EvalSpec, dict[str, object]]:
    """``[TASK] [n=N] [seed=S]`` (+ ``on HOST`` / ``any`` when allowed); a word in ``stop`` ends it."""
    known = config.eval.task_names
    task = config.eval.task
    if tokens and "=" not in tokens[0] and tokens[0] not in allow | stop | {"on", "any"}:
        word = tokens.pop(0)
        if word.lower() not in known:
            raise _fail(f'unknown eval task "{word}"{suggest(word.lower(), known)}. Tasks: {", ".join(known)}')
        task = word.lower()
    values: dict[str, str] = {}
    extras: dict[str, object] = {}
    while tokens:
        word = tokens.pop(0)
        if word in stop:
            tokens.insert(0, word)
            break
        if _host_or_any(word, tokens, config, allow, extras):
            continue
        if "=" in word:
            key, value = _option(word, EVAL_OPTIONS, values, "eval option")
            values[key] = value
        else:
            raise _fail(f'unexpected "{word}" in the eval (expected a task, n=N or seed=S; /help eval)')
    n = _int(values["n"], "n=", 1, MAX_EVAL_N) if "n" in values else None
    seed = _int(values["seed"], "seed=", 0, 10**9) if "seed" in values else 0
    return EvalSpec(task=task, n=n, seed=seed), extras


def _parse_eval(tokens: list[str], config: Config) -> EvalRequest:
    spec, extras = _eval_spec(tokens, config, allow={"on", "any"})
    return EvalRequest(
        host=str(extras.get("host", config.default_host)), spec=spec, any_config=bool(extras.get("any", False))
    )


def _optional_host(tokens: list[str], config: Config, command: str) -> str | None:
    if tokens and tokens[0] == "on":
        tokens.pop(0)
    host = _host(tokens.pop(0), config) if tokens else None
    _no_more(tokens, command)
    return host


def _parse_status(tokens: list[str], config: Config) -> StatusRequest:
    return StatusRequest(host=_optional_host(tokens, config, "status"))


def _parse_queue(tokens: list[str], config: Config) -> QueueRequest:
    return QueueRequest(host=_optional_host(tokens, config, "queue"))


def _parse_stop(tokens: list[str], config: Config) -> StopRequest:
    return StopRequest(host=_optional_host(tokens, config, "stop") or config.default_host)


def _parse_cancel(tokens: list[str], config: Config) -> CancelRequest:
    if not tokens:
        raise _fail('which job? e.g. "/cancel 17" (/queue shows job numbers)')
    match = JOB_ID_RE.match(tokens.pop(0))
    if not match:
        raise _fail('job numbers look like "17" (see /queue)')
    _no_more(tokens, "cancel")
    return CancelRequest(job_id=match.group(1))


def _run_id(word: str) -> str:
    match = RUN_ID_RE.match(word)
    if not match:
        raise _fail(f'"{word}" is not a run id: run ids look like "r12" (see /runs)')
    return f"r{int(match.group(1))}"


def _parse_runs(tokens: list[str], config: Config) -> RunsRequest:
    if tokens and tokens[0] == "tag":
        tokens.pop(0)
        if len(tokens) != 2:
            raise _fail('tag a run like "/runs tag r12 baseline"')
        run_id = _run_id(tokens.pop(0))
        tag = tokens.pop(0)
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,31}", tag):
            raise _fail("tags are lower-case words (letters, digits, '.', '_', '-'), up to 32 characters")
        return RunsRequest(tag_run=run_id, tag=tag)
    limit = 10
    if tokens and re.fullmatch(r"[0-9]+", tokens[0]):
        limit = _int(tokens.pop(0), "the number of runs", 1, 100)
    run_filter = None
    if tokens:
        run_filter = tokens.pop(0)
        if not FILTER_RE.match(run_filter):
            raise _fail("a filter is one word: a host, a user, a tag or a preset")
    _no_more(tokens, "runs")
    return RunsRequest(limit=limit, filter=run_filter)


def _parse_compare(tokens: list[str], config: Config) -> CompareRequest:
    ids = [_run_id(t) for t in " ".join(tokens).replace(",", " ").split()]
    if len(ids) < 2:
        raise _fail('compare at least two runs, e.g. "/compare r3 r5"')
    if len(ids) > 8:
        raise _fail("compare at most 8 runs at once")
    if len(set(ids)) != len(ids):
        raise _fail("a run is named twice")
    return CompareRequest(run_ids=tuple(ids))


def _parse_sweep(tokens: list[str], config: Config) -> SweepRequest:
    if "bench" not in tokens:
        raise _fail('a sweep ends with "bench LEVELS", e.g. "/sweep cutlass cudnn, nextn cudnn bench 1,8,32"')
    cut = tokens.index("bench")
    config_tokens, bench_tokens = tokens[:cut], tokens[cut + 1 :]
    groups: list[list[str]] = [[]]
    for token in config_tokens:
        pieces = token.split(",")
        for i, piece in enumerate(pieces):
            if piece:
                groups[-1].append(piece)
            if i < len(pieces) - 1:
                groups.append([])
    if any(not g for g in groups):
        raise _fail("each configuration between commas needs at least one preset or --flag")
    if len(groups) > config.limits.max_sweep_configs:
        raise _fail(f"at most {config.limits.max_sweep_configs} configurations per sweep")
    configs = []
    for group in groups:
        words = _engine_words(group, config, stop=set())
        configs.append(words)
    labels = [c.label for c in configs]
    if len(set(labels)) != len(labels):
        raise _fail("the same configuration is listed twice")
    spec, extras = _bench_spec(bench_tokens, config, allow={"on"}, stop=frozenset({"eval"}))
    evaluate = None
    if bench_tokens:  # the bench stopped at "eval"
        bench_tokens.pop(0)
        evaluate, eval_extras = _eval_spec(bench_tokens, config, allow={"on"})
        if "host" in eval_extras:
            if "host" in extras:
                raise _fail('"on HOST" is given twice')
            extras["host"] = eval_extras["host"]
    return SweepRequest(
        host=str(extras.get("host", config.default_host)), configs=tuple(configs), spec=spec, eval=evaluate
    )


def _parse_help(tokens: list[str], config: Config) -> HelpRequest:
    topic = tokens.pop(0).lstrip("/") if tokens else None
    _no_more(tokens, "help")
    if topic is not None and topic not in COMMANDS:
        raise _fail(f'no command "/{topic}"{suggest(topic, COMMANDS)}')
    return HelpRequest(topic=topic)


COMMANDS: dict[str, CommandSpec] = {
    spec.name: spec
    for spec in (
        CommandSpec(
            "launch",
            "/launch <presets...> [--engine-flag value ...] [on HOST] [then bench LEVELS ...] [then eval [TASK] [n=N]]",
            "start the engine with presets (stops what owns the port first), verify what runs",
            "Stops whatever owns the engine port, starts the engine with the base flags plus the presets "
            "and flags you give, waits for it to be healthy, checks a generation is not garbage, and "
            "reports the config the server itself reports. 'then bench' benchmarks it under the same lease; "
            "'then eval' checks its accuracy too (stored with the bench's run, see /help eval).",
            "launch",
            _parse_launch,
            (
                "/launch cutlass cudnn",
                "/launch nextn cudnn then bench 1,8,32",
                "/launch cutlass fp4-cutlass then bench 1,8 then eval n=300",
            ),
        ),
        CommandSpec(
            "bench",
            "/bench <levels | rate=R,R | slo ttft=MS itl=MS> [in=TOKENS] [out=TOKENS] [n=REQUESTS] "
            "[warmup=N] [api=chat] [prefix=N] [data=NAME] [repeat=N] [on HOST] [any]",
            "benchmark the running server at several concurrency levels",
            "Benchmarks whatever runs now, and refuses if it is not the config that was running when you "
            "asked (or your own queued launch) unless you add 'any'. Levels are sorted; defaults "
            f"in={DEFAULT_INPUT_LEN} out={DEFAULT_OUTPUT_LEN}, n scales with the level. rate=R,R runs an open "
            "loop instead: requests arrive at R per second (arrivals=poisson|constant, duration=20s) whatever "
            "is in flight, and the schedule lag is reported. in=/out= take a range (512-2048) or 'dataset'; "
            "api=chat uses /v1/chat/completions; prefix=N shares N tokens across a level's requests; "
            "data=NAME sends prompts from a configured dataset. repeat=N runs each level N times and reports "
            "the mean with its 95 % interval; /compare then says whether a difference is significant. "
            "'/bench slo ttft=500ms itl=50ms' searches for the highest concurrency (max=N, or rate=LO-HI "
            "for request rates) whose p99s meet the limits, and reports the knee and its goodput.",
            "bench",
            _parse_bench,
            (
                "/bench 1,8,32",
                "/bench 1,8 in=512 out=128 n=32",
                "/bench rate=2,4,8 arrivals=poisson duration=30s in=512-2048",
                "/bench 8 api=chat data=sharegpt out=dataset",
                "/bench slo ttft=500ms itl=50ms max=128",
            ),
        ),
        CommandSpec(
            "eval",
            "/eval [TASK] [n=QUESTIONS] [seed=S] [on HOST] [any]",
            "check the running server still answers right: accuracy vs the host's baseline",
            "Asks the running server a task's questions greedily (temperature 0), scores the replies, stores "
            "the accuracy (95 % interval) with the run and its observed config, and compares it with the "
            "host's eval baseline: 'accuracy 96.0 % (baseline 96.5 %, difference within noise)', or a red "
            "ACCURACY DROP when it is worse beyond noise (McNemar's exact test on the shared questions). "
            "The baseline is the newest run tagged 'baseline' on the host that has an eval of the same task "
            "and model, else the host's first good eval of it. TASK is 'builtin' (generated arithmetic and "
            "exact copying, no download) or a JSONL file named in the config's [eval.tasks]; n defaults to "
            "300 (enough to flag a 5-point drop). Like /bench, it refuses a server that is not the one you "
            "meant unless you add 'any'.",
            "eval",
            _parse_eval,
            ("/eval", "/eval builtin n=100", "/eval gsm8k n=500 on gpu-1"),
        ),
        CommandSpec(
            "status",
            "/status [HOST]",
            "what really runs on a host, observed now",
            "Observes the host afresh: the process on the engine port, the server's own config, who "
            "launched it, its fingerprint and instance, GPU memory. Shows servers benchbot did not start.",
            "read",
            _parse_status,
        ),
        CommandSpec(
            "queue",
            "/queue [HOST]",
            "running and queued jobs, with owners and positions",
            "Lists each host's running job and the queued ones in order.",
            "read",
            _parse_queue,
        ),
        CommandSpec(
            "cancel",
            "/cancel JOB",
            "cancel your queued or running job (admins: any job)",
            "A queued job is removed; a running one is stopped and what it started is cleaned up.",
            "cancel",
            _parse_cancel,
        ),
        CommandSpec(
            "stop",
            "/stop [HOST]",
            "stop the engine on a host (queued behind running jobs)",
            "Stops whatever owns the engine port, in turn with the other jobs on that host.",
            "stop",
            _parse_stop,
        ),
        CommandSpec(
            "runs",
            "/runs [N] [filter] | /runs tag RUN TAG",
            "recent benchmark runs; tag one",
            "Lists the newest runs (filter by host, user, tag or preset). 'tag r12 baseline' makes r12 "
            "the baseline later benches of that host are drawn against.",
            "read",
            _parse_runs,
        ),
        CommandSpec(
            "compare",
            "/compare RUN RUN ...",
            "one table and plot across runs",
            "Overlays 2 to 8 runs: throughput and latency against concurrency.",
            "read",
            _parse_compare,
        ),
        CommandSpec(
            "sweep",
            "/sweep CONFIG, CONFIG, ... bench LEVELS [opts] [eval [TASK] [n=N]] [on HOST]",
            "launch + bench each config in turn, then one comparison",
            "Runs a launch and a bench per configuration under one lease; a failed launch becomes a "
            "failed cell with its diagnosis and the sweep goes on. 'eval' adds an accuracy check per "
            "configuration (stored with its run, compared with the host's eval baseline): the comparison "
            "then shows accuracy beside tok/s, and a config that is fast but wrong is flagged.",
            "sweep",
            _parse_sweep,
            (
                "/sweep cutlass cudnn, nextn cudnn, nextn cudnn customar bench 1,8,32",
                "/sweep cutlass cudnn, cutlass fp4-cutlass bench 1,8 eval n=300",
            ),
        ),
        CommandSpec(
            "help",
            "/help [command]",
            "this list, or one command in detail",
            "Shows every command, or the syntax and examples of one.",
            "read",
            _parse_help,
        ),
    )
}


# --------------------------------------------------------------------------- entry points


#: Unicode categories refused anywhere in a command: format characters (bidi overrides and isolates,
#: zero-width joiners and spaces), line and paragraph separators, private use and lone surrogates.
_INVISIBLE = frozenset({"Cf", "Zl", "Zp", "Co", "Cs"})


def _check_text(text: str, config: Config) -> None:
    if len(text) > config.limits.max_command_length:
        raise _fail(f"that command is longer than {config.limits.max_command_length} characters")
    for ch in text:
        if ch in "\n\r":
            raise _fail("a command is one line")
        if ord(ch) < 32 or ord(ch) == 127 or 0x80 <= ord(ch) < 0xA0:
            raise _fail("the command contains control characters")
        if unicodedata.category(ch) in _INVISIBLE:
            name = unicodedata.name(ch, "a formatting character")
            raise _fail(
                f"the command contains an invisible character, U+{ord(ch):04X} {name} (it can make a value "
                "read differently from what it is, e.g. a right-to-left override): type plain text"
            )
    bad = sorted(SHELL_METACHARACTERS.intersection(text))
    if bad:
        shown = " ".join(f"'{c}'" for c in bad)
        raise _fail(
            f"benchbot never runs shell commands: {shown} is not allowed. "
            "Give preset words and --engine-flag values only."
        )


def tokenize(text: str, config: Config) -> list[str]:
    """Split like a shell would (quotes group words) after refusing control and shell characters."""
    _check_text(text, config)
    try:
        return shlex.split(text, posix=True)
    except ValueError:
        raise _fail("unbalanced quotes in the command") from None


def parse_command(name: str, text: str, config: Config) -> Request | ParseError:
    """Parse the text of a slash command whose name arrives separately (as Slack sends it)."""
    try:
        command = name.strip().lstrip("/").lower()
        if command not in COMMANDS:
            return ParseError(f'no command "/{command[:40]}"{suggest(command, COMMANDS)}. Try /help')
        tokens = tokenize(text, config)
        return COMMANDS[command].parser(tokens, config)
    except BenchbotError as exc:
        return ParseError(str(exc), command=name.strip().lstrip("/").lower() or None)
    except Exception as exc:  # the parser must never raise; a bug still gets a polite answer
        return ParseError(f"could not understand that command ({type(exc).__name__}); see /help")


def parse(line: str, config: Config) -> Request | ParseError:
    """Parse a whole line such as ``/launch nextn cudnn`` (the leading slash is optional)."""
    try:
        stripped = line.strip()
        if not stripped:
            return ParseError("type a command, e.g. /help")
        name, _, rest = stripped.partition(" ")
        if not re.fullmatch(r"/?[A-Za-z]{1,20}", name):
            _check_text(stripped, config)
            return ParseError(f'"{name[:40]}" is not a command. Try /help')
        return parse_command(name, rest, config)
    except BenchbotError as exc:
        return ParseError(str(exc))
    except Exception as exc:
        return ParseError(f"could not understand that command ({type(exc).__name__}); see /help")


def help_text(topic: str | None = None, config: Config | None = None) -> str:
    """Every command with its one-line help, or one command's syntax, details and examples."""
    if topic:
        spec = COMMANDS[topic]
        lines = [spec.syntax, "", spec.details]
        if spec.examples:
            lines += ["", "Examples:", *(f"  {e}" for e in spec.examples)]
        if topic in ("launch", "sweep") and config is not None:
            lines += ["", "Presets:", *preset_lines(config)]
        return "\n".join(lines)
    width = max(len(f"/{name}") for name in COMMANDS)
    lines = ["benchbot commands:"]
    lines += [f"  /{spec.name:<{width - 1}}  {spec.summary}" for spec in COMMANDS.values()]
    if config is not None:
        lines += ["", "Presets (for /launch and /sweep):", *preset_lines(config)]
    lines += ["", "/help COMMAND shows its syntax and examples."]
    return "\n".join(lines)


def preset_lines(config: Config) -> Sequence[str]:
    """One line per preset: name, group, description; vLLM's presets after, when a host runs vLLM."""
    out = _preset_table(config.presets)
    for preset_set, whose in (("vllm", "vLLM hosts"), ("vllm-cpu", "vLLM CPU hosts")):
        hosts = [name for name, host in config.hosts.items() if host.engine.preset_set == preset_set]
        if hosts and config.presets_for(preset_set):
            out += [f"  {whose} ({', '.join(hosts)}), in vLLM's words:", *_preset_table(config.presets_for(preset_set))]
    return out


def _preset_table(presets: Mapping[str, Preset]) -> list[str]:
    width = max((len(n) for n in presets), default=0)
    out = []
    for name, preset in presets.items():
        group = f"[{preset.group}] " if preset.group else ""
        out.append(f"  {name:<{width}}  {group}{preset.description}")
    return out
