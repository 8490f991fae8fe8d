"""Request bodies: one streamed request's JSON per planned prompt, in the API the spec asks for.

Built before the level starts (never on the hot path), greedy with EOS ignored so every request
produces exactly the output tokens it was planned with. A new body option reads its field of
:class:`~workers.benchmark.spec.BenchSpec` here.
"""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING

from workers.benchmark.prompts import ID_RANGE, Prompt
from workers.json_value import JsonObject

if TYPE_CHECKING:
    from workers.benchmark.settings import ClientSettings

#: The endpoint of each API.
PATHS = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}


def prompt_ids(seed: int, index: int, input_len: int) -> list[int]:
    """Deterministic, per-request distinct token ids: exact length, no shared prefix between requests.

    The client's first prompt maker, kept as the reference :func:`workers.benchmark.prompts.local_token_ids`
    must match (a moved client must not change a single prompt it sends).
    """
    rng = random.Random(f"{seed}:{index}")
    return rng.choices(ID_RANGE, k=input_len)


def request_body(settings: ClientSettings, prompt: Prompt) -> bytes:
    """One request's JSON: greedy, EOS ignored (exactly ``prompt.output_tokens`` tokens), streamed.

    Token ids go as ids (``input_ids`` / ``prompt``: exact lengths); text goes as text; chat sends
    messages. OpenAI APIs ask for the usage in every chunk (``continuous_usage_stats``) so each chunk's
    token count is known, and for the final usage, whose ``prompt_tokens`` is the exact input length.
    """
    api = settings.spec.api
    body: JsonObject
    if api == "generate":
        body = {
            "sampling_params": {"max_new_tokens": prompt.output_tokens, "temperature": 0, "ignore_eos": True},
            "stream": True,
        }
        if prompt.token_ids is not None:
            body["input_ids"] = list(prompt.token_ids)
        else:
            body["text"] = prompt.text if prompt.text is not None else _joined(prompt)
        return json.dumps(body, separators=(",", ":")).encode()
    body = {"model": settings.model}
    if api == "chat":
        messages = prompt.chat_messages() if prompt.messages else [{"role": "user", "content": _joined(prompt)}]
        body["messages"] = messages
    else:
        body["prompt"] = list(prompt.token_ids) if prompt.token_ids is not None else _joined(prompt)
    body.update(
        {
            "max_tokens": prompt.output_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
    )
    return json.dumps(body, separators=(",", ":")).encode()


def _joined(prompt: Prompt) -> str:
    if prompt.text is not None:
        return prompt.text
    return "\n\n".join(content for _, content in prompt.messages or ())
