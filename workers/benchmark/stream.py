"""Stream parsing, after the level and never on the hot path: raw reads -> SSE events -> a record.

The senders keep only ``(perf_counter_ns, bytes)`` per read (:class:`RawResponse`); once a level has
finished, :func:`record_from_raw` splits each response into SSE events, decodes their JSON and counts
the tokens each event carried (the server's own ``completion_tokens`` / ``usage``, read by the API's
``read_event`` in ``workers.benchmark.wire_apis``), so parsing one stream never delays the timestamps
of another. Metric definitions: ``workers.benchmark.metrics``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from workers.benchmark.metrics import RequestRecord
from workers.benchmark.wire_apis import wire_api
from workers.json_value import RawJson

#: One read of a response: its arrival (``perf_counter_ns``) and its bytes.
Read = tuple[int, bytes]


def split_sse(reads: Sequence[Read]) -> list[Read]:
    """Raw reads -> ``(t_ns, data)`` per SSE event, timed by the read that completed the event.

    Events may be split across reads or several may share one read; multi-line ``data:`` fields are
    joined with newlines, comments and other fields are skipped. A final event without its blank line
    (connection closed) still counts, at the last read's time.
    """
    events: list[Read] = []
    buf = bytearray()
    t = 0
    for t, chunk in reads:
        buf += chunk
        if b"\r" in chunk:
            buf = bytearray(bytes(buf).replace(b"\r\n", b"\n"))
        start = 0
        while (end := buf.find(b"\n\n", start)) >= 0:
            data = _event_data(bytes(buf[start:end]))
            if data is not None:
                events.append((t, data))
            start = end + 2
        del buf[:start]
    if buf.strip():
        data = _event_data(bytes(buf))
        if data is not None:
            events.append((t, data))
    return events


def _event_data(block: bytes) -> bytes | None:
    parts = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(parts) if parts else None


@dataclass(frozen=True)
class RawResponse:
    """What the hot path keeps for one request: timestamps and undecoded bytes (picklable)."""

    t_send_ns: int
    t_end_ns: int
    reads: tuple[Read, ...]
    error: str | None = None


def _error_text(err: object) -> str:
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err)


def record_from_raw(
    raw: RawResponse,
    api: str,
    input_len: int,
    wall_offset_s: float = 0.0,
    keep_events: bool = False,
    exact_input: bool = True,
) -> RequestRecord:
    """Decode one response into a ``RequestRecord``: token events, their token counts, errors.

    ``input_len`` is the planned prompt length; when it was an estimate (text prompts,
    ``exact_input=False``) the server's own ``prompt_tokens`` replaces it if the stream reported one.
    """
    if raw.error is not None:
        return RequestRecord(
            raw.t_send_ns, raw.t_end_ns, input_tokens=input_len, error=raw.error, wall_offset_s=wall_offset_s
        )
    read_event = wire_api(api).read_event  # once per record: the per-event loop below never names an API
    times: list[int] = []
    tokens: list[int | None] = []
    kept: list[RawJson] = []
    done = False
    error: str | None = None
    total: int | None = None
    prompt_tokens: int | None = None
    accept: float | None = None
    prev = 0
    for t, payload in split_sse(raw.reads):
        if payload.strip() == b"[DONE]":
            done = True
            continue
        try:
            obj = json.loads(payload)
        except ValueError:
            error = f"unparseable stream event: {payload[:120]!r}"
            break
        if not isinstance(obj, dict):
            continue
        if obj.get("error"):
            error = f"server error: {_error_text(obj['error'])}"
            break
        count, prompt, output, problem, seen_accept = read_event(obj, prev)
        if prompt is not None:
            prompt_tokens = prompt
        if count is not None:
            total = count
        if output:
            times.append(t)
            if count is not None and count > prev:  # the server's count (OpenAI: continuous_usage_stats)
                tokens.append(count - prev)
                prev = count
            else:
                tokens.append(None)
            if keep_events:
                kept.append(obj)
        if problem is not None:
            error = problem
            break
        if seen_accept is not None:
            accept = seen_accept
    if error is None and not done:
        error = "stream ended before [DONE]"
    if error is None and not times:
        error = "no output tokens in the response"
    counts = _fill_unknown(tokens, total)
    out = total if total is not None and total >= sum(counts) else sum(counts)
    t_end = raw.reads[-1][0] if raw.reads else raw.t_end_ns
    return RequestRecord(
        t_send_ns=raw.t_send_ns,
        t_end_ns=t_end,
        chunk_t_ns=tuple(times),
        chunk_tokens=tuple(counts),
        input_tokens=prompt_tokens if not exact_input and prompt_tokens else input_len,
        output_tokens=out,
        error=error,
        spec_accept_length=accept,
        wall_offset_s=wall_offset_s,
        events=tuple(kept) if keep_events else None,
    )


def _fill_unknown(tokens: Sequence[int | None], total: int | None) -> list[int]:
    """Chunks without per-chunk usage share what the final usage leaves, evenly (>= 1 each)."""
    unknown = [i for i, k in enumerate(tokens) if k is None]
    counts = [k or 0 for k in tokens]
    if not unknown:
        return counts
    remainder = (total if total is not None else len(unknown)) - sum(counts)
    base, extra = divmod(max(remainder, len(unknown)), len(unknown))
    for j, i in enumerate(unknown):
        counts[i] = base + (1 if j < extra else 0)
    return counts
