"""``/tune``: a search space in the team's words, the SLO, the objective and the budget -> a TuneRequest.

The space is checked against the host's presets and the config's ``[tune.knobs]`` here (an unknown word,
an undeclared knob, a range too big: one sentence, nothing queued); the dispatcher prunes it again with
the requester's rights and prints it for ``dry-run``. The SLO part is ``/bench slo ...``'s own grammar.
"""

from __future__ import annotations

from bot.commands.bench import _bench_spec
from bot.commands.evaluate import trailing_eval
from bot.commands.hosts import JOB_ID_RE
from bot.commands.requests import CommandSpec, TuneRequest
from bot.commands.tokens import _fail, _host, _int, _no_more
from workers.benchmark.units import parse_duration_s
from workers.config import Config
from workers.errors import BenchbotError
from workers.tune.objective import OBJECTIVES
from workers.tune.space import parse_space

#: The most trials one /tune may ask for; its default budget when neither budget= nor time= is given.
MAX_BUDGET, DEFAULT_BUDGET = 200, 12
_TUNE_OPTIONS = ("objective", "budget", "time", "seed")


def _parse_tune(tokens: list[str], config: Config) -> TuneRequest:
    if tokens and tokens[0] in ("resume", "pause"):
        action = tokens.pop(0)
        if not tokens or not JOB_ID_RE.match(tokens[0]):
            raise _fail(f'"/tune {action}" takes the tune\'s id, e.g. /tune {action} 17')
        tune_id = tokens.pop(0)
        _no_more(tokens, "tune")
        return TuneRequest(host=config.default_host, action=action, tune_id=tune_id)
    if "slo" not in tokens:
        raise _fail('a /tune needs its latency limits: add "slo ttft=2s itl=40ms" after the space')
    cut = tokens.index("slo")
    space_words: list[tuple[str, str]] = []
    for word in tokens[:cut]:
        name, eq, listed = word.partition("=")
        if not eq:
            raise _fail(f'"{word}" is not a dimension: write NAME=VALUES, e.g. moe=cutlass,triton or nextn=on,off')
        space_words.append((name.lower(), listed))
    rest = tokens[cut:]
    values: dict[str, str] = {}
    dry_run = False
    bench_tokens: list[str] = []
    for word in rest:
        key, eq, value = word.partition("=")
        if eq and key in _TUNE_OPTIONS:
            if key in values:
                raise _fail(f'"{key}=" is given twice')
            values[key] = value
        elif word == "dry-run":
            dry_run = True
        else:
            bench_tokens.append(word)
    try:
        spec, extras = _bench_spec(bench_tokens, config, allow={"on"}, stop=frozenset({"eval"}))
    except BenchbotError as exc:  # the bench's grammar, in the tune's words
        raise _fail(str(exc).replace("after the levels", "in the /tune").replace("/help bench", "/help tune")) from None
    evaluate = trailing_eval(bench_tokens, config, extras)
    if spec.search_rates is not None:
        raise _fail("/tune searches over concurrency: drop rate= (max=N sets the top of each knee search)")
    objective = values.get("objective", "goodput")
    if objective not in OBJECTIVES:
        raise _fail(f"objective={objective}: use one of {', '.join(OBJECTIVES)}")
    if "budget" in values and "time" in values:
        raise _fail("give budget=N (trials) or time=2h (a deadline), not both")
    budget = _int(values["budget"], "budget=", 1, MAX_BUDGET) if "budget" in values else None
    time_s = parse_duration_s(values["time"], "time=") if "time" in values else None
    host = str(extras.get("host", config.default_host))
    parse_space(space_words, config, config.host(_host(host, config)), admin=True)
    return TuneRequest(
        host=host,
        space=tuple(space_words),
        spec=spec,
        objective=objective,
        budget=budget,
        time_s=time_s,
        eval=evaluate,
        dry_run=dry_run,
        seed=_int(values["seed"], "seed=", 0, 10**9) if "seed" in values else 0,
    )


TUNE = CommandSpec(
    "tune",
    "/tune SPACE slo ttft=MS itl=MS [objective=goodput|tokens_per_joule|both] [budget=N | time=2h] [seed=S] "
    "[in=] [out=] [max=N] [eval [TASK] [n=N]] [on HOST] [dry-run] | /tune resume|pause ID",
    "search for the best config under an SLO, each candidate behind the accuracy gate",
    "SPACE names what to try in the team's words: a preset group is one choice (moe=cutlass,triton; "
    "fp4=cutlass means the fp4-cutlass preset), a preset is switched with nextn=on,off, and a number "
    "only through a knob an admin declared in the config's [tune.knobs] (flag, range, step), e.g. "
    "max-running=64..512. Conflicting presets, missing requirements and flags the host's engine version "
    "lacks are pruned before any launch; 'dry-run' prints the space, its size, what was pruned and why, "
    "and the estimated time. Each trial launches the config (a failed launch is a crashed trial with its "
    "diagnosis, never tried again), searches the SLO's knee (objective=goodput: req/s at the knee; "
    "tokens_per_joule: output tokens per joule at the knee; both: the Pareto front), and runs a quick "
    "eval: a config with an ACCURACY DROP can never win. A trial whose first level is already "
    "significantly below the incumbent (Welch's test) is pruned. Small spaces are searched as a grid, "
    "bigger ones by Optuna's TPE, both seeded (seed=S, default 0) for a reproducible order; "
    f"budget=N trials (default {DEFAULT_BUDGET}), or time=2h: a deadline, every kept config a candidate. The "
    "lease is held per trial: between trials, teammates' queued jobs run first; /queue and /status show "
    "each tune's trial k of N and its incumbent. /cancel ID ends it after "
    "the current trial and keeps every result; /tune pause ID and /tune resume ID (its owner or an "
    "admin) hold and continue it, and resume also picks up a study a dead worker left. At the end the "
    "best 1-3 are re-run with repeat=3 and the full eval, compared with the host's baseline, and the "
    "reply gives the winner's running config and the /launch line that reproduces it; in Slack the "
    "tune's thread gets every trial's line, the trials table and the figures.",
    "tune",
    _parse_tune,
    (
        "/tune moe=cutlass,triton fp4=cudnn,cutlass nextn=on,off slo ttft=2s itl=60ms budget=6 eval n=40",
        "/tune max-running=64..256 nextn=on,off slo ttft=1s itl=40ms time=2h dry-run",
        "/tune resume 17",
    ),
)
