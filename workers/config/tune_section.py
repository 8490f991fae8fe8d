"""``[tune]``: the numeric engine knobs an admin lets ``/tune`` search, and the space's size limit.

A member's ``/tune`` names presets (the team's words) and, for numbers, only a knob declared here: the
admin decides which engine flag a word drives, its type, range and step, so a search can never set a flag
the option policy keeps for admins, nor wander over a range nobody meant (docs: README, ``/help tune``).

    [tune]
    max_configs = 512
    [tune.knobs.max-running]
    flag = "--max-running-requests"
    range = [8, 512]
    step = 8
    engine = "sglang"
"""

from __future__ import annotations

from workers.config.checks import _Checks
from workers.config.schema import FLAG_RE
from workers.config.tune_schema import DEFAULT_MAX_CONFIGS, KNOB_NAME_RE, KNOB_TYPES, TuneConfig, TuneKnob


def tune_section(checks: _Checks, t: dict[str, object]) -> TuneConfig:
    """Validate ``[tune]``: each knob's flag, type, ``range = [LO, HI]`` and ``step``."""
    checks.only(t, "tune", {"knobs", "max_configs"})
    max_configs = checks.integer(t.get("max_configs", DEFAULT_MAX_CONFIGS), "tune.max_configs", 1, 100_000)
    knobs: dict[str, TuneKnob] = {}
    for name, value in checks.table(t.get("knobs"), "tune.knobs").items():
        key = f"tune.knobs.{name}"
        if not KNOB_NAME_RE.match(name):
            raise checks.fail(key, "a knob's name is lower-case letters, digits and '-', e.g. max-running")
        knob = checks.table(value, key)
        checks.only(knob, key, {"flag", "type", "range", "step", "engine", "description"})
        flag = checks.string(knob.get("flag"), f"{key}.flag", pattern=FLAG_RE)
        kind = checks.string(knob.get("type", "int"), f"{key}.type")
        if kind not in KNOB_TYPES:
            raise checks.fail(f"{key}.type", f"{kind!r} is not a knob type ({', '.join(KNOB_TYPES)})")
        bounds = knob.get("range")
        if not isinstance(bounds, list) or len(bounds) != 2:
            raise checks.fail(f"{key}.range", "give the range as [LOW, HIGH], e.g. range = [8, 512]")
        low = checks.integer(bounds[0], f"{key}.range", 0, 10**9)
        high = checks.integer(bounds[1], f"{key}.range", low, 10**9)
        step = checks.integer(knob.get("step", 1), f"{key}.step", 1, 10**9)
        engine = checks.string(knob["engine"], f"{key}.engine") if "engine" in knob else None
        description = checks.string(knob["description"], f"{key}.description") if "description" in knob else ""
        knobs[name] = TuneKnob(name, flag, low, high, step, kind, engine, description)
    return TuneConfig(knobs=knobs, max_configs=max_configs)
