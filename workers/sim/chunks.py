"""Byte templates for streamed chunks (OpenAI completions/chat and SGLang /generate).

The hot path of a streaming server is "format one small JSON per token per stream". OpenAI chunks
are therefore built from pre-encoded per-request prefixes plus the pre-encoded JSON bodies of the
word pieces; only the delta, the finish fields and the optional ``sim_t_*`` timestamps vary.
"""

from __future__ import annotations

import json

from workers.sim import text

NULL = b"null"
DONE = b"data: [DONE]\n\n"


def j(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def piece_bytes(pieces: list[int], lo: int, hi: int) -> bytes:
    """JSON string body (no quotes) of pieces[lo:hi]."""
    vocab = text.VOCAB_JSON
    return b"".join([vocab[i] for i in pieces[lo:hi]])


def piece_text(pieces: list[int], lo: int, hi: int) -> str:
    vocab = text.VOCAB
    return "".join([vocab[i] for i in pieces[lo:hi]])


def sim_fields(t_recv: float, t_sched: float, t_emit: float) -> bytes:
    return b',"sim_t_recv":%.6f,"sim_t_sched":%.6f,"sim_t_emit":%.6f' % (t_recv, t_sched, t_emit)


def finish_bytes(finish: str | None) -> tuple[bytes, bytes]:
    """(finish_reason, matched_stop) JSON for an OpenAI choice."""
    if finish is None:
        return NULL, NULL
    if finish == "stop":
        return b'"stop"', str(text.EOS_TOKEN_ID).encode()
    return b'"' + finish.encode() + b'"', NULL


class OpenAIFormat:
    """Per-request byte prefixes for completion or chat chunks."""

    __slots__ = ("chat", "head")

    def __init__(self, rid: str, created: int, model: str, chat: bool) -> None:
        self.chat = chat
        obj = b"chat.completion.chunk" if chat else b"text_completion"
        self.head = (
            b'data: {"id":"' + rid.encode() + b'","object":"' + obj + b'","created":' + str(created).encode()
            + b',"model":' + j(model) + b',"choices":[{"index":'
        )

    def content(self, index: int, delta: bytes, finish: str | None, tail: bytes = b"") -> bytes:
        fr, ms = finish_bytes(finish)
        if self.chat:
            body = (b',"delta":{"role":null,"content":"' + delta
                    + b'","reasoning_content":null,"tool_calls":null},"logprobs":null')
        else:
            body = b',"text":"' + delta + b'","logprobs":null'
        return (self.head + str(index).encode() + body + b',"finish_reason":' + fr + b',"matched_stop":' + ms
                + b'}],"usage":null' + tail + b"}\n\n")

    def role(self, index: int) -> bytes:
        return (self.head + str(index).encode()
                + b',"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null},'
                b'"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}\n\n')

    def finish(self, index: int, finish: str) -> bytes:
        fr, ms = finish_bytes(finish)
        return (self.head + str(index).encode() + b',"delta":{},"logprobs":null,"finish_reason":' + fr
                + b',"matched_stop":' + ms + b'}],"usage":null}\n\n')

    def usage(self, usage: dict) -> bytes:
        head = self.head[: -len(b'[{"index":')]
        return head + b'[],"usage":' + j(usage) + b"}\n\n"


def usage_dict(prompt: int, completion: int, cached: int | None = None) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached} if cached is not None else None,
        "reasoning_tokens": 0,
    }
