"""Preset words -> the engine's argv and env: groups, removals, conflicts and requirements.

The argv is always built as a list (engine command + model + base flags + presets + raw flags) so no
part of it is ever interpreted by a shell; the SSH transport quotes each part separately.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from workers.config import Config, FlagValue, HostConfig, Preset
from workers.engines import registry
from workers.engines.contract import Contract, version_matches
from workers.engines.registry import DEFAULT_KIND, display_name, driver_for
from workers.errors import BenchbotError
from workers.reserved_flags import check_raw_flag, check_reserved_flag, raw_flag_problems

__all__ = [
    "LaunchIntent",
    "LaunchSpec",
    "build_launch",
    "check_launch",
    "check_preset_words",
    "check_raw_flag",
    "check_reserved_flag",
    "flags_to_argv",
    "merge_flags",
    "preset_layers",
    "suggest",
]


@dataclass(frozen=True)
class LaunchIntent:
    """What a person asked to launch: preset words and raw flags. This is what a job carries.

    The argv is compiled by the worker (:func:`build_launch`) with *its* config and the version of the
    engine the host really runs, so the port it waits on is the port the engine listens on and each
    preset emits what that version accepts.
    """

    presets: tuple[str, ...]
    raw_flags: tuple[tuple[str, FlagValue], ...] = ()

    @property
    def label(self) -> str:
        """The words a person would use for this config: presets then raw flags."""
        parts = list(self.presets)
        for flag, value in self.raw_flags:
            parts.append(flag if value is True else f"{flag} {value}")
        return " ".join(parts) or "base"

    def to_dict(self) -> dict:
        """JSON shape carried in job payloads (schema 2: intent only)."""
        return {
            "schema": 2,
            "presets": list(self.presets),
            "raw_flags": [[f, v] for f, v in self.raw_flags],
            "label": self.label,
        }

    @classmethod
    def from_dict(cls, data: dict) -> LaunchIntent:
        """Inverse of :meth:`to_dict`; also reads the schema-1 payloads that carried a whole LaunchSpec."""
        return cls(presets=tuple(data["presets"]), raw_flags=tuple((f, v) for f, v in data["raw_flags"]))


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start the engine, and what we asked for (to diff against what runs)."""

    host: str
    presets: tuple[str, ...]
    raw_flags: tuple[tuple[str, FlagValue], ...]
    flags: tuple[tuple[str, FlagValue], ...]  # the merged flags, in argv order (port and model included)
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # preset/engine env only; secrets are added by the worker at spawn

    version: str | None = None  # the engine version it was compiled for (None: base presets)
    #: Settings the engine takes from a file only (its folder's ``settings_file``): their flags are in
    #: ``flags`` (checked, requested, diffed like any) but not in ``argv``; this is the file's document.
    settings: Mapping[str, object] = field(default_factory=dict, hash=False)

    @property
    def intent(self) -> LaunchIntent:
        """What was asked for, without what the worker compiled from it."""
        return LaunchIntent(self.presets, self.raw_flags)

    @property
    def label(self) -> str:
        """The words a person would use for this config: presets then raw flags."""
        return self.intent.label

    def to_dict(self) -> dict:
        """JSON shape in ready events and results (schema 1)."""
        return {
            "schema": 1,
            "host": self.host,
            "presets": list(self.presets),
            "raw_flags": [[f, v] for f, v in self.raw_flags],
            "flags": [[f, v] for f, v in self.flags],
            "argv": list(self.argv),
            "env": dict(self.env),
            "label": self.label,
            "version": self.version,
            "settings": dict(self.settings),
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
            version=data.get("version"),
            settings=dict(data.get("settings") or {}),
        )


def suggest(word: str, choices: Iterable[str]) -> str:
    """' (did you mean "x"?)' when a close match exists, else ''."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


def check_preset_words(
    config: Config, words: Sequence[str], *, kind: str | None = DEFAULT_KIND, host: str | None = None
) -> tuple[str, ...]:
    """Validate a set of preset words: known, no duplicates, one per group, conflicts, requirements.

    ``kind`` is the host's engine (its presets are in its own words); None accepts any engine's word, for
    the grammar, which reads the words before it knows the host. ``host`` names the host in messages.
    """
    presets = config.presets_for(kind)
    seen: dict[str, str] = {}
    for word in words:
        if word not in presets:
            known = ", ".join(sorted(presets)) or "none are configured"
            where = ""
            if host is not None and kind is not None:
                where = f" on {host} ({display_name(kind)})"
            raise BenchbotError(f'unknown preset "{word}"{where}{suggest(word, presets)}. Presets: {known}')
        if word in seen.values():
            raise BenchbotError(f'preset "{word}" is given twice')
        group = presets[word].group
        if group:
            if group in seen:
                raise BenchbotError(f'"{seen[group]}" and "{word}" are both {group} presets: choose one of them')
            seen[group] = word
        else:
            seen[f"\0{word}"] = word
    chosen = set(words)
    for word in words:
        preset = presets[word]
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
    key: Callable[[str], str] = lambda flag: flag,
) -> list[tuple[str, FlagValue]]:
    """Apply (adds, removes) layers in order over ``base``; a later value for a flag replaces the earlier.

    ``key`` says which spellings are one option: :func:`build_launch` passes the engine's own mapping,
    so ``--tp 4`` replaces the base ``--tp-size 8`` instead of following it on the command line.
    """
    merged: dict[str, tuple[str, FlagValue]] = {key(flag): (flag, value) for flag, value in base}
    for adds, removes in presets:
        for flag in removes:
            merged.pop(key(flag), None)
        for flag, value in adds:
            merged.pop(key(flag), None)  # re-insert so argv order follows the layer that set it last
            merged[key(flag)] = (flag, value)
    return list(merged.values())


def flags_to_argv(flags: Iterable[tuple[str, FlagValue]]) -> list[str]:
    """``[("--tp-size", "8"), ("--enable-metrics", True)]`` -> ``["--tp-size", "8", "--enable-metrics"]``."""
    argv: list[str] = []
    for flag, value in flags:
        argv.append(flag)
        if value is not True:
            argv.append(str(value))
    return argv


#: One layer of flags over the base: (flags it adds or replaces, flags it removes).
Layer = tuple[tuple[tuple[str, FlagValue], ...], tuple[str, ...]]


def preset_layers(preset: Preset, version: str | None) -> list[Layer]:
    """The preset's (adds, removes) layer, then one per ``versions`` block that matches ``version``."""
    layers: list[Layer] = [(preset.flags, preset.remove)]
    if version is not None:
        layers += [(v.flags, v.remove) for v in preset.versions if version_matches(v.spec, version)]
    return layers


def preset_env(preset: Preset, version: str | None) -> dict[str, str]:
    """The preset's env, with the env of each ``versions`` block that matches ``version`` over it."""
    env = dict(preset.env)
    if version is not None:
        for block in preset.versions:
            if version_matches(block.spec, version):
                env.update(block.env)
    return env


def build_launch(
    config: Config,
    host: HostConfig,
    words: Sequence[str],
    raw_flags: Sequence[tuple[str, FlagValue]] = (),
    version: str | None = None,
) -> LaunchSpec:
    """The engine argv and env for ``words`` + ``raw_flags`` on ``host``; BenchbotError when invalid.

    The command, model, base flags and env are ``host.engine``'s; the presets are ``config``'s for that
    engine (the default engine's ``[presets]``, another's ``[engines.SET.presets]``), and the engine's driver says which
    flags benchbot fixes (where it listens), where the model goes and which spellings are one option. An engine
    that takes some settings from a file only (its ``settings_file``) gets those in ``settings``, not on argv.

    ``version`` is the host's engine version when known: each preset's ``versions`` blocks that match it
    apply over the preset (the worker builds with it; without it, the base presets). Raw flags that are
    reserved in any recorded version of the host's engine are refused here; admin-only ones are the
    dispatcher's to allow or refuse, since it knows who asked (:func:`workers.reserved_flags.check_raw_flag`;
    which options a member may give is ``workers/engines/option_policy.toml``).
    """
    engine = host.engine  # this host's engine: the default with the host's own keys over it
    driver = driver_for(engine.kind)
    mixed = len({h.engine.preset_set for h in config.hosts.values()}) > 1  # then a message says whose words
    check_preset_words(config, words, kind=engine.preset_set, host=host.name if mixed else None)
    presets = config.presets_for(engine.preset_set)
    for flag, value in raw_flags:
        check_raw_flag(flag, value, admin=True, engine=engine.kind)  # reserved in any version of this engine
    layers = [layer for w in words for layer in preset_layers(presets[w], version)]
    layers.append((tuple(raw_flags), ()))
    fixed = driver.fixed_flags(engine.model, host.bind, host.port)
    flags = merge_flags([*fixed, *engine.flags], layers, key=driver.flag_key)
    env: dict[str, str] = dict(engine.env)
    for word in words:
        env.update(preset_env(presets[word], version))
    settings_file = registry.engine(engine.kind).settings_file
    argv_flags, settings = settings_file.split(flags, version) if settings_file is not None else (flags, {})
    return LaunchSpec(
        host=host.name,
        presets=tuple(words),
        raw_flags=tuple(raw_flags),
        flags=tuple(flags),
        argv=(*engine.command, *driver.positionals(engine.model), *flags_to_argv(argv_flags)),
        env=tuple(sorted(env.items())),
        version=version,
        settings=settings,
    )


def check_launch(
    spec: LaunchSpec, contract: Contract, *, admin: bool = True, ignore: Callable[[str], bool] = lambda flag: False
) -> list[str]:
    """Everything ``contract``'s engine would refuse in ``spec``, as sentences naming the version and the
    nearest real flag; empty when it would accept the launch. The worker calls it before spawning, so a
    flag the host's engine lacks fails in a second instead of after minutes of loading weights.
    ``admin`` says whether the requester may give admin-only flags; ``ignore(flag)`` skips flags that
    are not the engine's (the simulator's own ``--sim-*``)."""
    problems = [p.message for p in contract.check_flags((f, v) for f, v in spec.flags if not ignore(f))]
    problems += raw_flag_problems([(f, v) for f, v in spec.raw_flags if not ignore(f)], contract, admin=admin)
    given = {contract.server_arg(flag) for flag, _ in spec.flags}
    for option in contract.options:
        if option.required and contract.server_arg(option.name) not in given:
            problems.append(f"{contract.label()} needs {option.name}")
    return [problem if problem.endswith(".") else f"{problem}." for problem in dict.fromkeys(problems)]
