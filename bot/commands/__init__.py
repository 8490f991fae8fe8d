"""The command language: text -> a typed request, or a friendly error that changes nothing.

One grammar for every front end (Slack, console, ``benchbot say``), one module per command family with
its help beside its grammar (``launch``, ``bench``, ``evaluate``, ``hosts`` for status/queue/cancel/stop,
``runs`` for runs/compare/sweep, ``help`` with the table), over a shared tokenizer (``tokens``) and the
typed requests (``requests``). :data:`COMMANDS` (in ``help``) is the one place a command is added; the
dispatcher finds its handler as ``handle_<name>``. :func:`parse` never raises, whatever the input.
This module only re-exports, so ``from bot.commands import ...`` keeps working for every caller.
"""

from bot.commands.bench import (
    BENCH_OPTIONS,
    DEFAULT_SEARCH_MAX,
    MAX_REPEAT,
    parse_bench_spec,
    parse_levels,
    parse_rates,
)
from bot.commands.evaluate import EVAL_OPTIONS
from bot.commands.help import COMMANDS, help_text, preset_lines
from bot.commands.hosts import JOB_ID_RE
from bot.commands.parse import parse, parse_command
from bot.commands.requests import (
    BenchRequest,
    CancelRequest,
    CommandSpec,
    CompareRequest,
    EngineConfigWords,
    EvalRequest,
    HelpRequest,
    LaunchRequest,
    ParseError,
    QueueRequest,
    Request,
    RunsRequest,
    StatusRequest,
    StopRequest,
    SweepRequest,
    TuneRequest,
)
from bot.commands.runs import FILTER_RE, RUN_ID_RE
from bot.commands.tokens import KEYWORDS, MAX_VALUE_LENGTH, SHELL_METACHARACTERS, tokenize

__all__ = [
    "BENCH_OPTIONS",
    "COMMANDS",
    "DEFAULT_SEARCH_MAX",
    "EVAL_OPTIONS",
    "FILTER_RE",
    "JOB_ID_RE",
    "KEYWORDS",
    "MAX_REPEAT",
    "MAX_VALUE_LENGTH",
    "RUN_ID_RE",
    "SHELL_METACHARACTERS",
    "BenchRequest",
    "CancelRequest",
    "CommandSpec",
    "CompareRequest",
    "EngineConfigWords",
    "EvalRequest",
    "HelpRequest",
    "LaunchRequest",
    "ParseError",
    "QueueRequest",
    "Request",
    "RunsRequest",
    "StatusRequest",
    "StopRequest",
    "SweepRequest",
    "TuneRequest",
    "help_text",
    "parse",
    "parse_bench_spec",
    "parse_command",
    "parse_levels",
    "parse_rates",
    "preset_lines",
    "tokenize",
]
