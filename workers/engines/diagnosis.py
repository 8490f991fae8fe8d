"""Why an engine start failed, from its log: the machinery every engine's rules go through.

An engine folder writes its failure rules (:class:`Rule`: a regex against a text recorded from its real
wheels, a category, a one-sentence summary with the fix) in its own ``diagnosis`` module, most specific
first; :func:`diagnose` matches them against a start's log, and readiness waits end early on a fatal one.
Secrets are redacted from everything a diagnosis returns.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from workers.engines import registry
from workers.json_value import JsonObject
from workers.secrets import redact_text

if TYPE_CHECKING:
    from workers.engines.contract import Contract
    from workers.engines.readiness import SmokeResult

CATEGORIES = (
    "oom",
    "assertion",
    "unsupported_gpu",
    "port_in_use",
    "config_error",
    "garbage_output",
    "timeout",
    "crashed",
)


@dataclass(frozen=True)
class Rule:
    """One known failure: a regex, its category, a one-sentence summary with the fix.

    ``summary`` may use ``{name}`` for named groups of ``pattern``. ``fatal`` rules end a readiness
    wait at once; non-fatal ones (generic exceptions, warnings the engine survives) only explain a process
    that already died. ``texts`` names the recorded texts (``contracts/*.json``, key ``texts``) the
    rule is for: tests match every rule against the real text of each version that prints it.
    """

    pattern: re.Pattern[str]
    category: str
    summary: str
    fatal: bool = True
    texts: tuple[str, ...] = ()


def rule(pattern: str, category: str, summary: str, *texts: str, fatal: bool = True) -> Rule:
    """A :class:`Rule` from its regex source: how engine folders write their tables."""
    return Rule(re.compile(pattern), category, summary, fatal, texts)


#: Rewrites the flags a hint names for the host's version (an engine that renamed a flag passes one).
FitHint = Callable[[str, "Contract | None"], str]

LOG_TAIL_LINES = 40
_EXCEPTION_LINE_RE = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception)\b")


@dataclass(frozen=True)
class Diagnosis:
    """Why an engine is not usable, in words a person can act on, plus the evidence."""

    category: str
    summary: str
    evidence_line: str
    log_tail: str

    def to_dict(self) -> JsonObject:
        return asdict(self)


def _line_at(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start : end if end >= 0 else len(text)].strip()


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def clip(line: str, limit: int = 300) -> str:
    """``line`` cut to ``limit`` characters (an ellipsis marks the cut): evidence must fit a Slack block."""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def match_rule(text: str, *, fatal_only: bool = False, rules: Sequence[Rule]) -> tuple[Rule, re.Match[str]] | None:
    """The first rule (table order) of an engine's ``rules`` that matches anywhere in ``text``."""
    for candidate in rules:
        if fatal_only and not candidate.fatal:
            continue
        m = candidate.pattern.search(text)
        if m:
            return candidate, m
    return None


def format_summary(
    found: Rule, m: re.Match[str], contract: Contract | None = None, fit_hint: FitHint | None = None
) -> str:
    """The rule's summary with its named groups filled in (clipped), the flags fitted to the host's version."""
    groups = {k: clip((v or "").strip().rstrip("."), 120) for k, v in m.groupdict().items()}
    summary = found.summary.format(**groups)
    return redact_text(fit_hint(summary, contract) if fit_hint is not None else summary)


def diagnose(
    log_text: str,
    *,
    exited: bool,
    returncode: int | None,
    timed_out: bool,
    contract: Contract | None = None,
    rules: Sequence[Rule],
    engine: str,
    fit_hint: FitHint | None = None,
) -> Diagnosis:
    """Explain a failed or stuck start of ``engine`` (its name in sentences) from its log, with its ``rules``.

    Known rules win (a fatal one always; a generic one only when the process is gone). Otherwise a
    dead process is ``crashed`` with its last exception line, and a live one past its deadline is
    ``timeout``. Secrets are redacted from everything returned. With the host's ``contract`` and the
    engine's ``fit_hint`` the hints name the flags that version accepts.
    """
    text = log_text or ""
    tail = redact_text(_tail(text))
    found = match_rule(text, fatal_only=not exited, rules=rules)
    if found:
        known, m = found
        evidence = redact_text(clip(_line_at(text, m.start())))
        return Diagnosis(known.category, format_summary(known, m, contract, fit_hint), evidence, tail)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if exited:
        exc = next((ln for ln in reversed(lines) if _EXCEPTION_LINE_RE.match(ln)), last)
        if returncode in (-9, 137):
            how = "was killed (SIGKILL, possibly the host's out-of-memory killer)"
        elif returncode is None:
            how = "exited"
        else:
            how = f"exited with code {returncode}"
        summary = f"{engine} {how} without a known error; read the evidence line and the log tail."
        return Diagnosis("crashed", summary, redact_text(clip(exc)), tail)
    if timed_out:
        return Diagnosis(
            "timeout",
            f"{engine} did not become healthy before the deadline; the log tail shows how far start-up got "
            "(big models may just need a longer deadline).",
            redact_text(clip(last)),
            tail,
        )
    return Diagnosis("crashed", "No known failure pattern in the log.", redact_text(clip(last)), tail)


_TRUE_VALUES = ("1", "true", "yes", "on")


def without_satisfied_hints(
    diagnosis: Diagnosis, env: Mapping[str, str], hints: Mapping[str, str] | None = None
) -> Diagnosis:
    """``diagnosis`` without advice to set what the engine's ``env`` already sets: an OOM on a launch that
    has ``SGLANG_ENABLE_SPEC_V2=1`` must not send its owner off to set it. ``hints`` (env name -> the clause
    that asks for it): every registered engine's ``env_hints`` when not given (the names are the engines')."""
    if hints is None:
        hints = {name: clause for driver in registry.drivers() for name, clause in driver.env_hints.items()}
    summary = diagnosis.summary
    for name, clause in hints.items():
        if env.get(name, "").strip().lower() in _TRUE_VALUES:
            summary = summary.replace(clause, "")
    return replace(diagnosis, summary=summary) if summary != diagnosis.summary else diagnosis


def foreign_answer_diagnosis(who: str, log_text: str) -> Diagnosis:
    """``/health`` answered 200, but from a process that is not the server this launch started."""
    summary = (
        f"{who} answers on the server's port, not the server this launch started, so the launch is "
        "not ready; benchbot stopped what it started and left that process alone. Stop it (or "
        "/stop if it is an engine) and launch again."
    )
    return Diagnosis("port_in_use", summary, f"GET /health answered 200 from {who}", redact_text(_tail(log_text)))


def smoke_diagnosis(
    result: SmokeResult, log_text: str = "", *, rules: Sequence[Rule], hint: str, fit_hint: FitHint | None = None
) -> Diagnosis:
    """Turn a failed smoke test into a ``garbage_output`` diagnosis (a known log cause wins if present);
    ``hint`` is what the engine suggests when the log names no cause."""
    # Any garbage rule explains it, a non-fatal NaN warning too: the engine survives it, the output does not.
    found = (
        next(
            ((r, m) for r in rules if r.category == "garbage_output" and (m := r.pattern.search(log_text))),
            None,
        )
        if log_text
        else None
    )
    if found:
        known, m = found
        return Diagnosis(
            known.category,
            format_summary(known, m, None, fit_hint),
            clip(_line_at(log_text, m.start())),
            redact_text(_tail(log_text)),
        )
    shown = clip(repr(result.text), 120)
    summary = f"The server started but its test generation failed: {result.reason}; {hint}"
    return Diagnosis("garbage_output", summary, f"output: {shown}", redact_text(_tail(log_text)))
