"""The shared tokenizer and token helpers every command family's parser uses.

Refusing control, invisible and shell characters happens once here, before any parser sees a word,
so no command can forget it; the helpers give every family the same wording for the same mistake.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from collections.abc import Mapping

from workers.config import Config
from workers.errors import BenchbotError
from workers.presets import suggest

SHELL_METACHARACTERS = set(";|&$`<>\\")
MAX_VALUE_LENGTH = 200
KEYWORDS = {"on", "then"}
#: In a parser's ``allow``: its ``on`` may name a group of hosts (a gang job, issue 38), not only a host.
GROUP_OK = "on GROUP"


def _fail(message: str) -> BenchbotError:
    return BenchbotError(message)


def _host(word: str, config: Config, *, group_ok: bool = False) -> str:
    """A host's name; a group's where the command takes one (``group_ok``), else a refusal saying it is not yet."""
    if word in config.groups:
        if group_ok:
            return word
        members = ", ".join(config.groups[word].hosts)
        raise _fail(
            f'"{word}" is a group of hosts ({members}): /launch ... on {word} [then bench ...], /bench ... on {word}, '
            f"/eval ... on {word}, /stop {word}, /status {word} and /queue {word} work on it, but this command on a "
            "group is not built yet (issue 38); name one of its hosts"
        )
    if word not in config.hosts:
        names = [*config.hosts, *config.groups] if group_ok else list(config.hosts)
        groups = f"; groups: {', '.join(config.groups)}" if group_ok and config.groups else ""
        raise _fail(f'unknown host "{word}"{suggest(word, names)}. Hosts: {", ".join(config.hosts)}{groups}')
    return word


def _host_or_any(word: str, tokens: list[str], config: Config, allow: set[str], extras: dict[str, object]) -> bool:
    """``on HOST`` / ``any`` where the command allows them (``on GROUP`` too where ``allow`` has ``group``): taken
    into ``extras``; False for any other word."""
    if word == "on" and "on" in allow:
        if not tokens:
            raise _fail('"on" needs a host name, e.g. "on gpu-1"')
        if "host" in extras:
            raise _fail('"on HOST" is given twice')
        extras["host"] = _host(tokens.pop(0), config, group_ok=GROUP_OK in allow)
        return True
    if word == "any" and "any" in allow:
        extras["any"] = True
        return True
    return False


def _option(word: str, options: Mapping[str, str], values: Mapping[str, str], what: str) -> tuple[str, str]:
    """``key=value`` split, refused when the key is not one of ``options`` or was given before."""
    key, _, value = word.partition("=")
    if key not in options:
        raise _fail(
            f'unknown {what} "{key}="{suggest(key + "=", [k + "=" for k in options])}. '
            f"Options: {', '.join(k + '=' for k in options)}"
        )
    if key in values:
        raise _fail(f'"{key}=" is given twice')
    return key, value


def _int(value: str, what: str, lo: int, hi: int) -> int:
    if not re.fullmatch(r"[0-9]{1,9}", value):
        raise _fail(f"{what} must be a whole number from {lo} to {hi}, not {value!r}")
    number = int(value)
    if not lo <= number <= hi:
        raise _fail(f"{what} must be from {lo} to {hi}, not {number}")
    return number


def _take_levels(tokens: list[str]) -> str:
    """Pop the levels, letting ``1, 8, 32`` (spaces after commas) count as one list."""
    text = tokens.pop(0)
    while tokens and (text.endswith(",") or tokens[0].startswith(",")):
        text += tokens.pop(0)
    return text


def _no_more(tokens: list[str], command: str) -> None:
    if tokens:
        raise _fail(f'unexpected "{tokens[0]}": see /help {command}')


def _optional_host(tokens: list[str], config: Config, command: str, *, group_ok: bool = False) -> str | None:
    if tokens and tokens[0] == "on":
        tokens.pop(0)
    host = _host(tokens.pop(0), config, group_ok=group_ok) if tokens else None
    _no_more(tokens, command)
    return host


#: Unicode categories refused anywhere in a command: format characters (bidi overrides and isolates,
#: zero-width joiners and spaces), line and paragraph separators, private use and lone surrogates.
_INVISIBLE = frozenset({"Cf", "Zl", "Zp", "Co", "Cs"})


def _check_text(text: str, config: Config) -> None:
    if len(text) > config.limits.max_command_length:
        raise _fail(f"that command is longer than {config.limits.max_command_length} characters")
    for ch in text:
        if ch in "\n\r":
            raise _fail("a command is one line")
        if ord(ch) < 32 or ord(ch) == 127 or 0x80 <= ord(ch) < 0xA0:
            raise _fail("the command contains control characters")
        if unicodedata.category(ch) in _INVISIBLE:
            name = unicodedata.name(ch, "a formatting character")
            raise _fail(
                f"the command contains an invisible character, U+{ord(ch):04X} {name} (it can make a value "
                "read differently from what it is, e.g. a right-to-left override): type plain text"
            )
    bad = sorted(SHELL_METACHARACTERS.intersection(text))
    if bad:
        shown = " ".join(f"'{c}'" for c in bad)
        raise _fail(
            f"benchbot never runs shell commands: {shown} is not allowed. "
            "Give preset words and --engine-flag values only."
        )


def tokenize(text: str, config: Config) -> list[str]:
    """Split like a shell would (quotes group words) after refusing control and shell characters."""
    _check_text(text, config)
    try:
        return shlex.split(text, posix=True)
    except ValueError:
        raise _fail("unbalanced quotes in the command") from None
