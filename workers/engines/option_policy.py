"""Which engine options a person may give, by what each option does: member, admin-only or reserved.

A reserved list of "dangerous" names let every option nobody had thought of through (issue 25: vLLM's
``--worker-cls``, ``--scheduler-cls``, ``--middleware``, a ``--speculative-config`` naming another
model, ``--chat-template /etc/shadow``). So the policy is an allow-list instead: ``option_policy.toml``
puts every option of every recorded contract, by its argparse dest, in exactly one of ``member``,
``admin.<why>`` or ``reserved.<why>``, per engine; tests/test_option_policy.py fails when a recorded
contract has an option in none of them, so a new engine release forces a decision. An option the
policy does not list (a contract dumped from a host at run time) is admin-only: fail closed.

JSON-valued member options are judged by their top-level keys (``[engine.json.dest]``), and a few
member options only with listed values (``[engine.values]``). This module only classifies; resolving
a typed flag to its option (prefixes, aliases) and wording the refusal is :mod:`workers.reserved_flags`.
"""

from __future__ import annotations

import functools
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from workers.engines.contract import Contract

POLICY_PATH = Path(__file__).resolve().parent / "option_policy.toml"


class Level(Enum):
    """Who may give an option on a command line."""

    MEMBER = "member"  # anyone on the access list
    ADMIN = "admin"  # an admin (and benchbot.toml)
    RESERVED = "reserved"  # nobody: benchbot sets it from the host config


#: Why an option is admin-only or reserved, as a message says it (the option's name comes first).
REASONS: Mapping[str, str] = {
    "listen": "changes where or how the server listens",
    "secret": "carries a key, a certificate or a token",
    "config": "reads more options from a file, past these checks",
    "model": "names another model, tokenizer or adapter, or where and how weights load",
    "path": "names a file or directory on the host",
    "module": "names Python code (a module or plugin) for the engine to import",
    "class": "names a class for the engine to load",
    "url": "names an address or URL the engine connects or sends data to",
    "trust": "changes what the engine trusts or lets its clients do",
    "unlisted": "is not on the list of options a member may set",
}


@dataclass(frozen=True)
class Verdict:
    """Who may give one option (or one value of it), and why not everyone."""

    level: Level
    reason: str = ""  # a key of REASONS; empty for MEMBER
    detail: str = ""  # what in the value decided it: 'key "model"', 'value "my.Executor"'
    allowed: str = ""  # for an unlisted key or value: what a member may give instead, in words

    @property
    def why(self) -> str:
        """The reason as words: ``names a file or directory on the host``."""
        return REASONS.get(self.reason, self.reason)


MEMBER = Verdict(Level.MEMBER)


def _shown(names: frozenset[str], most: int = 8) -> str:
    """``a, b, c, ...``: the first ``most`` names, sorted."""
    ordered = sorted(names)
    return ", ".join(ordered[:most]) + (", ..." if len(ordered) > most else "")


@dataclass(frozen=True)
class JsonRule:
    """A JSON-valued member option: which top-level keys a member may set; the others, and why not."""

    member_keys: frozenset[str]
    admin_keys: Mapping[str, str] = field(default_factory=dict)  # key -> reason
    scalar: bool = False  # a bare number is accepted (vLLM's ``--compilation-config 3``)

    def judge(self, value: str) -> Verdict:
        """The strictest verdict over the keys of ``value`` (a JSON object)."""
        try:
            parsed: Any = json.loads(value)
        except (ValueError, RecursionError):
            parsed = None
        if self.scalar and isinstance(parsed, (int, float)) and not isinstance(parsed, bool):
            return MEMBER
        allowed = f"a JSON object with the keys {_shown(self.member_keys)}"
        if not isinstance(parsed, dict):
            return Verdict(Level.ADMIN, "unlisted", "a value that is not a JSON object", allowed)
        for key in parsed:
            if key in self.admin_keys:
                return Verdict(Level.ADMIN, self.admin_keys[key], f'key "{key}"')
            if key not in self.member_keys:
                return Verdict(Level.ADMIN, "unlisted", f'key "{key}"', allowed)
        return MEMBER


@dataclass(frozen=True)
class EnginePolicy:
    """One engine's classification of its options (``option_policy.toml``, one table per engine)."""

    engine: str
    levels: Mapping[str, Verdict]  # dest -> verdict for the option as a whole
    json_rules: Mapping[str, JsonRule] = field(default_factory=dict)
    values: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def classified(self, dest: str) -> bool:
        """True when the policy has decided about ``dest`` (the coverage test's question)."""
        return dest in self.levels

    def judge(self, dest: str, value: Any = True, key: str | None = None) -> Verdict:
        """The verdict for ``dest`` given ``value`` (True: bare). ``key``: vLLM's dotted form
        ``--speculative-config.model X`` sets one key of a JSON option."""
        verdict = self.levels.get(dest, Verdict(Level.ADMIN, "unlisted"))
        if verdict.level is not Level.MEMBER:
            return verdict
        rule = self.json_rules.get(dest)
        if rule is not None:
            if key is not None:
                return rule.judge(json.dumps({key: None}))
            if isinstance(value, str):
                return rule.judge(value)
        allowed = self.values.get(dest)
        if allowed is not None and value is not True and str(value) not in allowed:
            return Verdict(Level.ADMIN, "unlisted", f'value "{value}"', f"one of {_shown(allowed)}")
        return verdict

    def unclassified(self, contract: Contract) -> list[str]:
        """``contract``'s options (by dest) this policy has not decided about."""
        return sorted({o.dest for o in contract.options if o.action != "help" and not self.classified(o.dest)})


def _verdicts(table: Mapping[str, Any], level: Level) -> dict[str, Verdict]:
    out: dict[str, Verdict] = {}
    for reason, names in table.items():
        if reason not in REASONS:
            raise ValueError(f"{POLICY_PATH.name}: unknown reason {reason!r} under {level.value}")
        for name in names:
            out[name] = Verdict(level, reason)
    return out


def _engine_policy(engine: str, table: Mapping[str, Any]) -> EnginePolicy:
    """One engine's table, checked: every option in one list only."""
    levels: dict[str, Verdict] = {name: MEMBER for name in table.get("member", ())}
    for level in (Level.ADMIN, Level.RESERVED):
        for name, verdict in _verdicts(table.get(level.value, {}), level).items():
            if name in levels:
                raise ValueError(f"{POLICY_PATH.name}: {engine} option {name!r} is listed twice")
            levels[name] = verdict
    json_rules: dict[str, JsonRule] = {}
    for dest, rule in (table.get("json") or {}).items():
        admin_keys = {key: reason for reason in REASONS for key in rule.get(reason, ())}
        json_rules[dest] = JsonRule(frozenset(rule.get("member", ())), admin_keys, bool(rule.get("scalar", False)))
    values = {dest: frozenset(str(v) for v in allowed) for dest, allowed in (table.get("values") or {}).items()}
    for dest in (*json_rules, *values):
        if levels.get(dest) != MEMBER:
            raise ValueError(f"{POLICY_PATH.name}: {engine} {dest!r} has key or value rules but is not a member option")
    return EnginePolicy(engine, levels, json_rules, values)


@functools.lru_cache(maxsize=1)
def _all() -> dict[str, EnginePolicy]:
    data = tomllib.loads(POLICY_PATH.read_text(encoding="utf-8"))
    return {engine: _engine_policy(engine, table) for engine, table in data.items()}


def policy(engine: str) -> EnginePolicy:
    """The policy of ``engine`` (``sglang``, ``vllm``); an engine without one classifies nothing
    (every option admin-only)."""
    return _all().get(engine) or EnginePolicy(engine, {})


def engines() -> list[str]:
    """The engines the policy file classifies."""
    return sorted(_all())
