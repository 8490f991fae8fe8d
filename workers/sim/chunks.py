"""Byte templates for streamed chunks (OpenAI completions/chat and SGLang /generate), and the socket
writer the scheduler's tick uses to send them without a task switch.

The hot path of a streaming server is "format one small JSON per token per stream". Chunks are
therefore built from pre-encoded per-request prefixes plus the pre-encoded JSON bodies of the word
pieces; only the delta (or, for /generate, the growing cumulative text and ids), the token count, the
finish fields and the optional ``sim_t_*`` timestamps vary. No ``json.dumps`` per token.
"""

from __future__ import annotations

import asyncio
import json

from workers.sim import text

NULL = b"null"
DONE = b"data: [DONE]\n\n"
ID_JSON: list[bytes] = [str(text.token_id(i)).encode() for i in range(len(text.VOCAB))]
# A connection whose transport queues more than this (the kernel's socket buffer is already full) is not
# keeping up: stop writing from the tick and let the handler await the drain (bounded memory).
DIRECT_MAX_BUFFER = 1 << 20


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
            b'data: {"id":"'
            + rid.encode()
            + b'","object":"'
            + obj
            + b'","created":'
            + str(created).encode()
            + b',"model":'
            + j(model)
            + b',"choices":[{"index":'
        )

    def content(self, index: int, delta: bytes, finish: str | None, tail: bytes = b"", usage: bytes = NULL) -> bytes:
        """One content chunk; ``usage`` is the JSON of a continuous usage object (else null)."""
        fr, ms = finish_bytes(finish)
        if self.chat:
            body = (
                b',"delta":{"role":null,"content":"'
                + delta
                + b'","reasoning_content":null,"tool_calls":null},"logprobs":null'
            )
        else:
            body = b',"text":"' + delta + b'","logprobs":null'
        return (
            self.head
            + str(index).encode()
            + body
            + b',"finish_reason":'
            + fr
            + b',"matched_stop":'
            + ms
            + b'}],"usage":'
            + usage
            + tail
            + b"}\n\n"
        )

    def role(self, index: int) -> bytes:
        return (
            self.head
            + str(index).encode()
            + b',"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null},'
            b'"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}\n\n'
        )

    def finish(self, index: int, finish: str) -> bytes:
        fr, ms = finish_bytes(finish)
        return (
            self.head
            + str(index).encode()
            + b',"delta":{},"logprobs":null,"finish_reason":'
            + fr
            + b',"matched_stop":'
            + ms
            + b'}],"usage":null}\n\n'
        )

    def usage(self, usage: dict) -> bytes:
        head = self.head[: -len(b'[{"index":')]
        return head + b'[],"usage":' + j(usage) + b"}\n\n"


def usage_dict(prompt: int, completion: int, cached: int | None = None) -> dict:
    """SGLang's UsageInfo, fields in its order; ``prompt_tokens_details`` only for a cache hit it reports."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached} if cached else None,
        "reasoning_tokens": 0,
    }


def usage_bytes(prompt: int, completion: int) -> bytes:
    """A continuous-usage object (``stream_options.continuous_usage_stats``) without a json.dumps."""
    return (
        b'{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":null,'
        b'"reasoning_tokens":0}' % (prompt, prompt + completion, completion)
    )


class GenerateFormat:
    """Non-final ``/generate`` stream chunks of one request, from byte templates.

    SGLang resends the whole text and all ``output_ids`` in every chunk, so the stream keeps its
    cumulative text and id list as growing byte buffers: a chunk costs a few concatenations instead of
    a ``json.dumps`` of an ever larger object. Same keys and order as ``SimServer._generate_obj``.
    """

    __slots__ = ("ids", "mid", "tail", "text", "upto")

    def __init__(self, rid: str, prompt_tokens: int, cached_tokens: int, index: int | None = None) -> None:
        self.text = bytearray()
        self.ids = bytearray()
        self.upto = 0
        self.mid = (
            b'],"meta_info":{"id":' + j(rid) + b',"finish_reason":null,"prompt_tokens":%d'
            b',"weight_version":"default","total_retractions":0,"completion_tokens":' % prompt_tokens
        )
        self.tail = b',"cached_tokens":%d,"cached_tokens_details":null}' % cached_tokens
        if index is not None:
            self.tail += b',"index":%d' % index

    def chunk(self, pieces: list[int], upto: int, sim: bytes = b"") -> bytes:
        """``data: {...}\n\n`` with pieces[:upto]; ``sim`` is ``sim_fields(...)`` or empty."""
        if upto > self.upto:
            vocab, ids_json, txt, ids = text.VOCAB_JSON, ID_JSON, self.text, self.ids
            for p in pieces[self.upto : upto]:
                txt += vocab[p]
                if ids:
                    ids += b","
                ids += ids_json[p]
            self.upto = upto
        return b"".join(
            (
                b'data: {"text":"',
                self.text,
                b'","output_ids":[',
                self.ids,
                self.mid,
                b"%d" % upto,
                self.tail,
                sim,
                b"}\n\n",
            )
        )


class SocketWriter:
    """HTTP/1.1 chunked-encoding writes straight to a response's connection, from synchronous code.

    The scheduler's tick calls ``send`` for every due stream (see ``engine.Sink.direct``); the handler
    keeps using ``StreamResponse.write`` for everything else, which frames chunks the same way, so the
    wire format is identical. ``busy`` is set while the handler itself writes (its write may await a
    drain), so a tick never overtakes it. Only for a prepared, chunked response whose headers went out.
    """

    __slots__ = ("busy", "transport")

    def __init__(self, transport: asyncio.Transport | None) -> None:
        self.transport = transport
        self.busy = False

    def ready(self) -> bool:
        """Whether ``send`` may be used now (else the handler must write, after awaiting a drain)."""
        t = self.transport
        return not self.busy and t is not None and not t.is_closing() and t.get_write_buffer_size() <= DIRECT_MAX_BUFFER

    def send(self, data: bytes) -> None:
        """Send one chunk now (check ``ready()`` first)."""
        self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))  # type: ignore[union-attr]
