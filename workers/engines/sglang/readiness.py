"""Is a started SGLang usable: the shared ``/health`` wait with SGLang's rules and ready line, then one greedy
``POST /generate`` that must look like language. Reference: docs/observe.md ("Readiness and diagnosis").
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from workers.engines import readiness
from workers.engines.readiness import ReadyResult as ReadyResult  # re-exported: what wait_ready returns
from workers.engines.readiness import SmokeAnswer, SmokeRequest, SmokeResult
from workers.engines.sglang import diagnosis
from workers.json_value import JsonValue

#: Printed once warmup is done (docs/sim.md, "Process life"; recorded as ``ready`` in every contract).
READY_LINE = "The server is fired up and ready to roll!"

#: Wait until SGLang's ``/health`` answers 200, or diagnose with SGLang's rules why it will not
#: (:func:`workers.engines.readiness.wait_ready` with SGLang's rules, name, ready line and fitted hints).
wait_ready = functools.partial(
    readiness.wait_ready,
    rules=diagnosis.RULES,
    engine=diagnosis.ENGINE,
    ready_line=READY_LINE,
    fit_hint=diagnosis.fit_hint,
)


def generate_answer(answer: JsonValue) -> SmokeAnswer:
    """``/generate``'s answer (an object, or a list of one): its ``text`` and ``meta_info.completion_tokens``."""
    if isinstance(answer, list):
        answer = answer[0] if answer else {}
    if not isinstance(answer, Mapping):
        return "the answer is not a JSON object"
    raw_text = answer.get("text")
    raw_meta = answer.get("meta_info")
    meta: Mapping[str, object] = raw_meta if isinstance(raw_meta, Mapping) else {}
    count = meta.get("completion_tokens")
    return (raw_text if isinstance(raw_text, str) else ""), int(count) if isinstance(count, int | float) else None


#: Greedy 16 tokens of "The capital of France is" by ``POST /generate`` (docs/observe.md, "Readiness and
#: diagnosis").
SMOKE = SmokeRequest(
    path="/generate",
    body=lambda prompt, model: {"text": prompt, "sampling_params": {"max_new_tokens": 16, "temperature": 0}},
    read=generate_answer,
)


async def smoke_test(base_url: str, api_key: str | None = None, *, timeout_s: float = 120.0) -> SmokeResult:
    """SGLang's smoke generation (:data:`SMOKE`): transport errors, empty or garbage text and
    ``completion_tokens`` of 0 or missing fail it."""
    return await readiness.run_smoke(base_url, api_key, SMOKE, timeout_s=timeout_s)
