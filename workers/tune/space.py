"""What ``/tune`` searches: dimensions in the team's words, every config they make, and what was pruned.

Three kinds of dimension, all resolved against the host's presets and the config's ``[tune.knobs]``:

* a preset **group** (``moe=cutlass,triton``): one categorical; a value is the preset of that group named
  so, or ``GROUP-VALUE`` (``fp4=cutlass`` means the ``fp4-cutlass`` preset);
* an **on,off** preset (``nextn=on,off``): a boolean (``on`` adds the preset);
* a declared **knob** (``max-running=64..512``): the admin's flag on the admin's step grid, within the
  admin's range; a knob nobody declared is refused, never guessed.

Every combination is checked before any launch: the presets' ``conflicts``/``requires`` (and one preset
per group) here, the option policy on each knob's flag, and (in the worker, which knows it) the host's
engine version through the recorded contract. What fails is *pruned*, with the sentence that says why.
The same module serves the bot (refusals, ``dry-run``) and the worker (the study's distributions).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from workers.config import Config, FlagValue, HostConfig
from workers.config.tune_schema import TuneKnob
from workers.errors import BenchbotError
from workers.json_value import JsonObject, JsonValue
from workers.presets import LaunchIntent, check_preset_words, suggest
from workers.reserved_flags import check_raw_flag

GROUP, SWITCH, KNOB = "group", "switch", "knob"
ON, OFF = "on", "off"
_RANGE_RE = re.compile(r"^([0-9]{1,9})\.\.([0-9]{1,9})$")
#: One trial's time when nothing measured says otherwise: launch, smoke, a knee search and a quick eval.
DEFAULT_TRIAL_S = 600.0

Params = Mapping[str, str | int]


@dataclass(frozen=True)
class Dimension:
    """One axis of the space: its word, its kind, its values (preset words, on/off, or knob values)."""

    name: str
    kind: str
    values: tuple[str | int, ...]
    flag: str | None = None  # a knob's engine flag

    def describe(self) -> str:
        if self.kind == KNOB and len(self.values) > 4:
            step = int(self.values[1]) - int(self.values[0])
            return f"{self.name}={self.values[0]}..{self.values[-1]} step {step} ({len(self.values)} values)"
        return f"{self.name}={','.join(map(str, self.values))}"

    def to_dict(self) -> JsonObject:
        return {"name": self.name, "kind": self.kind, "values": list(self.values), "flag": self.flag}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Dimension:
        values = data.get("values")
        return cls(
            name=str(data["name"]),
            kind=str(data["kind"]),
            values=tuple(v if isinstance(v, int) else str(v) for v in (values if isinstance(values, list) else ())),
            flag=None if data.get("flag") is None else str(data["flag"]),
        )


@dataclass(frozen=True)
class Pruned:
    """A combination never launched, and why (a conflict, a missing requirement, the engine version)."""

    params: Params
    reason: str

    def to_dict(self) -> JsonObject:
        return {"config": label_of(self.params), "params": dict(self.params), "reason": self.reason}


@dataclass(frozen=True)
class TuneSpace:
    """The dimensions in the order typed; ``configs()`` every combination, ``intent(params)`` one's launch."""

    dimensions: tuple[Dimension, ...]

    @property
    def size(self) -> int:
        size = 1
        for dim in self.dimensions:
            size *= len(dim.values)
        return size

    def configs(self) -> Iterator[dict[str, str | int]]:
        names = [d.name for d in self.dimensions]
        for combo in itertools.product(*(d.values for d in self.dimensions)):
            yield dict(zip(names, combo, strict=True))

    def intent(self, params: Params) -> LaunchIntent:
        """The launch a config means: the chosen group presets, the switched-on presets, the knobs' flags."""
        presets: list[str] = []
        flags: list[tuple[str, FlagValue]] = []
        for dim in self.dimensions:
            value = params[dim.name]
            if dim.kind == GROUP:
                presets.append(str(value))
            elif dim.kind == SWITCH and value == ON:
                presets.append(dim.name)
            elif dim.kind == KNOB and dim.flag is not None:
                flags.append((dim.flag, str(int(value))))
        return LaunchIntent(presets=tuple(presets), raw_flags=tuple(flags))

    def describe(self) -> str:
        return " ".join(d.describe() for d in self.dimensions)

    def to_dict(self) -> JsonObject:
        return {"dimensions": [d.to_dict() for d in self.dimensions]}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> TuneSpace:
        dims = data.get("dimensions")
        return cls(
            tuple(Dimension.from_dict(d) for d in (dims if isinstance(dims, list) else ()) if isinstance(d, Mapping))
        )


def label_of(params: Params) -> str:
    """``moe=cutlass fp4=cudnn nextn=on``: a config in the words it was searched in."""
    return " ".join(f"{k}={v}" for k, v in params.items())


def _group_preset(name: str, value: str, presets: Mapping[str, object], groups: Mapping[str, list[str]]) -> str:
    members = groups[name]
    for word in (value, f"{name}-{value}"):
        if word in members:
            return word
    raise BenchbotError(f'"{value}" is not a {name} preset{suggest(value, members)}: {name} takes {", ".join(members)}')


def _knob_values(knob: TuneKnob, text: str) -> tuple[int, ...]:
    match = _RANGE_RE.match(text)
    if match:
        low, high = int(match.group(1)), int(match.group(2))
        if high <= low:
            raise BenchbotError(
                f"{knob.name}={text}: a range goes from low to high, e.g. {knob.name}={knob.low}..{knob.high}"
            )
        values: tuple[int, ...] = ()
        if low >= knob.low and high <= knob.high:
            values = knob.points(low, high)
    else:
        parts = text.split(",")
        if not all(p.isdigit() for p in parts):
            raise BenchbotError(
                f'{knob.name}="{text}": give numbers, e.g. {knob.name}={knob.low}..{knob.high} or 64,128'
            )
        values = tuple(dict.fromkeys(int(p) for p in parts))
        low, high = min(values), max(values)
        off_grid = [v for v in values if (v - knob.low) % knob.step]
        if off_grid:
            raise BenchbotError(f"{knob.name}={off_grid[0]} is off its step of {knob.step} (from {knob.low})")
    if low < knob.low or high > knob.high:
        raise BenchbotError(
            f"{knob.name}={text} is outside the range an admin declared for it: {knob.low}..{knob.high}"
        )
    if not values:
        raise BenchbotError(f"{knob.name}={text} holds no value on its step of {knob.step}")
    return values


def parse_space(
    words: Sequence[tuple[str, str]], config: Config, host: HostConfig, *, admin: bool = False
) -> TuneSpace:
    """``[("moe", "cutlass,triton"), ("nextn", "on,off"), ...]`` on ``host`` -> the space; BenchbotError naming
    the word to fix for an unknown name or value, an undeclared knob, a value outside its range, a
    flag the option policy keeps from this person, or a space too big to search."""
    if not words:
        raise BenchbotError(
            "name what to search before slo, e.g. /tune moe=cutlass,triton nextn=on,off slo ttft=2s itl=40ms"
        )
    presets = config.presets_for(host.engine.preset_set)
    groups: dict[str, list[str]] = {}
    for word, preset in presets.items():
        if preset.group:
            groups.setdefault(preset.group, []).append(word)
    knobs = {name: k for name, k in config.tune.knobs.items() if k.engine in (None, host.engine.kind)}
    dims: list[Dimension] = []
    for name, text in words:
        if name in (d.name for d in dims):
            raise BenchbotError(f"{name}= is given twice: list its values once, separated by commas")
        if not text:
            raise BenchbotError(f"{name}= needs values, e.g. {name}=a,b")
        if name in groups:
            values = tuple(dict.fromkeys(_group_preset(name, v, presets, groups) for v in text.split(",")))
            dims.append(Dimension(name, GROUP, values))
        elif name in knobs:
            knob = knobs[name]
            check_raw_flag(knob.flag, str(knob.low), admin=admin, engine=host.engine.kind)
            dims.append(Dimension(name, KNOB, _knob_values(knob, text), flag=knob.flag))
        elif name in presets:
            values = tuple(dict.fromkeys(text.split(",")))
            if not set(values) <= {ON, OFF}:
                raise BenchbotError(f"{name}={text}: a preset is switched, {name}=on,off (or on, or off)")
            dims.append(Dimension(name, SWITCH, values))
        else:
            known = sorted({*groups, *knobs, *(w for w, p in presets.items() if not p.group)})
            raise BenchbotError(
                f'"{name}" is not a preset group, an on/off preset or a knob an admin declared in [tune.knobs]'
                f"{suggest(name, known)}: /tune searches {', '.join(known) or 'nothing on this host'}"
            )
    space = TuneSpace(tuple(dims))
    if space.size > config.tune.max_configs:
        raise BenchbotError(
            f"that space holds {space.size:,} configs, more than this team's limit of {config.tune.max_configs}: "
            "narrow a range or take fewer values"
        )
    if space.size < 2:
        raise BenchbotError("that space holds one config: give a dimension two values or more (or /launch it)")
    return space


def prune(space: TuneSpace, config: Config, host: HostConfig) -> tuple[list[dict[str, str | int]], list[Pruned]]:
    """Every config of ``space`` that the presets allow on ``host``, and each one they do not, with why."""
    kept: list[dict[str, str | int]] = []
    pruned: list[Pruned] = []
    for params in space.configs():
        intent = space.intent(params)
        try:
            check_preset_words(config, intent.presets, kind=host.engine.preset_set)
        except BenchbotError as exc:
            pruned.append(Pruned(params, str(exc)))
            continue
        kept.append(params)
    return kept, pruned


def estimate_text(trials: int, seconds_per_trial: float = DEFAULT_TRIAL_S) -> str:
    """``about 1 h 10 min (7 trials at ~10 min each, plus the confirmation of the best)``."""
    confirm = min(3, trials)
    total = (trials + confirm) * seconds_per_trial
    hours, minutes = divmod(round(total / 60), 60)
    span = f"{hours} h {minutes} min" if hours else f"{minutes} min"
    return f"about {span} ({trials} trials at ~{seconds_per_trial / 60:.0f} min each, then {confirm} confirmed)"


def params_from(data: object) -> dict[str, str | int]:
    """A config's params from JSON (knob values stay whole numbers)."""
    if not isinstance(data, Mapping):
        return {}
    return {str(k): v if isinstance(v, int) else str(v) for k, v in data.items()}


def params_json(params: Params) -> dict[str, JsonValue]:
    return {k: v for k, v in params.items()}
