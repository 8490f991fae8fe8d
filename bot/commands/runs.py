"""``/runs``, ``/compare``, ``/sweep``: the commands that make or read several runs."""

from __future__ import annotations

import re

from bot.commands.bench import _bench_spec
from bot.commands.evaluate import trailing_eval
from bot.commands.launch import _engine_words
from bot.commands.requests import CommandSpec, CompareRequest, RunsRequest, SweepRequest
from bot.commands.tokens import _fail, _int, _no_more
from workers.config import Config

RUN_ID_RE = re.compile(r"^r?([0-9]{1,9})$")
FILTER_RE = re.compile(r"^[A-Za-z0-9_.:@/-]{1,64}$")


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
    evaluate = trailing_eval(bench_tokens, config, extras)
    return SweepRequest(
        host=str(extras.get("host", config.default_host)), configs=tuple(configs), spec=spec, eval=evaluate
    )


RUNS = CommandSpec(
    "runs",
    "/runs [N] [filter] | /runs tag RUN TAG",
    "recent benchmark runs; tag one",
    "Lists the newest runs (filter by host, user, tag or preset). 'tag r12 baseline' makes r12 "
    "the baseline later benches of that host are drawn against.",
    "read",
    _parse_runs,
)

COMPARE = CommandSpec(
    "compare",
    "/compare RUN RUN ...",
    "one table and plot across runs",
    "Overlays 2 to 8 runs: throughput and latency against concurrency.",
    "read",
    _parse_compare,
)

SWEEP = CommandSpec(
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
)
