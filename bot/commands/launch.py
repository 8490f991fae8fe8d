"""``/launch``: preset words and ``--flag value`` pairs, a host, then an optional bench and eval.

:func:`_engine_words` is the one reading of an engine configuration; ``/sweep`` reuses it per config.
"""

from __future__ import annotations

from bot.commands.bench import _bench_spec
from bot.commands.evaluate import _eval_spec
from bot.commands.requests import CommandSpec, EngineConfigWords, LaunchRequest
from bot.commands.tokens import KEYWORDS, MAX_VALUE_LENGTH, _fail, _host
from workers.benchmark.spec import BenchSpec
from workers.config import FLAG_RE, NAME_RE, Config, FlagValue
from workers.evaluation.spec import EvalSpec
from workers.presets import check_preset_words, check_reserved_flag, suggest


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
            host = _host(tokens.pop(0), config, group_ok=True)  # a group: a gang launch (issue 38)
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


LAUNCH = CommandSpec(
    "launch",
    "/launch <presets...> [--engine-flag value ...] [on HOST|GROUP] [then bench LEVELS ...] [then eval [TASK] [n=N]]",
    "start the engine with presets (stops what owns the port first), verify what runs",
    "Stops whatever owns the engine port, starts the engine with the base flags plus the presets "
    "and flags you give, waits for it to be healthy, checks a generation is not garbage, and "
    "reports the config the server itself reports. 'then bench' benchmarks it under the same lease; "
    "'then eval' checks its accuracy too (stored with the bench's run, see /help eval). "
    "'on GROUP' (a group of hosts in the config, e.g. pair) launches one model across every member: it holds "
    "every member's lease, starts one rank per host with its rank's flags (the engine's own multi-node "
    "options, e.g. --nnodes/--node-rank/--dist-init-addr), is ready when the head answers and every rank is "
    "alive, benches through the head, and "
    "ends naming the rank, its host and its last log lines when one dies or never joins, stopping every other "
    "rank; /bench ... on GROUP and /eval ... on GROUP measure the running gang later through its head, and "
    "/stop GROUP stops every rank and shows each member's ports and GPUs free.",
    "launch",
    _parse_launch,
    (
        "/launch cutlass cudnn",
        "/launch nextn cudnn then bench 1,8,32",
        "/launch cutlass fp4-cutlass then bench 1,8 then eval n=300",
        "/launch nextn on pair then bench 1,8",
    ),
)
