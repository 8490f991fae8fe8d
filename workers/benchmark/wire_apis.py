"""The wire APIs the bench client speaks, in one table: each API's path, request body, stream reader, prompts.

Everything that differs between SGLang's ``/generate`` and the OpenAI ``/v1/completions`` and
``/v1/chat/completions`` lives in that API's :class:`WireApi` entry of :data:`WIRE_APIS`, the way vLLM's
benchmark keeps one request function per endpoint: the client's modules look the entry up once (per
request plan, shard or record) and never branch on an API's name. Adding an API is one entry here.

- ``path``: where its requests go; ``needs_model``: the body names the served model (asked from
  ``/v1/models`` once per sweep when the worker does not know it);
- ``prompt_shape`` (read by ``workers.benchmark.prompts``): ``"token_ids"`` sends local prompts as ids
  (exact lengths) and dataset prompts as one joined text; ``"messages"`` sends text only, local prompts as
  one user message and dataset prompts as their own messages;
- ``body(prompt, model)``: one streamed, greedy request with EOS ignored, so the server produces exactly
  ``prompt.output_tokens`` tokens (built before the level, off the hot path);
- ``read_event(event, prev)``: what one decoded SSE event says (``workers.benchmark.stream`` runs it per
  event after the level, never on the hot path): the completion tokens so far, the prompt's tokens, whether
  the event carries output (given ``prev``, the count already seen), a server-side failure, and the
  speculative accept length. SGLang counts in each event's ``meta_info``; the OpenAI APIs in ``usage``,
  which the body asks for in every chunk (``continuous_usage_stats``) and at the end (``include_usage``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from workers.errors import BenchbotError
from workers.json_value import JsonObject, JsonValue, RawJson

if TYPE_CHECKING:
    from workers.benchmark.prompts import Prompt

PromptShape = Literal["token_ids", "messages"]
#: One event's reading: (completion tokens so far, prompt tokens, carries output, error, accept length).
#: A plain tuple, not a dataclass: it is made once per streamed token event.
EventReading = tuple[int | None, int | None, bool, str | None, float | None]


@dataclass(frozen=True)
class WireApi:
    """One request API: where it is served, what a request says, how its stream counts tokens."""

    name: str
    path: str
    prompt_shape: PromptShape
    needs_model: bool
    body: Callable[[Prompt, str | None], JsonObject]
    read_event: Callable[[RawJson, int], EventReading]

    def encode_body(self, prompt: Prompt, model: str | None) -> bytes:
        """The request's compact JSON bytes (what the senders post as they are)."""
        return json.dumps(self.body(prompt, model), separators=(",", ":")).encode()


# --- request bodies ------------------------------------------------------------------------------------


def _joined(prompt: Prompt) -> str:
    """The prompt as one text: its text, or its messages' contents joined by blank lines."""
    if prompt.text is not None:
        return prompt.text
    return "\n\n".join(content for _, content in prompt.messages or ())


def _generate_body(prompt: Prompt, model: str | None) -> JsonObject:
    body: JsonObject = {
        "sampling_params": {"max_new_tokens": prompt.output_tokens, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    if prompt.token_ids is not None:
        body["input_ids"] = list(prompt.token_ids)
    else:
        body["text"] = _joined(prompt)
    return body


def _openai_body(model: str | None, key: str, value: JsonValue, prompt: Prompt) -> JsonObject:
    """The OpenAI body around its input (``prompt`` or ``messages``), asking for usage in every chunk."""
    return {
        "model": model,
        key: value,
        "max_tokens": prompt.output_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


def _completions_body(prompt: Prompt, model: str | None) -> JsonObject:
    value: JsonValue = list(prompt.token_ids) if prompt.token_ids is not None else _joined(prompt)
    return _openai_body(model, "prompt", value, prompt)


def _chat_body(prompt: Prompt, model: str | None) -> JsonObject:
    messages: JsonValue = prompt.chat_messages() if prompt.messages else [{"role": "user", "content": _joined(prompt)}]
    return _openai_body(model, "messages", messages, prompt)


# --- stream events -------------------------------------------------------------------------------------


def _read_generate(event: RawJson, prev: int) -> EventReading:
    """SGLang: the cumulative ``completion_tokens`` in ``meta_info``; output is a count that grew."""
    meta = event.get("meta_info") or {}
    count = meta.get("completion_tokens")
    count = count if isinstance(count, int) else None
    prompt = meta.get("prompt_tokens")
    prompt = prompt if isinstance(prompt, int) else None
    output = count is not None and count > prev
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        return count, prompt, output, f"request aborted by server: {finish.get('message') or finish}", None
    accept = meta.get("spec_accept_length")
    return count, prompt, output, None, float(accept) if accept is not None else None


def _with_usage(event: RawJson, output: bool) -> EventReading:
    """An OpenAI event's reading: its ``usage`` counts (per chunk and final) beside ``output``."""
    usage = event.get("usage") or {}
    count = usage.get("completion_tokens")
    prompt = usage.get("prompt_tokens")
    return count if isinstance(count, int) else None, prompt if isinstance(prompt, int) else None, output, None, None


def _read_completions(event: RawJson, prev: int) -> EventReading:
    """OpenAI completions: output is a first choice with non-empty ``text``."""
    choices = event.get("choices") or []
    text = choices[0].get("text") if choices and isinstance(choices[0], dict) else None
    return _with_usage(event, isinstance(text, str) and text != "")


def _read_chat(event: RawJson, prev: int) -> EventReading:
    """OpenAI chat: output is a first choice whose ``delta.content`` is non-empty."""
    choices = event.get("choices") or []
    delta = choices[0].get("delta") if choices and isinstance(choices[0], dict) else None
    content = delta.get("content") if isinstance(delta, dict) else None
    return _with_usage(event, isinstance(content, str) and content != "")


# --- the table -----------------------------------------------------------------------------------------

WIRE_APIS: dict[str, WireApi] = {
    api.name: api
    for api in (
        WireApi("generate", "/generate", "token_ids", False, _generate_body, _read_generate),
        WireApi("completions", "/v1/completions", "token_ids", True, _completions_body, _read_completions),
        WireApi("chat", "/v1/chat/completions", "messages", True, _chat_body, _read_chat),
    )
}
#: The API names, in the table's order (what ``/bench api=`` accepts).
APIS = tuple(WIRE_APIS)


def wire_api(name: str) -> WireApi:
    """The table's entry for ``name``; a BenchbotError naming the known APIs for any other name."""
    api = WIRE_APIS.get(name)
    if api is None:
        raise BenchbotError(f'unknown API "{name}": use one of {", ".join(WIRE_APIS)}')
    return api
