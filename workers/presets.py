"""Preset words -> the engine's argv and env: groups, removals, conflicts and requirements.

The argv is always built as a list (engine command + model + base flags + presets + raw flags) so no
part of it is ever interpreted by a shell; the SSH transport quotes each part separately.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from workers.config import Config, FlagValue, HostConfig
from workers.errors import BenchbotError


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start the engine, and what we asked for (to diff against what runs)."""

    host: str
    presets: tuple[str, ...]
    raw_flags: tuple[tuple[str, FlagValue], ...]
    flags: tuple[tuple[str, FlagValue], ...]  # the merged flags, in argv order (port and model included)
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # preset/engine env only; secrets are added by the worker at spawn

    @property
    def label(self) -> str:
        """The words a person would use for this config: presets then raw flags."""
        parts = list(self.presets)
        for flag, value in self.raw_flags:
            parts.append(flag if value is True else f"{flag} {value}")
        return " ".join(parts) or "base"

    def to_dict(self) -> dict:
        """JSON shape carried in job payloads (schema 1)."""
        return {
            "schema": 1,
            "host": self.host,
            "presets": list(self.presets),
            "raw_flags": [[f, v] for f, v in self.raw_flags],
            "flags": [[f, v] for f, v in self.flags],
            "argv": list(self.argv),
            "env": dict(self.env),
            "label": self.label,
        }

    @classmethod
    def from_dict(cls, data: dict) -> LaunchSpec:
        """Inverse of :meth:`to_dict`."""
        return cls(
            host=data["host"],
            presets=tuple(data["presets"]),
            raw_flags=tuple((f, v) for f, v in data["raw_flags"]),
            flags=tuple((f, v) for f, v in data["flags"]),
            argv=tuple(data["argv"]),
            env=tuple(sorted(data["env"].items())),
        )


def suggest(word: str, choices: Iterable[str]) -> str:
    """' (did you mean "x"?)' when a close match exists, else ''."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


#: Flags benchbot sets from the host and engine config; a command may not override them.
RESERVED_FLAGS = frozenset({"--port", "--host", "--model-path", "--model"})


def check_raw_flag(flag: str) -> None:
    """Refuse a raw flag that would fight the host config (the port and model are benchbot's)."""
    if flag in RESERVED_FLAGS:
        raise BenchbotError(
            f"{flag} is set by benchbot from the host config; it cannot be given on the command line"
        )


def check_preset_words(config: Config, words: Sequence[str]) -> tuple[str, ...]:
    """Validate a set of preset words: known, no duplicates, one per group, conflicts, requirements."""
    seen: dict[str, str] = {}
    for word in words:
        if word not in config.presets:
            known = ", ".join(sorted(config.presets)) or "none are configured"
            raise BenchbotError(f'unknown preset "{word}"{suggest(word, config.presets)}. Presets: {known}')
        if word in seen.values():
            raise BenchbotError(f'preset "{word}" is given twice')
        group = config.presets[word].group
        if group:
            if group in seen:
                raise BenchbotError(
                    f'"{seen[group]}" and "{word}" are both {group} presets: choose one of them'
                )
            seen[group] = word
        else:
            seen[f"\0{word}"] = word
    chosen = set(words)
    for word in words:
        preset = config.presets[word]
        for other in preset.conflicts:
            if other in chosen:
                raise BenchbotError(f'"{word}" cannot be combined with "{other}"')
        for other in preset.requires:
            if other not in chosen:
                raise BenchbotError(f'"{word}" needs "{other}" too: add it to the command')
    return tuple(words)


def merge_flags(
    base: Iterable[tuple[str, FlagValue]],
    presets: Iterable[tuple[Iterable[tuple[str, FlagValue]], Iterable[str]]],
) -> list[tuple[str, FlagValue]]:
    """Apply (adds, removes) layers in order over ``base``; a later value for a flag replaces the earlier."""
    merged: dict[str, FlagValue] = dict(base)
    for adds, removes in presets:
        for flag in removes:
            merged.pop(flag, None)
        for flag, value in adds:
            merged.pop(flag, None)  # re-insert so argv order follows the layer that set it last
            merged[flag] = value
    return list(merged.items())


def flags_to_argv(flags: Iterable[tuple[str, FlagValue]]) -> list[str]:
    """``[("--tp-size", "8"), ("--enable-metrics", True)]`` -> ``["--tp-size", "8", "--enable-metrics"]``."""
    argv: list[str] = []
    for flag, value in flags:
        argv.append(flag)
        if value is not True:
            argv.append(str(value))
    return argv


def build_launch(
    config: Config,
    host: HostConfig,
    words: Sequence[str],
    raw_flags: Sequence[tuple[str, FlagValue]] = (),
) -> LaunchSpec:
    """The engine argv and env for ``words`` + ``raw_flags`` on ``host``; BenchbotError when invalid."""
    check_preset_words(config, words)
    for flag, _ in raw_flags:
        check_raw_flag(flag)
    layers = [(config.presets[w].flags, config.presets[w].remove) for w in words]
    layers.append((tuple(raw_flags), ()))
    fixed = [("--model-path", config.engine.model), ("--host", host.bind), ("--port", str(host.port))]
    flags = merge_flags([*fixed, *config.engine.flags], layers)
    env: dict[str, str] = dict(config.engine.env)
    for word in words:
        env.update(config.presets[word].env)
    return LaunchSpec(
        host=host.name,
        presets=tuple(words),
        raw_flags=tuple(raw_flags),
        flags=tuple(flags),
        argv=(*config.engine.command, *flags_to_argv(flags)),
        env=tuple(sorted(env.items())),
    )
