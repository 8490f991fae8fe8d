"""TensorRT-LLM's readiness: the shared ``/health`` wait with its rules and uvicorn's ready line, and its smoke
request (``POST /v1/completions``: it has no SGLang-style ``/generate``).

``launch_server`` binds the port before it builds the LLM and uvicorn listens only once the model is loaded,
so a loading server refuses connections (as vLLM's does); ``/health`` is 200 once it serves.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from workers.capped_http import capped_client
from workers.engines import diagnosis, readiness
from workers.engines.contract import Contract
from workers.engines.readiness import ReadyResult, SmokeResult, auth_headers, is_garbage
from workers.engines.trtllm.diagnosis import RULES

NAME = "TensorRT-LLM"
#: uvicorn's line once it listens (the recorded ``ready_line`` wins when the contract has one).
READY_LINE = "Application startup complete."


async def wait_ready(
    base_url: str,
    *,
    deadline_s: float,
    is_alive: Callable[[], Awaitable[bool]],
    read_new_log: Callable[[], Awaitable[str]],
    api_key: str | None,
    gate: Callable[[], None] | None,
    foreign_listener: Callable[[], Awaitable[str | None]] | None,
    contract: Contract | None,
) -> ReadyResult | diagnosis.Diagnosis:
    """Until ``/health`` answers 200, or a diagnosis by TensorRT-LLM's rules."""
    return await readiness.wait_ready(
        base_url,
        deadline_s=deadline_s,
        is_alive=is_alive,
        read_new_log=read_new_log,
        api_key=api_key,
        gate=gate,
        foreign_listener=foreign_listener,
        contract=contract,
        rules=RULES,
        engine=NAME,
        ready_line=(contract.ready_line if contract is not None else None) or READY_LINE,
    )


async def smoke_test(base_url: str, api_key: str | None) -> SmokeResult:
    """Greedy 16 tokens of ``POST /v1/completions`` (the served model from ``/v1/models``)."""
    try:
        async with capped_client(headers=auth_headers(api_key), timeout=120.0) as client:
            models = await client.get(base_url.rstrip("/") + "/v1/models")
            data = models.json().get("data") if models.status_code == 200 else None
            model = data[0].get("id") if isinstance(data, list) and data and isinstance(data[0], dict) else None
            body: dict[str, object] = {"prompt": readiness.SMOKE_PROMPT, "max_tokens": 16, "temperature": 0}
            if model:
                body["model"] = model
            resp = await client.post(base_url.rstrip("/") + "/v1/completions", json=body)
    except (httpx.HTTPError, ValueError) as exc:
        return SmokeResult(False, "", None, f"the request failed: {type(exc).__name__}: {exc}")
    if resp.status_code != 200:
        return SmokeResult(False, "", None, f"HTTP {resp.status_code}: {diagnosis.clip(resp.text.strip(), 200)}")
    try:
        answer = resp.json()
    except ValueError:
        return SmokeResult(False, "", None, "the answer is not JSON")
    choices = answer.get("choices") if isinstance(answer, dict) else None
    text = choices[0].get("text") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else ""
    text = text if isinstance(text, str) else ""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    count = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(count, int | float):
        return SmokeResult(False, text, None, "the server reported no completion_tokens")
    if count == 0:
        return SmokeResult(False, text, 0, "the server generated 0 tokens")
    why = is_garbage(text)
    return SmokeResult(why is None, text, int(count), why or "")
