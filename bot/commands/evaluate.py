"""``/eval``: a task, ``n=`` and ``seed=`` -> one :class:`EvalSpec` (also after ``then`` and in a sweep)."""

from __future__ import annotations

from bot.commands.requests import CommandSpec, EvalRequest
from bot.commands.tokens import GROUP_OK, _fail, _host_or_any, _int, _option
from workers.config import Config
from workers.evaluation.spec import EvalSpec
from workers.evaluation.tasks import MAX_N as MAX_EVAL_N
from workers.presets import suggest

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


def trailing_eval(tokens: list[str], config: Config, extras: dict[str, object]) -> EvalSpec | None:
    """``eval [TASK] [n=N]`` after a bench that stopped at ``eval`` (a sweep's, a tune's); its ``on HOST``
    joins the bench's ``extras`` (given twice is refused). None when nothing is left."""
    if not tokens:
        return None
    tokens.pop(0)
    evaluate, eval_extras = _eval_spec(tokens, config, allow={"on"})
    if "host" in eval_extras:
        if "host" in extras:
            raise _fail('"on HOST" is given twice')
        extras["host"] = eval_extras["host"]
    return evaluate


def _parse_eval(tokens: list[str], config: Config) -> EvalRequest:
    spec, extras = _eval_spec(tokens, config, allow={"on", "any", GROUP_OK})
    return EvalRequest(
        host=str(extras.get("host", config.default_host)), spec=spec, any_config=bool(extras.get("any", False))
    )


EVAL = CommandSpec(
    "eval",
    "/eval [TASK] [n=QUESTIONS] [seed=S] [on HOST|GROUP] [any]",
    "check the running server still answers right: accuracy vs the host's baseline",
    "Asks the running server a task's questions greedily (temperature 0), scores the replies, stores "
    "the accuracy (95 % interval) with the run and its observed config, and compares it with the "
    "host's eval baseline: 'accuracy 96.0 % (baseline 96.5 %, difference within noise)', or a red "
    "ACCURACY DROP when it is worse beyond noise (McNemar's exact test on the shared questions). "
    "The baseline is the newest run tagged 'baseline' on the host that has an eval of the same task "
    "and model, else the host's first good eval of it. TASK is 'builtin' (generated arithmetic and "
    "exact copying, no download) or a JSONL file named in the config's [eval.tasks]; n defaults to "
    "300 (enough to flag a 5-point drop). Like /bench, it refuses a server that is not the one you "
    "meant unless you add 'any'. 'on GROUP' asks a running gang (a /launch ... on GROUP) through its head, "
    "after checking every rank is alive and runs the head's config, as /bench on a group does.",
    "eval",
    _parse_eval,
    ("/eval", "/eval builtin n=100", "/eval gsm8k n=500 on gpu-1"),
)
