"""``/help`` and the command table: every family's :class:`CommandSpec` in the order help lists them.

:data:`COMMANDS` is the one place a command is added (its module declares the spec beside its parser);
the dispatcher finds its handler as ``handle_<name>``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bot.commands.bench import BENCH
from bot.commands.evaluate import EVAL
from bot.commands.hosts import CANCEL, QUEUE, STATUS, STOP
from bot.commands.launch import LAUNCH
from bot.commands.requests import CommandSpec, HelpRequest
from bot.commands.runs import COMPARE, RUNS, SWEEP
from bot.commands.tokens import _fail, _no_more
from bot.commands.tune import TUNE
from workers.config import Config, Preset
from workers.engines import registry
from workers.presets import suggest


def _parse_help(tokens: list[str], config: Config) -> HelpRequest:
    topic = tokens.pop(0).lstrip("/") if tokens else None
    _no_more(tokens, "help")
    if topic is not None and topic not in COMMANDS:
        raise _fail(f'no command "/{topic}"{suggest(topic, COMMANDS)}')
    return HelpRequest(topic=topic)


HELP = CommandSpec(
    "help",
    "/help [command]",
    "this list, or one command in detail",
    "Shows every command, or the syntax and examples of one.",
    "read",
    _parse_help,
)


COMMANDS: dict[str, CommandSpec] = {
    spec.name: spec for spec in (LAUNCH, BENCH, EVAL, STATUS, QUEUE, CANCEL, STOP, RUNS, COMPARE, SWEEP, TUNE, HELP)
}


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
    lines += ["In a job's thread, mention @benchbot (again out=512, compare baseline, tag baseline, why ...)."]
    return "\n".join(lines)


def preset_lines(config: Config) -> Sequence[str]:
    """One line per preset: name, group, description; the default engine's first, then each other preset set a
    host uses (every engine's packaged sets in the registry's order, then a config's own), in its engine's words."""
    out = _preset_table(config.presets)
    order = [*registry.packaged_preset_files(), *config.engine_presets]
    for preset_set in dict.fromkeys(order):
        hosts = [name for name, host in config.hosts.items() if host.engine.preset_set == preset_set]
        if preset_set == registry.DEFAULT_KIND or not hosts or not config.presets_for(preset_set):
            continue
        whose = f"{registry.display_name(preset_set)} hosts ({', '.join(hosts)})"
        words = registry.display_name(registry.family(preset_set))
        out += [f"  {whose}, in {words}'s words:", *_preset_table(config.presets_for(preset_set))]
    return out


def _preset_table(presets: Mapping[str, Preset]) -> list[str]:
    width = max((len(n) for n in presets), default=0)
    out = []
    for name, preset in presets.items():
        group = f"[{preset.group}] " if preset.group else ""
        out.append(f"  {name:<{width}}  {group}{preset.description}")
    return out
