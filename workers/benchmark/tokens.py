"""Counting prompt tokens without downloading a tokenizer.

benchbot never fetches a model's tokenizer (no network on the workers, no multi-GB images). A text
prompt's length is known three ways, from cheapest to exact:

1. **Approximation** (:func:`approx_tokens`): ``ceil(UTF-8 bytes / 4)``, the usual ~4 bytes per BPE
   token for English text, and what the simulator counts; chat messages add
   :data:`CHAT_TOKENS_PER_MESSAGE` per message plus :data:`CHAT_REPLY_PRIMER` (the role headers of a
   typical template). Good to ~10-20 % on English prose, worse on code or other scripts. Used to choose
   and filter dataset prompts before a run.
2. **The server's tokenizer** (:func:`server_token_counts`): SGLang serves ``POST /tokenize``
   (and ``/v1/tokenize``) with ``{"prompt": [texts], "add_special_tokens": false}`` ->
   ``{"count": [...], "max_model_len": N}`` (0.5.9 and 0.5.23, ``serving_tokenize.py``). Exact for the
   served model's tokenizer; content only, no chat template. One batched call before the timed phase.
3. **The server's usage report** after the request: ``usage.prompt_tokens`` (completions, chat) or
   ``meta_info.prompt_tokens`` (``/generate``), template included. The record of a text request should
   take its input token count from there, as output tokens already are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from workers.capped_http import capped_client
from workers.errors import BenchbotError

APPROX_BYTES_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_REPLY_PRIMER = 3
TOKENIZE_BATCH = 64
APPROX = "approx (UTF-8 bytes / 4)"
SERVER = "server /tokenize"


def approx_tokens(text: str) -> int:
    """``max(1, ceil(utf8_bytes / 4))``: the documented approximation (and the simulator's count)."""
    return max(1, math.ceil(len(text.encode("utf-8")) / APPROX_BYTES_PER_TOKEN))


def approx_chat_tokens(messages: Sequence[Mapping[str, str]]) -> int:
    """Approximate prompt tokens of a chat request: contents plus a typical template's per-message cost."""
    return sum(approx_tokens(m.get("content", "")) + CHAT_TOKENS_PER_MESSAGE for m in messages) + CHAT_REPLY_PRIMER


@dataclass(frozen=True)
class ServerCounts:
    """Token counts from the server's own tokenizer, and the context length it reports."""

    counts: tuple[int, ...]
    max_model_len: int | None


def tokenize_body(texts: Sequence[str], model: str | None = None) -> dict[str, object]:
    """The ``/tokenize`` request: content tokens only (no BOS), as the prompt's share of the context."""
    body: dict[str, object] = {"prompt": list(texts), "add_special_tokens": False}
    if model:
        body["model"] = model
    return body


def parse_tokenize_response(payload: object, expected: int) -> ServerCounts:
    """Read SGLang's ``TokenizeResponse`` (``count`` is a list for a list of prompts)."""
    if not isinstance(payload, dict) or "count" not in payload:
        raise BenchbotError("the server's /tokenize answer has no token counts (is it an SGLang server?)")
    counts = payload["count"]
    if isinstance(counts, int):
        counts = [counts]
    if (
        not isinstance(counts, list)
        or len(counts) != expected
        or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)
    ):
        raise BenchbotError(
            f"the server's /tokenize answer has {len(counts) if isinstance(counts, list) else 'no'} "
            f"counts for {expected} prompts"
        )
    max_len = payload.get("max_model_len")
    return ServerCounts(tuple(counts), max_len if isinstance(max_len, int) and max_len > 0 else None)


async def server_token_counts(
    base_url: str,
    texts: Sequence[str],
    *,
    api_key: str | None = None,
    model: str | None = None,
    gate: Callable[[], None] | None = None,
    batch: int = TOKENIZE_BATCH,
    timeout_s: float = 30.0,
) -> ServerCounts:
    """Count ``texts`` with the server's tokenizer (``POST /tokenize``), ``batch`` prompts per call.

    ``gate()`` (the lease fence check) runs before every call, as before any request to a host.
    Raises a ``BenchbotError`` that says what to do when the server has no such endpoint.
    """
    import httpx

    url = base_url.rstrip("/") + "/tokenize"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    counts: list[int] = []
    max_len: int | None = None
    async with capped_client(timeout=timeout_s) as client:
        for start in range(0, len(texts), max(1, batch)):
            chunk = texts[start : start + max(1, batch)]
            if gate is not None:
                gate()
            try:
                resp = await client.post(url, json=tokenize_body(chunk, model), headers=headers)
            except httpx.HTTPError as exc:
                raise BenchbotError(f"could not ask {base_url} to count tokens ({type(exc).__name__}: {exc})") from exc
            if resp.status_code in (404, 405):
                raise BenchbotError(
                    f"the server at {base_url} has no /tokenize endpoint (SGLang 0.5.9 and later "
                    "have one); token counts fall back to the approximation"
                )
            if resp.status_code != 200:
                raise BenchbotError(
                    f"the server refused to count tokens: HTTP {resp.status_code} {resp.text[:200].strip()}"
                )
            try:
                payload = resp.json()
            except ValueError as exc:
                raise BenchbotError("the server's /tokenize answer is not JSON") from exc
            got = parse_tokenize_response(payload, len(chunk))
            counts.extend(got.counts)
            max_len = got.max_model_len or max_len
    return ServerCounts(tuple(counts), max_len)
