"""The secret policy: which names hold secrets, how their values are hidden, and the marker shown instead.

One rulebook for every place a secret could leak: observed server args and argv
(:mod:`workers.observe_port`), error messages (:func:`workers.host.command_text.describe_argv`), diagnoses and
log tails, run records (:mod:`workers.results.store`), Slack posts (:mod:`bot.notifier`) and the engine's
own log. That last one is written on the host by the actuator's scrubber, which runs with the stdlib only
and cannot import this module: each spawn request carries :data:`LOG_PATTERNS` and :data:`REDACTED`, and the
scrubber hides a match the way :func:`redact_text` does (``tests/test_secrets.py`` runs it against this
module, so the two cannot drift).

A pattern hides its group ``val`` and keeps the rest of the match (``api_key=`` of ``api_key='sk-1'``);
a value that is empty, ``None`` or ``null`` is not a secret and is kept, and quotes around a value stay.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: What a hidden value reads as, everywhere (records, Slack, logs, error messages).
REDACTED = "REDACTED"

#: Words that make a name secret wherever they appear in it (``admin_api_key``, ``ssl_keyfile_password``,
#: ``SLACK_SIGNING_SECRET``).
_ANYWHERE_WORDS = (
    r"api[-_]?key",
    r"secret",
    r"passw(?:or)?d",
    r"credential",
    r"private[-_]key",
    r"access[-_]key",
    r"authorization",
)
#: Words that make a name secret only as its last word: ``hf_token`` and ``token`` are secrets,
#: ``max_new_tokens``, ``tokenizer_path`` and ``bypass_cache`` are not.
_LAST_WORDS = ("token", "pass", "bearer", "cookie")

#: A name (dict key, server arg, env variable, ``--flag``) whose value is a secret. Case-insensitive and
#: usable on raw names: ``--api-key``, ``api_key``, ``HF_TOKEN``.
SECRET_KEY_RE = re.compile("(?i)" + "|".join(_ANYWHERE_WORDS) + r"|(?:^|[-_])(?:" + "|".join(_LAST_WORDS) + r")$")


def is_secret_name(name: str) -> bool:
    """True for names like ``api_key``, ``--api-key``, ``HF_TOKEN``, ``admin_api_key``, ``password``.

    Word-anchored where it matters, so metric names such as ``output_tokens`` are not mistaken for secrets.
    """
    text = str(name).strip()
    return bool(text) and bool(SECRET_KEY_RE.search(text))


# ------------------------------------------------------------------------------------------ free text

#: In free text, the words that make ``name=value`` / ``name: value`` a secret assignment. Narrower than
#: :data:`SECRET_KEY_RE` on purpose: ``Authorization: Bearer x`` is the bearer rule's (hiding "Bearer"
#: would leave x), and bare ``token``/``pass`` in prose would hide ordinary words.
_TEXT_KEY_WORDS = tuple(w for w in _ANYWHERE_WORDS if w != "authorization")

#: ``api_key='sk-1'``, ``hf_token: x`` (SGLang logs its ``ServerArgs`` at start-up, the key included).
_ASSIGN = (
    r"(?i)(?P<key>\b\w*(?:" + "|".join((*_TEXT_KEY_WORDS, "_token")) + r")\b)"
    r"(?P<sep>['\"]?\s*[=:]\s*)"
    r"(?P<val>'[^']*'|\"[^\"]*\"|[^\s,)'\"]+)"
)
#: ``--api-key K``, ``--hf-token=K`` on a command line that was logged or printed.
_FLAG = r"(?i)(?P<key>--[\w-]*(?:" + "|".join((*_TEXT_KEY_WORDS, "token")) + r")(?:\s+|=))(?P<val>\S+)"
#: ``Authorization: Bearer K``.
_BEARER = r"(?i)(?P<key>\bbearer\s+)(?P<val>[A-Za-z0-9._~+/=-]+)"
#: Well-known token shapes, wherever they appear (a log tail that printed one).
_TOKEN_SHAPES = (
    r"(?P<val>\bxox[abposr]-[A-Za-z0-9-]{6,})",  # Slack bot/user tokens
    r"(?P<val>\bxapp-[A-Za-z0-9-]{6,})",  # Slack app tokens
    r"(?P<val>\bsk-[A-Za-z0-9_-]{16,})",  # OpenAI-style keys
    r"(?P<val>\bhf_[A-Za-z0-9]{16,})",  # Hugging Face tokens
    r"(?P<val>\bgh[pousr]_[A-Za-z0-9]{16,})",  # GitHub tokens
)

#: The free-text rules as regex sources, in the order they apply; the host-side log scrubber gets them
#: with each spawn (stdlib ``re``, Python 3.8: inline flags only, every pattern has a ``val`` group).
LOG_PATTERNS: tuple[str, ...] = (_ASSIGN, _FLAG, _BEARER, *_TOKEN_SHAPES)
_TEXT_RES = tuple(re.compile(p) for p in LOG_PATTERNS)

#: Values that are not secrets even under a secret name (``api_key=None`` in a logged ServerArgs).
_NOT_A_VALUE = ("", "None", "null")


def _hide(m: re.Match[str]) -> str:
    """Replace group ``val`` of a match by the marker, keeping its quotes and the rest of the match."""
    a, b = m.span("val")
    value = m.group("val") or ""
    if a < 0 or value.strip("'\"") in _NOT_A_VALUE:
        return m.group(0)
    quote = value[0] if value[0] in "'\"" else ""
    return m.string[m.start() : a] + quote + REDACTED + quote + m.string[b : m.end()]


def _known_values(known: Iterable[str]) -> list[str]:
    return sorted({str(v) for v in known if v}, key=len, reverse=True)


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """Hide secrets in free text (log lines, command lines, messages): the literal ``known`` values first
    (longest first), then every rule of :data:`LOG_PATTERNS`."""
    for value in _known_values(known):
        text = text.replace(value, REDACTED)
    for pattern in _TEXT_RES:
        text = pattern.sub(_hide, text)
    return text


# ----------------------------------------------------------------------------------------------- argv


def redact_argv(
    argv: Iterable[Any],
    *,
    is_secret_flag: Callable[[str], bool] = is_secret_name,
    known: Iterable[str] = (),
) -> list[Any]:
    """argv with the value of a secret flag hidden (``--api-key K``, ``--api-key=K``), other words as text.

    ``is_secret_flag`` decides on the flag's name (an engine passes one that also knows the abbreviations
    its parser accepts). A flag followed by another ``--flag`` has no value to hide; non-strings are
    redacted like any value (argv-like lists nest in records).
    """
    known = _known_values(known)
    out: list[Any] = []
    hide_next = False
    for item in argv:
        if hide_next and isinstance(item, str) and not item.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        if isinstance(item, str) and item.startswith("-") and len(item) > 1:
            flag, eq, value = item.partition("=")
            if is_secret_flag(flag):
                if not eq:
                    hide_next = True
                out.append(f"{flag}={REDACTED}" if value else item)
                continue
        out.append(redact(item, known))
    return out


# ------------------------------------------------------------------------------------------- any value


def redact(value: Any, known: Iterable[str] = ()) -> Any:
    """A deep copy of ``value`` with secrets hidden.

    Mappings: the value under a secret name (any depth) unless it is empty; lists and tuples: as argv
    (:func:`redact_argv`); strings: as free text (:func:`redact_text`, ``known`` values included).
    """
    known = _known_values(known)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(key, str) and is_secret_name(key) and item not in (None, "", False):
                out[key] = REDACTED
            else:
                out[key] = redact(item, known)
        return out
    if isinstance(value, list | tuple):
        return redact_argv(value, known=known)
    if isinstance(value, str):
        return redact_text(value, known)
    return value


def secret_env_values(environ: Mapping[str, str] | None = None, min_length: int = 6) -> list[str]:
    """Values of secret-looking env variables (``SLACK_BOT_TOKEN``...), longest first: they must never
    appear in anything benchbot writes. Shorter values than ``min_length`` would hide ordinary words."""
    environ = os.environ if environ is None else environ
    return _known_values(v for k, v in environ.items() if is_secret_name(k) and len(v) >= min_length)


def scrub_secrets(value: Any) -> Any:
    """What leaves the process (Redis, Slack, exports): :func:`redact` with this process's secret env values."""
    return redact(value, secret_env_values())
