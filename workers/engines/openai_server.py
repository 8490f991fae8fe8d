"""What a server of the OpenAI-style engines says about itself: ``/version``'s version and ``/v1/models``' card.

vLLM and TensorRT-LLM both answer ``GET /version`` with ``{"version": ...}`` and list the served model in
``GET /v1/models``; their observation readers start from these two and go their own ways after.
"""

from __future__ import annotations

import contextlib

import httpx

from workers.engines.interface import ServerReport
from workers.json_value import JsonObject


async def reported_version(client: httpx.AsyncClient, base: str, engine: str) -> str | ServerReport:
    """``GET /version``'s version, or the report that says why there is none: no answer (``unreachable``), or
    an answer that is not ``engine``'s (``not_engine``)."""
    try:
        resp = await client.get(base + "/version")
    except httpx.HTTPError as exc:
        return ServerReport("unreachable", None, f"GET /version: {type(exc).__name__}")
    try:
        data = resp.json() if resp.status_code == 200 else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("version"), str):
        return ServerReport("not_engine", None, f"GET /version: HTTP {resp.status_code}, not {engine}'s")
    version: str = data["version"]
    return version


def model_card(models: httpx.Response) -> JsonObject:
    """The first model a ``GET /v1/models`` answer lists (``id``, ``root``, ``owned_by``...), {} when none."""
    card: JsonObject = {}
    with contextlib.suppress(ValueError, AttributeError):
        listed = models.json().get("data") if models.status_code == 200 else None
        if isinstance(listed, list) and listed and isinstance(listed[0], dict):
            card = listed[0]
    return card
