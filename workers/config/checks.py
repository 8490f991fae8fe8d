"""The validator's primitive checks (a table, a string, a number, flags, env), each naming the key.

Shared by every section's validation in :mod:`workers.config.validate`, so a wrong type reads the same
whichever section it is in.
"""

from __future__ import annotations

import re
from collections.abc import Set
from typing import Any

from workers.config.schema import (
    ENV_NAME_RE,
    FLAG_RE,
    FlagValue,
)
from workers.errors import ConfigError
from workers.jobs.fence_check import default_margin_s

#: A TOML table as tomllib returns it, before validation: the one place the config is untyped
#: (issue 24's allowed edge); everything after validation is a frozen dataclass from ``schema``.
RawTable = dict[str, Any]


class _Checks:
    """Turns parsed TOML values into typed ones, collecting the key path for every message."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.source}: {key}: {problem}")

    # -- primitive checks
    def table(self, value: Any, key: str) -> RawTable:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a table, got {type(value).__name__}")
        return value

    def only(self, table: RawTable, key: str, allowed: Set[str]) -> None:
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise self.fail(
                f"{key}.{unknown[0]}" if key else unknown[0], f"unknown key (allowed: {', '.join(sorted(allowed))})"
            )

    def string(self, value: Any, key: str, *, pattern: re.Pattern[str] | None = None) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(key, "expected a non-empty string")
        if pattern and not pattern.match(value):
            raise self.fail(key, f"{value!r} is not valid here")
        if any(ord(c) < 32 for c in value):
            raise self.fail(key, "contains control characters")
        return value

    def integer(self, value: Any, key: str, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {value!r}")
        if not lo <= value <= hi:
            raise self.fail(key, f"{value} is out of range {lo}..{hi}")
        return value

    def number(self, value: Any, key: str, lo: float, hi: float) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"expected a number, got {value!r}")
        if not lo <= value <= hi:
            raise self.fail(key, f"{value} is out of range {lo}..{hi}")
        return float(value)

    def lease_margin(self, t: RawTable, ttl: float) -> float:
        """Above 0 and at most a third of the TTL: the heartbeat renews every TTL/3, so a larger margin
        would refuse a healthy holder between two renewals."""
        if "lease_margin_s" not in t:
            return default_margin_s(ttl)
        value = t["lease_margin_s"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail("limits.lease_margin_s", f"expected a number, got {value!r}")
        if not 0 < value <= ttl / 3:
            raise self.fail(
                "limits.lease_margin_s",
                f"{value} must be above 0 and at most a third of limits.lease_ttl_s ({ttl:g} s / 3 = {ttl / 3:g} s)",
            )
        return float(value)

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {value!r}")
        return value

    def strings(self, value: Any, key: str, *, pattern: re.Pattern[str] | None = None) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.fail(key, "expected a list of strings")
        return tuple(self.string(v, f"{key}[{i}]", pattern=pattern) for i, v in enumerate(value))

    def env(self, value: Any, key: str) -> dict[str, str]:
        table = self.table(value, key)
        out: dict[str, str] = {}
        for name, val in table.items():
            if not ENV_NAME_RE.match(name):
                raise self.fail(f"{key}.{name}", "not a valid environment variable name")
            if isinstance(val, bool):
                val = "1" if val else "0"
            if isinstance(val, int | float):
                val = str(val)
            if not isinstance(val, str) or any(ord(c) < 32 for c in val):
                raise self.fail(f"{key}.{name}", "expected a string without control characters")
            out[name] = val
        return out

    def flags(self, value: Any, key: str) -> tuple[tuple[str, FlagValue], ...]:
        table = self.table(value, key)
        out: list[tuple[str, FlagValue]] = []
        for flag, val in table.items():
            fkey = f'{key}."{flag}"'
            if not FLAG_RE.match(flag):
                raise self.fail(fkey, "engine flags look like --lower-case-words")
            if val is True:
                out.append((flag, True))
            elif val is False:
                raise self.fail(fkey, "use true for a bare flag; to drop a base flag use remove = [...]")
            elif isinstance(val, int | float):
                out.append((flag, str(val)))
            elif isinstance(val, str) and val and not any(ord(c) < 32 for c in val):
                out.append((flag, val))
            else:
                raise self.fail(fkey, "expected a string, a number or true")
        return tuple(out)

    # -- sections
