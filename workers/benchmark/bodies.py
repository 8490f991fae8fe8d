"""Request bodies: one streamed request's JSON per planned prompt, in the API the spec asks for.

Built before the level starts (never on the hot path), greedy with EOS ignored so every request
produces exactly the output tokens it was planned with. Each API's body is its entry's builder in
``workers.benchmark.wire_apis``; a new body option reads its field of
:class:`~workers.benchmark.spec.BenchSpec` there.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from workers.benchmark.prompts import ID_RANGE, Prompt
from workers.benchmark.wire_apis import wire_api

if TYPE_CHECKING:
    from workers.benchmark.settings import ClientSettings


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
    return wire_api(settings.spec.api).encode_body(prompt, settings.model)
