"""Is a started engine usable: wait for ``/health`` (ending early on a fatal log line or a dead process),
then judge one greedy generation, which must look like language.

Shared by every engine's driver: each passes its own rules, name and ready line, and describes its own
smoke request (:class:`SmokeRequest`; :func:`run_smoke` sends it and :func:`is_garbage` judges the text).
Talks HTTP only; the process and its log are handed in as callables (from ``workers.host.transport``), so
this is tested against plain HTTP servers and used over SSH alike. Reference: docs/observe.md ("Readiness
and diagnosis") and docs/sim.md ("Process life").
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import httpx

from workers.capped_http import capped_client
from workers.engines.contract import Contract
from workers.engines.diagnosis import Diagnosis, FitHint, Rule, clip, diagnose, foreign_answer_diagnosis, match_rule
from workers.json_value import JsonObject, JsonValue


@dataclass(frozen=True)
class ReadyResult:
    """The server answered ``GET /health`` with 200."""

    elapsed_s: float
    health_polls: int
    saw_ready_line: bool


def auth_headers(api_key: str | None) -> dict[str, str]:
    """``Authorization: Bearer`` when the server was started with an API key (every engine's OpenAI API)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def health_status(base_url: str, api_key: str | None, timeout_s: float) -> tuple[int | None, str]:
    """One ``GET /health``: (HTTP status, "") or (None, why there was no answer).

    A server may answer other endpoints before it serves (SGLang answers ``/server_info`` from the moment
    uvicorn binds, while its warm-up request still runs, and ``/health`` says 503 until then), so what
    answers is *ready* only once this says 200: the same test :func:`wait_ready` waits on.
    """
    async with capped_client(headers=auth_headers(api_key), timeout=timeout_s) as client:
        try:
            resp = await client.get(base_url.rstrip("/") + "/health")
        except httpx.HTTPError as exc:
            return None, f"GET /health: {type(exc).__name__}"
    return resp.status_code, ""


#: uvicorn's line once it listens: the ready line of the engines that serve through it (a recorded one wins).
UVICORN_READY_LINE = "Application startup complete."

#: Keep at most this much log text in memory while waiting (a long start-up can log a lot).
_MAX_LOG_CHARS = 512_000
#: After a fatal line, keep reading this long so the whole traceback is in the diagnosis.
_FATAL_GRACE_S = 1.0


async def wait_ready(
    base_url: str,
    *,
    deadline_s: float,
    is_alive: Callable[[], Awaitable[bool]],
    read_new_log: Callable[[], Awaitable[str]],
    api_key: str | None = None,
    poll_s: float = 0.5,
    gate: Callable[[], None] | None = None,
    foreign_listener: Callable[[], Awaitable[str | None]] | None = None,
    contract: Contract | None = None,
    rules: Sequence[Rule],
    engine: str,
    ready_line: str,
    fit_hint: FitHint | None = None,
) -> ReadyResult | Diagnosis:
    """Wait until ``/health`` answers 200, or return a :class:`Diagnosis` as soon as start-up has failed.

    Each round: read the new log text (a fatal line ends the wait at once), check the process is alive
    (a dead one ends it at once), then probe ``/health`` (503 or no connection means still starting).
    The deadline ends the wait with a ``timeout`` diagnosis. ``gate()`` runs before each probe (a job's
    fence check). A 200 counts only if ``foreign_listener()`` returns None: it names the process that
    listens on the port when that is not the one we started, and a 200 from someone else is a
    ``port_in_use`` diagnosis, never readiness. ``rules``, ``engine``, ``ready_line`` and ``fit_hint`` are
    the engine's (its driver passes them; an engine that refuses connections until ready reads the same).
    """
    poll_s = min(max(poll_s, 0.01), 0.5)
    started = time.monotonic()
    deadline = started + deadline_s
    log = ""
    polls = 0
    saw_ready = False
    # the engine's diagnosis of a failed start: its rules, name and contract, whatever ended the wait
    why = functools.partial(diagnose, returncode=None, contract=contract, rules=rules, engine=engine, fit_hint=fit_hint)

    async def drain() -> None:
        nonlocal log, saw_ready
        try:
            new = await read_new_log()
        except FileNotFoundError:
            new = ""  # the log file is created by the launch; it may not exist for a moment
        if new:
            log = (log + new)[-_MAX_LOG_CHARS:]
            saw_ready = saw_ready or ready_line in log

    async def finish_fatal() -> Diagnosis:
        # The line that names the failure often comes a moment after the wrapper line; collect it.
        grace_end = time.monotonic() + _FATAL_GRACE_S
        quiet = 0
        while time.monotonic() < grace_end and quiet < 3:
            await asyncio.sleep(0.1)
            before = len(log)
            await drain()
            quiet = quiet + 1 if len(log) == before else 0
            if quiet and not await is_alive():
                break
        alive = await is_alive()
        return why(log, exited=not alive, timed_out=False)

    url = base_url.rstrip("/") + "/health"
    probe: asyncio.Task[httpx.Response] | None = None
    async with capped_client(headers=auth_headers(api_key)) as client:
        try:
            while True:
                round_start = time.monotonic()
                await drain()
                if match_rule(log, fatal_only=True, rules=rules):
                    return await finish_fatal()
                if not await is_alive():
                    await drain()
                    return why(log, exited=True, timed_out=False)
                remaining = deadline - round_start
                if remaining <= 0:
                    return why(log, exited=False, timed_out=True)
                if probe is None:
                    # The probe runs beside the log/process checks: a port that accepts but never answers
                    # must not delay a diagnosis the log already gives.
                    if gate is not None:
                        gate()
                    polls += 1
                    probe = asyncio.create_task(client.get(url, timeout=max(0.2, min(5.0, remaining))))
                await asyncio.wait({probe}, timeout=min(poll_s, remaining))
                if not probe.done():
                    continue
                try:
                    if probe.result().status_code == 200:
                        await drain()  # pick up the ready line if it is already written
                        other = await foreign_listener() if foreign_listener is not None else None
                        if other is not None:
                            return foreign_answer_diagnosis(other, log)
                        return ReadyResult(round(time.monotonic() - started, 3), polls, saw_ready)
                except httpx.HTTPError:
                    pass  # not listening yet (503 or refused): keep waiting
                finally:
                    probe = None
                await asyncio.sleep(max(0.0, min(round_start + poll_s, deadline) - time.monotonic()))
        finally:
            if probe is not None and not probe.done():
                probe.cancel()
                await asyncio.wait({probe})


# ---------------------------------------------------------------------------------------------------------
# Smoke generation
# ---------------------------------------------------------------------------------------------------------

#: The prompt every engine's smoke generation completes (greedy, 16 tokens).
SMOKE_PROMPT = "The capital of France is"


@dataclass(frozen=True)
class SmokeResult:
    """One greedy generation: ``ok`` only when the output looks like language."""

    ok: bool
    text: str
    completion_tokens: int | None
    reason: str


#: What a smoke answer says came back: (text, completion tokens or None), or why it is no answer at all.
SmokeAnswer = tuple[str, int | None] | str


@dataclass(frozen=True)
class SmokeRequest:
    """One engine's smoke generation, as data: :func:`run_smoke` sends it and judges what comes back."""

    #: Where it is posted (``/generate``, ``/v1/completions``).
    path: str
    #: ``(prompt, served model or None) -> the JSON body``: greedy, a few tokens.
    body: Callable[[str, str | None], JsonObject]
    #: ``the decoded answer -> (text, completion tokens)``, or a reason when the answer has no such shape.
    read: Callable[[JsonValue], SmokeAnswer]
    #: Ask ``/v1/models`` first and name the served model in the body (the OpenAI APIs want one).
    names_model: bool = False
    #: How long the whole exchange may take.
    timeout_s: float = 120.0


def _number(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def _completion_answer(answer: JsonValue) -> SmokeAnswer:
    """An OpenAI completion: ``choices[0].text`` and ``usage.completion_tokens``."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    text = choices[0].get("text") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else ""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    count = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return (text if isinstance(text, str) else ""), _number(count)


#: Greedy 16 tokens of ``POST /v1/completions`` (the served model from ``/v1/models``): an OpenAI server's smoke.
COMPLETIONS_SMOKE = SmokeRequest(
    path="/v1/completions",
    body=lambda prompt, model: {
        "prompt": prompt,
        "max_tokens": 16,
        "temperature": 0,
        **({"model": model} if model else {}),
    },
    read=_completion_answer,
    names_model=True,
)


async def run_smoke(
    base_url: str, api_key: str | None, request: SmokeRequest, *, timeout_s: float | None = None
) -> SmokeResult:
    """Send ``request``'s greedy generation of :data:`SMOKE_PROMPT` and judge it: transport errors, a status
    other than 200, an answer that is no JSON or has no ``completion_tokens``, 0 tokens and garbage text fail."""
    base = base_url.rstrip("/")
    try:
        async with capped_client(headers=auth_headers(api_key), timeout=timeout_s or request.timeout_s) as client:
            model = await _served_model(client, base) if request.names_model else None
            resp = await client.post(base + request.path, json=request.body(SMOKE_PROMPT, model))
    except (httpx.HTTPError, ValueError) as exc:
        return SmokeResult(False, "", None, f"the request failed: {type(exc).__name__}: {exc}")
    if resp.status_code != 200:
        return SmokeResult(False, "", None, f"HTTP {resp.status_code}: {clip(resp.text.strip(), 200)}")
    try:
        answer = resp.json()
    except ValueError:
        return SmokeResult(False, "", None, "the answer is not JSON")
    read = request.read(answer)
    if isinstance(read, str):
        return SmokeResult(False, "", None, read)
    text, tokens = read
    if tokens is None:
        return SmokeResult(False, text, None, "the server reported no completion_tokens")
    if tokens == 0:
        return SmokeResult(False, text, 0, "the server generated 0 tokens")
    why = is_garbage(text)
    return SmokeResult(why is None, text, tokens, why or "")


async def _served_model(client: httpx.AsyncClient, base: str) -> str | None:
    """The first model ``/v1/models`` lists (its ``id``), None when it lists none; ValueError on a non-JSON answer."""
    models = await client.get(base + "/v1/models")
    data = models.json().get("data") if models.status_code == 200 else None
    model = data[0].get("id") if isinstance(data, list) and data and isinstance(data[0], Mapping) else None
    return model if isinstance(model, str) else None


def is_garbage(text: str) -> str | None:
    """Why ``text`` is not a plausible completion, or None when it looks fine.

    Catches the seed's ``!!!!`` (argmax of NaN logits is token 0, ``!`` in Qwen's vocabulary), other
    long runs of one character (``++++++++``), one word repeated (`` the the the ...``), U+FFFD from
    broken byte sequences, control-character soup, and empty output.
    """
    if not text or not text.strip():
        return "the output is empty"
    if "\ufffd" in text:
        return "the output contains U+FFFD replacement characters (broken token bytes)"
    dense = "".join(text.split())
    if set(dense) == {"!"}:
        return "the output is only '!' (the NaN signature: argmax of NaN logits is token 0, '!')"
    if len(dense) >= 4 and len(set(dense)) == 1:
        return f"the output is one character repeated ({dense[0]!r} x{len(dense)})"
    longest, run = 1, 1
    for prev, cur in itertools.pairwise(dense):
        run = run + 1 if cur == prev else 1
        longest = max(longest, run)
    if longest >= 8 and longest * 2 >= len(dense):
        return f"the output is mostly one repeated character ({longest} in a row)"
    words = text.split()
    if len(words) >= 8:
        word, count = collections.Counter(words).most_common(1)[0]
        if count * 10 >= len(words) * 9:
            return f"the output is one word repeated ({word!r} x{count})"
    controls = sum(1 for ch in text if ord(ch) < 32 and ch not in "\n\r\t")
    if controls * 10 > len(text):
        return "the output is mostly control characters"
    return None
