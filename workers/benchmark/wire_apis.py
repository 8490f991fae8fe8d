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
  which the body asks for in every chunk (``continuous_usage_stats``) and at the end (``include_usage``);
- ``ask_body(text, model, max_tokens)`` and ``read_answer(reply)``: the same API asked once, greedy and
  not streamed, and its reply's (text, finish reason, completion tokens): how ``workers.evaluation``
  puts a task's questions (a request body there merges the eval's ``extra_body`` over this one).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from workers.errors import BenchbotError
from workers.json_value import JsonObject, JsonValue

if TYPE_CHECKING:
    from workers.benchmark.prompts import Prompt

PromptShape = Literal["token_ids", "messages"]
#: One decoded SSE event (a JSON object), read field by field and each field narrowed where it is read.
Event = Mapping[str, object]
#: One event's reading: (completion tokens so far, prompt tokens, carries output, error, accept length).
#: A plain tuple, not a dataclass: it is made once per streamed token event.
EventReading = tuple[int | None, int | None, bool, str | None, float | None]
#: A non-streamed reply's reading: (its text, its finish reason, its completion tokens).
Answer = tuple[str | None, str | None, int]


@dataclass(frozen=True)
class WireApi:
    """One request API: where it is served, what a request says, how its stream counts tokens."""

    name: str
    path: str
    prompt_shape: PromptShape
    needs_model: bool
    body: Callable[[Prompt, str | None], JsonObject]
    read_event: Callable[[Event, int], EventReading]
    ask_body: Callable[[str, str | None, int], JsonObject]
    read_answer: Callable[[Any], Answer]

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


def _read_generate(event: Event, prev: int) -> EventReading:
    """SGLang: the cumulative ``completion_tokens`` in ``meta_info``; output is a count that grew."""
    meta = event.get("meta_info")
    if not isinstance(meta, dict):
        return None, None, False, None, None
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


def _with_usage(event: Event, output: bool) -> EventReading:
    """An OpenAI event's reading: its ``usage`` counts (per chunk and final) beside ``output``."""
    usage = event.get("usage")
    if not isinstance(usage, dict):
        return None, None, output, None, None
    count = usage.get("completion_tokens")
    prompt = usage.get("prompt_tokens")
    return count if isinstance(count, int) else None, prompt if isinstance(prompt, int) else None, output, None, None


def _first_choice(event: Event) -> dict[object, object] | None:
    choices = event.get("choices")
    return choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None


def _read_completions(event: Event, prev: int) -> EventReading:
    """OpenAI completions: output is a first choice with non-empty ``text``."""
    choice = _first_choice(event)
    text = choice.get("text") if choice is not None else None
    return _with_usage(event, isinstance(text, str) and text != "")


def _read_chat(event: Event, prev: int) -> EventReading:
    """OpenAI chat: output is a first choice whose ``delta.content`` is non-empty."""
    choice = _first_choice(event)
    delta = choice.get("delta") if choice is not None else None
    content = delta.get("content") if isinstance(delta, dict) else None
    return _with_usage(event, isinstance(content, str) and content != "")


# --- one greedy question, not streamed (evaluations) ----------------------------------------------------


def _generate_ask(text: str, model: str | None, max_tokens: int) -> JsonObject:
    return {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": max_tokens}}


def _openai_ask(model: str | None, max_tokens: int) -> JsonObject:
    return {"model": model, "temperature": 0, "max_tokens": max_tokens, "stream": False}


def _completions_ask(text: str, model: str | None, max_tokens: int) -> JsonObject:
    return {**_openai_ask(model, max_tokens), "prompt": text}


def _chat_ask(text: str, model: str | None, max_tokens: int) -> JsonObject:
    return {**_openai_ask(model, max_tokens), "messages": [{"role": "user", "content": text}]}


def _generate_answer(reply: Any) -> Answer:
    """SGLang's reply (a list of one when batched): ``text`` and ``meta_info``'s finish type and count."""
    if isinstance(reply, list):
        reply = reply[0] if reply else {}
    meta = reply.get("meta_info") or {}
    finish = meta.get("finish_reason")
    finish = finish.get("type") if isinstance(finish, Mapping) else finish
    return reply.get("text"), finish, int(meta.get("completion_tokens") or 0)


def _openai_choice(reply: Any) -> tuple[Any, int]:
    """An OpenAI reply's first choice and its ``usage.completion_tokens``."""
    choice = (reply.get("choices") or [{}])[0]
    usage = reply.get("usage") or {}
    return choice, int(usage.get("completion_tokens") or 0)


def _completions_answer(reply: Any) -> Answer:
    choice, tokens = _openai_choice(reply)
    return choice.get("text"), choice.get("finish_reason"), tokens


def _chat_answer(reply: Any) -> Answer:
    """The message's content; a reply cut off while thinking (a reasoning parser split it off) says so."""
    choice, tokens = _openai_choice(reply)
    message = choice.get("message") or {}
    text = message.get("content")
    reasoning = message.get("reasoning_content")
    if not text and reasoning:
        text = "<think>" + reasoning
    return text, choice.get("finish_reason"), tokens


# --- the table -----------------------------------------------------------------------------------------

WIRE_APIS: dict[str, WireApi] = {
    api.name: api
    for api in (
        WireApi(
            name="generate",  # SGLang's native API
            path="/generate",
            prompt_shape="token_ids",
            needs_model=False,
            body=_generate_body,
            read_event=_read_generate,
            ask_body=_generate_ask,
            read_answer=_generate_answer,
        ),
        WireApi(
            name="completions",
            path="/v1/completions",
            prompt_shape="token_ids",
            needs_model=True,
            body=_completions_body,
            read_event=_read_completions,
            ask_body=_completions_ask,
            read_answer=_completions_answer,
        ),
        WireApi(
            name="chat",
            path="/v1/chat/completions",
            prompt_shape="messages",
            needs_model=True,
            body=_chat_body,
            read_event=_read_chat,
            ask_body=_chat_ask,
            read_answer=_chat_answer,
        ),
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
