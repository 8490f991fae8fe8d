"""Is a started SGLang usable: the shared ``/health`` wait with SGLang's rules and ready line, then one greedy
``POST /generate`` that must look like language. Reference: docs/observe.md ("Readiness and diagnosis").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import httpx

from workers.capped_http import capped_client
from workers.engines import readiness
from workers.engines.contract import Contract
from workers.engines.diagnosis import Diagnosis, clip
from workers.engines.readiness import SMOKE_PROMPT, ReadyResult, SmokeResult, auth_headers, is_garbage
from workers.engines.sglang import diagnosis

#: Printed once warmup is done (docs/sim.md, "Process life"; recorded as ``ready`` in every contract).
READY_LINE = "The server is fired up and ready to roll!"


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
) -> ReadyResult | Diagnosis:
    """Wait until SGLang's ``/health`` answers 200, or diagnose with SGLang's rules why it will not
    (:func:`workers.engines.readiness.wait_ready`)."""
    return await readiness.wait_ready(
        base_url,
        deadline_s=deadline_s,
        is_alive=is_alive,
        read_new_log=read_new_log,
        api_key=api_key,
        poll_s=poll_s,
        gate=gate,
        foreign_listener=foreign_listener,
        contract=contract,
        rules=diagnosis.RULES,
        engine=diagnosis.ENGINE,
        ready_line=READY_LINE,
        fit_hint=diagnosis.fit_hint,
    )


async def smoke_test(base_url: str, api_key: str | None = None, *, timeout_s: float = 120.0) -> SmokeResult:
    """Greedy 16-token ``POST /generate`` of "The capital of France is" (docs/observe.md, "Readiness and diagnosis").

    Rejects transport errors, empty or garbage text and ``completion_tokens`` of 0 or missing.
    """
    payload = {"text": SMOKE_PROMPT, "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
    url = base_url.rstrip("/") + "/generate"
    try:
        async with capped_client(headers=auth_headers(api_key)) as client:
            resp = await client.post(url, json=payload, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return SmokeResult(False, "", None, f"the request failed: {type(exc).__name__}: {exc}")
    if resp.status_code != 200:
        return SmokeResult(False, "", None, f"HTTP {resp.status_code}: {clip(resp.text.strip(), 200)}")
    try:
        body = resp.json()
    except ValueError:
        return SmokeResult(False, "", None, "the answer is not JSON")
    if isinstance(body, list):
        body = body[0] if body else {}
    if not isinstance(body, Mapping):
        return SmokeResult(False, "", None, "the answer is not a JSON object")
    raw_text = body.get("text")
    text: str = raw_text if isinstance(raw_text, str) else ""
    raw_meta = body.get("meta_info")
    meta: Mapping[str, object] = raw_meta if isinstance(raw_meta, Mapping) else {}
    count = meta.get("completion_tokens")
    tokens = int(count) if isinstance(count, (int, float)) else None
    if tokens is None:
        return SmokeResult(False, text, None, "the server reported no completion_tokens")
    if tokens == 0:
        return SmokeResult(False, text, 0, "the server generated 0 tokens")
    why = is_garbage(text)
    if why:
        return SmokeResult(False, text, tokens, why)
    return SmokeResult(True, text, tokens, "")
