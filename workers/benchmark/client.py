"""Streaming load generator for SGLang-style and OpenAI-compatible servers: closed loop or open loop.

A level is either a closed loop (exactly C requests in flight) or an open loop (requests arrive at a
rate on a precomputed schedule, ``workers.benchmark.schedule``); requests go to ``/generate``,
``/v1/completions`` or ``/v1/chat/completions``, with prompts planned by ``workers.benchmark.prompts``
(local token ids or text by default; length distributions, a shared prefix, or a dataset).

Accuracy first (docs/metrics.md, "Client accuracy" and "Open-loop arrivals", says why):
- the hot path is aiohttp on uvloop: one shared ``ClientSession`` (``TCPConnector(limit=0)``, 10 MB read
  buffer), ``resp.content.readany()`` (``iter_any``), and per read only ``perf_counter_ns()`` + append of
  the raw bytes;
- SSE splitting and JSON parsing happen after the whole level has finished, so parsing one stream never
  delays the timestamps of the others;
- output tokens come from the server (``meta_info.completion_tokens`` / ``usage.completion_tokens``);
- prompts are generated locally by default (token ids of exact length, different per request so the
  prefix cache cannot help, unless a shared prefix is asked for); the client measures its own CPU and
  event-loop lag and flags a level it could not keep up with; when one loop is not enough the load
  is sharded over processes, each with its own uvloop;
- an optional ``gate()`` runs before every request is sent (each level's first included): a job passes its
  lease fence check, so a worker that lost its host stops sending at once. It raises to abort the bench
  (the other in-flight requests are cancelled) and costs a clock comparison on the hot path;
- every response is bounded (``workers.benchmark.limits``: bytes, head, line length, time to the head,
  silences, the whole request), a counter comparison per read plus one watchdog per sender; a request
  cut by a bound is an error naming the option, and the level counts them (``LevelMetrics.cut``).
Metric definitions live in ``workers.benchmark.metrics`` and docs/metrics.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import multiprocessing
import os
import random
import resource
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from workers.benchmark import schedule as arrivals_schedule
from workers.benchmark import wire
from workers.benchmark.dataset import Dataset
from workers.benchmark.lengths import Fixed, LengthDist
from workers.benchmark.limits import DEFAULT_LIMITS, DEFAULT_TIMEOUT_S, Budget, ResponseLimits
from workers.benchmark.metrics import ClientLoad, LevelMetrics, RequestRecord, level_metrics
from workers.benchmark.prompts import Prompt, plan_prompts
from workers.capped_http import capped_client
from workers.errors import BenchbotError, LeaseLostError

APIS = ("generate", "completions", "chat")
PATHS = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}
#: An open-loop level without ``n=`` or ``duration=`` sends this many seconds of arrivals (at least 8).
DEFAULT_OPEN_LOOP_S = 20.0
READ_BUFSIZE = 10 * 2**20
#: The most a warm-up ``GET /v1/models`` may answer before its connection is dropped instead of pooled.
TOUCH_MAX_BYTES = 2**20
STREAMS_PER_PROCESS = 256
# Prompt ids are drawn from this range: real tokens in every common vocabulary, clear of special ids.
ID_RANGE = range(1000, 30000)
_Read = tuple[int, bytes]
#: Called before each request is sent; raises (e.g. LeaseLostError) to abort the bench. Picklable when
#: the level runs in several processes.
Gate = Callable[[], None]


# --- parameters and results --------------------------------------------------------------------------


def default_num_requests(level: int) -> int:
    """Four full waves of the closed loop (at least 8 requests): enough for a steady plateau."""
    return max(8, 4 * level)


def default_warmup(level: int) -> int:
    """Enough to open some connections and wake the server, cheap at every level."""
    return min(level, 8)


def default_open_loop_requests(rate: float, duration_s: float | None = None) -> int:
    """Arrivals in ``duration_s`` (default :data:`DEFAULT_OPEN_LOOP_S`) at ``rate``, at least 8."""
    return max(8, math.ceil(rate * (duration_s if duration_s is not None else DEFAULT_OPEN_LOOP_S)))


@dataclass(frozen=True)
class BenchParams:
    """A sweep over load levels; ``None`` counts scale with each level (see the defaults above).

    Levels are concurrency levels (``levels``: closed loop) or request rates (``rates``: open loop,
    ``arrivals`` poisson or constant), never both. Lengths are fixed (``input_len``/``output_len``)
    unless ``input_dist``/``output_dist`` give a distribution; ``dataset`` supplies real prompts;
    ``prefix_tokens`` makes every request of a level share its first tokens (prefix-cache studies).

    ``seed=None`` draws a fresh seed per sweep: a server's prefix cache survives between runs, so
    repeating yesterday's prompts would measure cached prefills. Each level also gets its own prompts.
    """

    levels: tuple[int, ...] = ()
    input_len: int = 1024
    output_len: int = 256
    num_requests: int | None = None
    warmup: int | None = None
    api: str = "generate"
    model: str | None = None
    api_key: str | None = None
    seed: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    processes: int | None = None
    rates: tuple[float, ...] = ()
    arrivals: str = "poisson"
    duration_s: float | None = None
    input_dist: LengthDist | None = None
    output_dist: LengthDist | None = None
    prefix_tokens: int = 0
    dataset: Dataset | None = None
    client: str = "auto"  # the hot path: auto (wire for http://, else aiohttp), wire, aiohttp
    #: Bounds on every response (its ``timeout_s`` is this one's ``timeout_s``, which wins).
    limits: ResponseLimits = DEFAULT_LIMITS

    def __post_init__(self) -> None:
        if bool(self.levels) == bool(self.rates):
            raise BenchbotError("Give concurrency levels or request rates (rate=...), one of the two.")
        if any(not isinstance(c, int) or c < 1 for c in self.levels):
            raise BenchbotError(f"Concurrency levels must be positive whole numbers, got {self.levels!r}.")
        if any(not r > 0 or not math.isfinite(r) for r in self.rates):
            raise BenchbotError(f"Request rates must be positive numbers, got {self.rates!r}.")
        if self.arrivals not in arrivals_schedule.PATTERNS:
            raise BenchbotError(
                f"Unknown arrival pattern {self.arrivals!r}; use one of: {', '.join(arrivals_schedule.PATTERNS)}."
            )
        if self.duration_s is not None and not self.duration_s > 0:
            raise BenchbotError("An open-loop duration must be positive.")
        _check_lengths(self.input_len, self.output_len, self.api)
        if self.num_requests is not None and self.num_requests < 1:
            raise BenchbotError("The number of requests per level must be at least 1.")
        if self.prefix_tokens < 0:
            raise BenchbotError("A shared prefix is at least 0 tokens.")

    @property
    def open_loop(self) -> bool:
        return bool(self.rates)

    def in_dist(self) -> LengthDist:
        return self.input_dist if self.input_dist is not None else Fixed(self.input_len)

    def out_dist(self) -> LengthDist:
        return self.output_dist if self.output_dist is not None else Fixed(self.output_len)

    def requests_for(self, level: float) -> int:
        if self.num_requests is not None:
            return self.num_requests
        if self.open_loop:
            return default_open_loop_requests(level, self.duration_s)
        return default_num_requests(int(level))

    def warmup_for(self, level: float) -> int:
        if self.warmup is not None:
            return self.warmup
        return default_warmup(max(1, math.ceil(level)))

    def loads(self) -> tuple[float, ...]:
        """The levels in order: concurrencies, or rates for an open loop."""
        return self.rates if self.open_loop else tuple(float(c) for c in self.levels)

    def shape(self) -> str:
        """``1024 in / 256 out tokens``, ``512-2048 in / dataset out tokens, prefix 256`` ..."""
        text = f"{self.in_dist().describe()} in / {self.out_dist().describe()} out tokens"
        if self.prefix_tokens:
            text += f", shared prefix {self.prefix_tokens}"
        if self.dataset is not None:
            text += f", prompts from {os.path.basename(self.dataset.path)}"
        if self.api != "generate":
            text += f", {self.api} API"
        return text


@dataclass(frozen=True)
class LevelResult:
    """The metrics of one level, plus the raw records when they were asked for (not stored by default)."""

    metrics: LevelMetrics
    records: tuple[RequestRecord, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return self.metrics.to_dict()


def _check_lengths(input_len: int, output_len: int, api: str) -> None:
    if api not in APIS:
        raise BenchbotError(f"Unknown bench API {api!r}; use one of: {', '.join(APIS)}.")
    if input_len < 1 or output_len < 1:
        raise BenchbotError("Input and output lengths must be at least 1 token.")


# --- prompts -------------------------------------------------------------------------------------------


def prompt_ids(seed: int, index: int, input_len: int) -> list[int]:
    """Deterministic, per-request distinct token ids: exact length, no shared prefix between requests."""
    rng = random.Random(f"{seed}:{index}")
    return rng.choices(ID_RANGE, k=input_len)


def prompt_body(api: str, prompt: Prompt, model: str | None) -> bytes:
    """One request's JSON: greedy, EOS ignored (exactly ``prompt.output_tokens`` tokens), streamed.

    Token ids go as ids (``input_ids`` / ``prompt``: exact lengths); text goes as text; chat sends
    messages. OpenAI APIs ask for the usage in every chunk (``continuous_usage_stats``) so each chunk's
    token count is known, and for the final usage, whose ``prompt_tokens`` is the exact input length.
    """
    body: dict[str, Any]
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
    body = {"model": model}
    if api == "chat":
        body["messages"] = prompt.chat_messages() if prompt.messages else [{"role": "user", "content": _joined(prompt)}]
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


# --- SSE parsing (after the level, never on the hot path) ----------------------------------------------


def split_sse(reads: Sequence[_Read]) -> list[_Read]:
    """Raw reads -> ``(t_ns, data)`` per SSE event, timed by the read that completed the event.

    Events may be split across reads or several may share one read; multi-line ``data:`` fields are
    joined with newlines, comments and other fields are skipped. A final event without its blank line
    (connection closed) still counts, at the last read's time.
    """
    events: list[_Read] = []
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
    reads: tuple[_Read, ...]
    error: str | None = None


def _error_text(err: Any) -> str:
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
    times: list[int] = []
    tokens: list[int | None] = []
    kept: list[dict[str, Any]] = []
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
        if api == "generate":
            meta = obj.get("meta_info") or {}
            count = meta.get("completion_tokens")
            if isinstance(meta.get("prompt_tokens"), int):
                prompt_tokens = meta["prompt_tokens"]
            if isinstance(count, int):
                total = count
                if count > prev:
                    times.append(t)
                    tokens.append(count - prev)
                    prev = count
                    if keep_events:
                        kept.append(obj)
            finish = meta.get("finish_reason")
            if isinstance(finish, dict) and finish.get("type") == "abort":
                error = f"request aborted by server: {finish.get('message') or finish}"
                break
            if meta.get("spec_accept_length") is not None:
                accept = float(meta["spec_accept_length"])
        else:
            usage = obj.get("usage") or {}
            count = usage.get("completion_tokens")
            if isinstance(usage.get("prompt_tokens"), int):
                prompt_tokens = usage["prompt_tokens"]
            if isinstance(count, int):
                total = count
            choices = obj.get("choices") or []
            text = _choice_text(choices[0], api) if choices and isinstance(choices[0], dict) else None
            if text:
                times.append(t)
                if isinstance(count, int) and count > prev:  # per-chunk usage (continuous_usage_stats)
                    tokens.append(count - prev)
                    prev = count
                else:
                    tokens.append(None)
                if keep_events:
                    kept.append(obj)
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


def _choice_text(choice: dict[str, Any], api: str) -> str | None:
    """The text a chunk's first choice carries: ``text`` (completions) or ``delta.content`` (chat)."""
    if api == "chat":
        delta = choice.get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
        return content if isinstance(content, str) else None
    text = choice.get("text")
    return text if isinstance(text, str) else None


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


# --- the hot path ----------------------------------------------------------------------------------


class _Watch:
    """One aiohttp request in flight, as the sender's watchdog sees it."""

    __slots__ = ("head", "t_last_ns", "t_send_ns", "timer", "why")

    def __init__(self, t_send_ns: int) -> None:
        self.t_send_ns = self.t_last_ns = t_send_ns
        self.head = False  # the status and headers arrived
        self.timer: asyncio.Timeout | None = None
        self.why: str | None = None  # set by the watchdog when it cut the request


class _AiohttpSender:
    """aiohttp on the hot path: for ``https://`` servers (and as the reference the wire client matches).

    Its parser bounds the head (``max_line_size``/``max_field_size`` at ``header_bytes``, 128 headers);
    the read loop bounds bytes and line length; a watchdog task expires a request's own deadline
    (``asyncio.Timeout.reschedule``) when its head is late or it goes silent.
    """

    def __init__(self, base_url: str, path: str, headers: dict[str, str], budget: Budget) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=300)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            read_bufsize=READ_BUFSIZE,
            max_line_size=budget.header_bytes,
            max_field_size=budget.header_bytes,
        )
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + path
        self.headers = headers
        self.budget = budget
        self._inflight: set[_Watch] = set()
        self._watchdog: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        """Cut a request whose head is late or that went silent: one pass per tick, nothing per chunk."""
        budget = self.budget
        first_ns, idle_ns = int(budget.first_byte_s * 1e9), int(budget.idle_s * 1e9)
        tick = min(1.0, max(0.02, min(budget.first_byte_s, budget.idle_s) / 4))
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(tick)
            now = time.perf_counter_ns()
            for w in list(self._inflight):
                if w.why is None and w.timer is not None:
                    if not w.head and now - w.t_send_ns > first_ns:
                        w.why = budget.no_first_byte()
                    elif w.head and now - w.t_last_ns > idle_ns:
                        w.why = budget.silent()
                    if w.why is not None:
                        with contextlib.suppress(RuntimeError):  # it may be exiting on its own this instant
                            w.timer.reschedule(loop.time())  # expire its deadline now: the send returns

    async def send(self, body: bytes) -> RawResponse:
        """One streamed request: stamp each read as it arrives, keep the bytes, decode nothing.

        The loop is ``iter_any()`` unrolled into ``readany()`` (one coroutine frame less per read), and the
        deadline is one ``asyncio.timeout`` per request rather than aiohttp's per-read timer context.
        Per read it adds a counter comparison for the byte budget and an ``rfind`` for the line length
        (an SSE event ends with its newline: found at once).
        """
        reads: list[_Read] = []
        append = reads.append
        clock = time.perf_counter_ns
        budget = self.budget
        max_bytes, max_line = budget.max_bytes, budget.line_bytes
        t_send = clock()
        watch = _Watch(t_send)
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())
        self._inflight.add(watch)
        error: str | None = None
        try:
            async with asyncio.timeout(budget.timeout_s) as timer:
                watch.timer = timer
                async with self.session.post(self.url, data=body, headers=self.headers) as resp:
                    watch.head, watch.t_last_ns = True, clock()
                    if resp.status != 200:
                        text = (await resp.content.read(300)).decode(errors="replace").strip()
                        return RawResponse(t_send, clock(), (), f"HTTP {resp.status}: {text}")
                    readany = resp.content.readany
                    got = run = 0
                    while data := await readany():
                        t = clock()
                        append((t, data))
                        watch.t_last_ns = t
                        got += len(data)
                        nl = data.rfind(b"\n")
                        run = run + len(data) if nl < 0 else len(data) - nl - 1
                        if got > max_bytes or run > max_line:
                            error = budget.too_big() if got > max_bytes else budget.line_too_long()
                            resp.close()  # drop the connection: nothing more is read
                            break
        except TimeoutError:
            return RawResponse(t_send, clock(), tuple(reads), watch.why or budget.timed_out())
        except aiohttp.ClientError as exc:
            return RawResponse(t_send, clock(), tuple(reads), _aiohttp_error(exc, budget))
        finally:
            self._inflight.discard(watch)
        return RawResponse(t_send, clock(), tuple(reads), error)

    def finish(self, item: RawResponse) -> RawResponse:
        return item

    async def open_connections(self, count: int) -> None:
        """Fill the keep-alive pool with ``count`` connections before timing starts, so the first wave's
        TTFT measures the server rather than ``count`` simultaneous TCP handshakes. ``GET /v1/models`` is
        cheap on SGLang (``/health`` would run a generation); any answer leaves a reusable connection.
        """
        url = self.base_url + "/v1/models"

        async def touch() -> None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with asyncio.timeout(10), self.session.get(url, headers=self.headers) as resp:
                    got = 0
                    while data := await resp.content.readany():  # the answer, up to what a model list is
                        got += len(data)
                        if got > TOUCH_MAX_BYTES:
                            resp.close()
                            break

        await asyncio.gather(*(touch() for _ in range(count)))

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        await self.session.close()


def _aiohttp_error(exc: aiohttp.ClientError, budget: Budget) -> str:
    """aiohttp's parser refusals in the words of the bound they hit (and short: its message quotes the
    offending bytes, an ``FFFF...`` line of any length); anything else as aiohttp says it."""
    text = f"{type(exc).__name__}: {exc}".strip(": ")
    short = text if len(text) <= 200 else text[:200] + "..."
    if isinstance(exc, aiohttp.ClientResponseError) and exc.status == 400:  # the response parser's refusal
        message = " ".join(str(exc.message).split())
        if any(w in message for w in ("Too many headers", "Got more than", "too long", "Line is too long")):
            return budget.head_too_big(message[:120])
        if "hunk" in message:
            return budget.bad_framing(message[:120])
    return short


class _WireSender:
    """The plain-http hot path (``workers.benchmark.wire``): one stamp per read, decoding after the level."""

    def __init__(self, base_url: str, path: str, headers: dict[str, str], budget: Budget) -> None:
        self.session = wire.WireSession(base_url, budget)
        self.path = path
        self.headers = headers

    async def send(self, body: bytes) -> wire.WireResponse:
        return await self.session.post(self.path, body, self.headers)

    def finish(self, item: wire.WireResponse) -> RawResponse:
        """The response as aiohttp would have delivered it: body reads, or the error."""
        status, reads, error = wire.decode(item)
        if error is None and status != 200:
            text = b"".join(chunk for _, chunk in reads)[:300].decode(errors="replace").strip()
            return RawResponse(item.t_send_ns, item.t_end_ns, (), f"HTTP {status}: {text}")
        return RawResponse(item.t_send_ns, item.t_end_ns, reads, error)

    async def open_connections(self, count: int) -> None:
        await self.session.open_connections(count)

    async def close(self) -> None:
        await self.session.close()


Sender = _AiohttpSender | _WireSender


def make_sender(base_url: str, path: str, headers: dict[str, str], budget: Budget, client: str = "auto") -> Sender:
    """``wire`` for plain ``http://`` (the default: a quarter of aiohttp's CPU per chunk), ``aiohttp`` otherwise."""
    use_wire = client == "wire" or (client == "auto" and base_url.startswith("http://"))
    if use_wire:
        return _WireSender(base_url, path, headers, budget)
    return _AiohttpSender(base_url, path, headers, budget)


async def _closed_loop(
    sender: Sender, bodies: Sequence[bytes], concurrency: int, gate: Gate | None = None
) -> list[Any]:
    """Exactly ``concurrency`` requests in flight: each worker sends its next request when one ends.

    ``gate()`` runs before each send, outside any error handling: if it raises (the lease is gone), the
    other workers are cancelled, in-flight requests included, and the exception propagates as it is.
    """
    results: list[Any] = [None] * len(bodies)
    todo = iter(range(len(bodies)))
    send = sender.send

    async def worker() -> None:
        for i in todo:  # one shared iterator: next() never awaits, so no index is taken twice
            if gate is not None:
                gate()
            results[i] = await send(bodies[i])

    tasks = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, len(bodies)))]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return [r for r in results if r is not None]


class LagProbe:
    """Sleeps in a loop and records the overshoot: how late the event loop runs a due callback.

    Any sleep length measures the same lag; 5 ms (200 samples/s) rather than 1 ms because every wake-up
    costs ~50 µs of CPU on a small VM, and a 1 ms probe would itself add 5 % CPU and some of the lag.
    """

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.samples_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        clock, sleep, append, period = time.perf_counter, asyncio.sleep, self.samples_ms.append, self.period_s
        while True:
            t0 = clock()
            await sleep(period)
            append(max(0.0, (clock() - t0 - period) * 1000))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> list[float]:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        return self.samples_ms


# --- one shard (one process, one loop) -----------------------------------------------------------------


@dataclass(frozen=True)
class ShardSpec:
    """Everything a shard needs, picklable so it can be shipped to a child process.

    ``offsets_ns`` makes it an open loop: measured request ``i`` is sent ``offsets_ns[i]`` after the
    shard's start, whatever is in flight; without it the shard keeps ``concurrency`` in flight.
    """

    base_url: str
    api: str
    concurrency: int
    warmup: tuple[Prompt, ...]
    measured: tuple[Prompt, ...]
    model: str | None
    api_key: str | None
    timeout_s: float
    keep_events: bool = False
    gate: Gate | None = None
    offsets_ns: tuple[int, ...] | None = None
    client: str = "auto"  # the hot path: wire (plain http), aiohttp, or auto (wire for http://)
    limits: ResponseLimits = DEFAULT_LIMITS  # its timeout is ``timeout_s`` above

    def budget(self) -> Budget:
        """The bounds for this shard's responses: sized for its longest asked output."""
        tokens = max((p.output_tokens for p in (*self.warmup, *self.measured)), default=0)
        return replace(self.limits, timeout_s=self.timeout_s).budget(tokens)


@dataclass(frozen=True)
class ShardOutput:
    records: tuple[RequestRecord, ...]
    load: ClientLoad
    scheduled_ns: tuple[int, ...] = ()  # open loop: each record's due send time (perf_counter_ns)
    stopped: str | None = None  # open loop: why the pacer stopped early, if it did


def _raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


async def _open_loop(
    sender: Sender, bodies: Sequence[bytes], offsets_ns: Sequence[int], gate: Gate | None = None
) -> tuple[list[Any], list[int], str | None]:
    """Send request ``i`` at ``offsets_ns[i]`` from now, whatever is in flight; wait for all to end.

    The gate runs in the pacer before each send (so what it raises stops the sending at once and the
    in-flight requests are cancelled). Returns the responses and their due times, in schedule order.
    A pacer that falls a whole minute behind gives up: the level would measure the client.
    """
    results: list[Any] = [None] * len(bodies)
    tasks: list[asyncio.Task[None]] = []
    send = sender.send

    async def one(i: int) -> None:
        results[i] = await send(bodies[i])

    def fire(i: int) -> None:
        if gate is not None:
            gate()
        tasks.append(asyncio.ensure_future(one(i)))

    schedule = arrivals_schedule.ArrivalSchedule(0.0, "given", None, tuple(o / 1e9 for o in offsets_ns))
    try:
        paced = await arrivals_schedule.pace(schedule, fire, give_up_lag_s=60.0)
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    sent = [(results[i], due) for i, due in zip(paced.indices, paced.scheduled_ns, strict=True)]
    return [r for r, _ in sent if r is not None], [d for r, d in sent if r is not None], paced.stopped


async def run_shard(spec: ShardSpec, barrier: Callable[[], Any] | None = None) -> ShardOutput:
    """Warm up, wait at ``barrier`` (multi-process start), run the measured loop (closed or open), decode."""
    in_flight = spec.concurrency if spec.offsets_ns is None else len(spec.measured)
    _raise_fd_limit(4 * in_flight + 256)
    headers = {"Content-Type": "application/json"}
    if spec.api_key:
        headers["Authorization"] = f"Bearer {spec.api_key}"

    def bodies(prompts: Sequence[Prompt]) -> list[bytes]:
        return [prompt_body(spec.api, p, spec.model) for p in prompts]

    loop_name = "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
    sender = make_sender(spec.base_url, PATHS[spec.api], headers, spec.budget(), spec.client)
    scheduled: list[int] = []
    stopped = None
    try:
        if spec.warmup:
            await _closed_loop(sender, bodies(spec.warmup), spec.concurrency, spec.gate)
        if spec.gate is not None:
            spec.gate()
        await sender.open_connections(min(spec.concurrency, len(spec.measured)))
        measured = bodies(spec.measured)
        if barrier is not None:
            await barrier()
        gc_was_enabled = gc.isenabled()
        gc.collect()
        gc.disable()  # a full collection over many live buffers is a multi-ms pause in the timing path
        probe = LagProbe()
        probe.start()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        try:
            if spec.offsets_ns is None:
                items = await _closed_loop(sender, measured, spec.concurrency, spec.gate)
            else:
                items, scheduled, stopped = await _open_loop(sender, measured, spec.offsets_ns, spec.gate)
        finally:
            cpu1, wall1 = time.process_time(), time.perf_counter()
            lags = await probe.stop()
            if gc_was_enabled:
                gc.enable()
    finally:
        await sender.close()
    raws = [sender.finish(item) for item in items]
    offset = time.time() - time.perf_counter()
    if spec.offsets_ns is None:
        prompts: Sequence[Prompt] = spec.measured[: len(raws)]
    else:
        prompts = [spec.measured[i] for i in range(len(raws))]
    records = tuple(
        record_from_raw(r, spec.api, p.input_tokens, offset, spec.keep_events, p.exact_input)
        for r, p in zip(raws, prompts, strict=True)
    )
    chunks = sum(len(r.chunk_t_ns) for r in records)
    load = ClientLoad(wall_s=wall1 - wall0, cpu_s=(cpu1 - cpu0,), chunks=chunks, lag_ms=tuple(lags), loop=loop_name)
    return ShardOutput(records, load, tuple(scheduled), stopped)


def _child_main(conn: Any, spec: ShardSpec) -> None:
    """Entry point of a shard process: its own uvloop, a start barrier driven by the parent."""
    import uvloop

    async def barrier() -> None:
        conn.send(("ready", None))
        _, start_ns = await asyncio.to_thread(conn.recv)
        delay = (start_ns - time.perf_counter_ns()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)

    try:
        out = uvloop.run(run_shard(spec, barrier))
        conn.send(("done", out))
    except LeaseLostError as exc:  # the parent re-raises it as what it is: the host is not ours
        conn.send(("lease_lost", str(exc)))
    except BaseException as exc:  # report anything to the parent rather than dying silently
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def auto_processes(concurrency: int) -> int:
    """One loop handles ~256 streams at 100 tok/s with sub-ms lag; beyond that use one process per
    256 streams, but at most half the cores (the other half may be serving)."""
    return max(1, min(math.ceil(concurrency / STREAMS_PER_PROCESS), (os.cpu_count() or 1) // 2))


def _raise_lease_lost(replies: Sequence[tuple[str, Any]]) -> None:
    for kind, message in replies:
        if kind == "lease_lost":
            raise LeaseLostError(str(message))


async def _run_processes(specs: Sequence[ShardSpec]) -> list[ShardOutput]:
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    try:
        for spec in specs:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_child_main, args=(child, spec), daemon=True)
            proc.start()
            child.close()
            pipes.append(parent)
            procs.append(proc)

        async def receive(conn: Any) -> tuple[str, Any]:
            try:
                return await asyncio.to_thread(conn.recv)
            except EOFError:
                return ("failed", "bench process exited without a result")

        ready = await asyncio.gather(*(receive(c) for c in pipes))
        _raise_lease_lost(ready)
        failed = [m for kind, m in ready if kind == "failed"]
        if failed:
            raise BenchbotError(f"A bench client process failed before the run: {failed[0]}")
        start_ns = time.perf_counter_ns() + 50_000_000
        for conn in pipes:
            conn.send(("go", start_ns))
        done = await asyncio.gather(*(receive(c) for c in pipes))
        _raise_lease_lost(done)
        failed = [m for kind, m in done if kind == "failed"]
        if failed:
            raise BenchbotError(f"A bench client process failed during the run: {failed[0]}")
        return [m for _, m in done]
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for conn in pipes:
            conn.close()


async def _first_model(base_url: str, api_key: str | None, gate: Gate | None = None) -> str:
    """``/v1/completions`` needs a model name: ask the server once (control plane, httpx)."""
    import httpx

    if gate is not None:
        gate()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with capped_client(timeout=10) as client:
            resp = await client.get(base_url.rstrip("/") + "/v1/models", headers=headers)
            resp.raise_for_status()
            return str(resp.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise BenchbotError(
            f"Could not read the model name from {base_url}/v1/models ({exc}); pass the model explicitly."
        ) from exc


# --- public API ----------------------------------------------------------------------------------------


async def run_level(
    base_url: str,
    *,
    concurrency: int | None = None,
    num_requests: int,
    input_len: int = 1024,
    output_len: int = 256,
    warmup: int,
    api: str = "generate",
    model: str | None = None,
    api_key: str | None = None,
    seed: int = 0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    processes: int | None = None,
    keep_records: bool = False,
    keep_events: bool = False,
    gate: Gate | None = None,
    rate: float | None = None,
    arrivals: str = "poisson",
    input_dist: LengthDist | None = None,
    output_dist: LengthDist | None = None,
    prefix_tokens: int = 0,
    dataset: Dataset | None = None,
    lag_limit_ms: float = arrivals_schedule.DEFAULT_LAG_LIMIT_MS,
    client: str = "auto",
    limits: ResponseLimits = DEFAULT_LIMITS,
) -> LevelResult:
    """Run one level: ``warmup`` requests (not measured), then ``num_requests`` measured ones, with
    exactly ``concurrency`` in flight (closed loop) or arriving at ``rate`` per second on a schedule
    drawn before the run (open loop). Errors are counted, never raised; bad arguments raise ``BenchbotError``.

    Prompts come from :func:`workers.benchmark.prompts.plan_prompts` (``input_dist``/``output_dist``
    default to the fixed ``input_len``/``output_len``). Runs on the caller's event loop when
    ``processes`` resolves to 1 (use uvloop: ``bench_sync`` or ``uvloop.run``), else in that many spawned
    processes, each with its own uvloop, started together (an open loop deals its schedule out round
    robin, so each process paces every P-th arrival from the same start). ``keep_records`` returns the
    per-request records too; ``keep_events`` also keeps each token event's parsed JSON (e.g. a
    simulator's ``sim_t_emit``), which is memory-hungry. ``gate()`` runs before every request (see the
    module docstring); in several processes each gets a pickled copy.
    """
    in_dist = input_dist if input_dist is not None else Fixed(input_len)
    out_dist = output_dist if output_dist is not None else Fixed(output_len)
    _check_lengths(
        in_dist.tokens if isinstance(in_dist, Fixed) else 1, out_dist.tokens if isinstance(out_dist, Fixed) else 1, api
    )
    if (concurrency is None) == (rate is None):
        raise BenchbotError("A level has a concurrency or a request rate, one of the two.")
    if (concurrency is not None and concurrency < 1) or num_requests < 1 or warmup < 0:
        raise BenchbotError("Concurrency and request count must be at least 1, warmup at least 0.")
    if api in ("completions", "chat") and not model:
        model = await _first_model(base_url, api_key, gate)
    # One plan: the measured requests first, then the warmup ones (indices after them, so no prompt is shared).
    planned = plan_prompts(
        num_requests + warmup,
        seed,
        api=api,
        input_len=in_dist,
        output_len=out_dist,
        prefix_tokens=prefix_tokens,
        dataset=dataset,
    )
    measured, warm = planned[:num_requests], planned[num_requests:]
    plan = None
    if rate is not None:
        plan = arrivals_schedule.make_schedule(rate, pattern=arrivals, num_requests=num_requests, seed=seed)
        streams = max(1, min(num_requests, math.ceil(rate * OPEN_LOOP_EXPECTED_S)))
        warm_conc = min(max(1, math.ceil(rate)), 8)
    else:
        assert concurrency is not None
        streams = concurrency
        warm_conc = concurrency
    nproc = auto_processes(streams) if processes is None else max(1, processes)
    nproc = min(nproc, streams, num_requests)
    # Each process: (its concurrency, its warmup prompts, its measured prompts, its send offsets or None).
    warm_parts = _deal(warm, _split(warmup, nproc))
    parts: Iterable[tuple[int, list[Prompt], list[Prompt], tuple[int, ...] | None]]
    if plan is None:
        parts = zip(
            _split(streams, nproc),
            warm_parts,
            _deal(measured, _split(num_requests, nproc)),
            [None] * nproc,
            strict=True,
        )
    else:
        offsets = plan.offsets_ns()
        mine = [range(k, num_requests, nproc) for k in range(nproc)]  # round robin: same start, every P-th
        parts = zip(
            [max(1, warm_conc // nproc)] * nproc,
            warm_parts,
            [[measured[i] for i in idx] for idx in mine],
            [tuple(offsets[i] for i in idx) for idx in mine],
            strict=True,
        )
    specs = [
        ShardSpec(
            base_url=base_url,
            api=api,
            concurrency=c,
            warmup=tuple(w),
            measured=tuple(m),
            model=model,
            api_key=api_key,
            timeout_s=timeout_s,
            keep_events=keep_events,
            gate=gate,
            offsets_ns=o,
            client=client,
            limits=limits,
        )
        for c, w, m, o in parts
    ]
    outs = [await run_shard(specs[0])] if nproc == 1 else await _run_processes(specs)
    records = [r for o in outs for r in o.records]
    if len(outs) > 1:
        load = ClientLoad(
            wall_s=max(o.load.wall_s for o in outs),
            cpu_s=tuple(c for o in outs for c in o.load.cpu_s),
            chunks=sum(o.load.chunks for o in outs),
            lag_ms=tuple(x for o in outs for x in o.load.lag_ms),
            loop=outs[0].load.loop,
        )
    else:
        load = outs[0].load
    if plan is None:
        assert concurrency is not None
        metrics = level_metrics(records, concurrency, [load])
    else:
        scheduled = [t for o in outs for t in o.scheduled_ns]
        stopped = next((o.stopped for o in outs if o.stopped), None)
        lag = arrivals_schedule.schedule_lag(
            scheduled,
            [r.t_send_ns for r in records],
            limit_ms=lag_limit_ms,
            requested=len(plan),
            stopped=stopped,
        )
        info: dict[str, Any] = {
            **plan.to_dict(),
            "lag": lag.to_dict(),
            "from_schedule": arrivals_schedule.latencies_from_schedule(records, scheduled),
        }
        metrics = level_metrics(records, 0, [load], rate=rate, arrivals=info)
    return LevelResult(metrics, tuple(records) if keep_records or keep_events else ())


#: An open loop's expected time in flight per request, to size its client processes (streams ~ rate x this).
OPEN_LOOP_EXPECTED_S = 4.0


def _deal(items: Sequence[Prompt], sizes: Sequence[int]) -> list[list[Prompt]]:
    """Consecutive slices of ``items`` of the given sizes."""
    out, at = [], 0
    for size in sizes:
        out.append(list(items[at : at + size]))
        at += size
    return out


def level_name(m: LevelMetrics) -> str:
    """``c=8`` for a closed-loop level, ``rate=2/s`` for an open-loop one."""
    return f"rate={m.rate:g}/s" if m.rate is not None else f"c={m.concurrency}"


def describe(m: LevelMetrics) -> str:
    """One progress line per finished level."""

    def ms(d: dict[str, float | None], key: str) -> str:
        v = d.get(key)
        return "-" if v is None else f"{v:.1f}"

    line = (
        f"{level_name(m)}: {m.completed}/{m.num_requests} ok, {m.output_tok_s:.0f} out tok/s, "
        f"TTFT p50 {ms(m.ttft_ms, 'p50')} ms, ITL p50 {ms(m.itl_ms, 'p50')} ms"
    )
    if m.arrivals is not None:
        lag = m.arrivals.get("lag") or {}
        line += f", peak {m.concurrency} in flight, send lag p99 {ms(lag, 'p99_ms')} ms"
        if lag.get("behind"):
            line += f" [behind schedule: {lag.get('reason')}]"
    if m.errors:
        line += f", {m.errors} errors ({m.error_samples[0]})"
    if m.cut:
        line += f" [cut off by response limits: {', '.join(f'{n} by {k}=' for k, n in sorted(m.cut.items()))}]"
    if m.client.get("bottleneck"):
        line += f" [client-bound: {m.client['reason']}]"
    return line


async def run_bench(
    base_url: str,
    params: BenchParams,
    *,
    on_progress: Callable[[str], None] | None = None,
    gate: Gate | None = None,
    keep_records: bool = False,
    around_level: Callable[[int, float], contextlib.AbstractAsyncContextManager[object]] | None = None,
) -> list[LevelResult]:
    """Run every level of ``params`` in order against one server; progress lines go to ``on_progress``.

    ``around_level(position, load)`` is entered just before a level and left just after it (the
    worker's GPU telemetry sampler: it samples exactly while the level runs).

    ``gate()`` runs before every request (so before each level's first); what it raises aborts the bench.
    ``keep_records`` returns each level's per-request records too (an SLO search counts good requests).
    """
    model = params.model
    if params.api in ("completions", "chat") and not model:
        model = await _first_model(base_url, params.api_key, gate)
    base_seed = params.seed if params.seed is not None else random.randrange(2**31)
    results = []
    for position, load in enumerate(params.loads()):
        n, w = params.requests_for(load), params.warmup_for(load)
        name = f"rate={load:g}/s" if params.open_loop else f"c={int(load)}"
        if on_progress:
            on_progress(f"{name}: running {n} requests ({w} warmup), {params.shape()}")
        scope = around_level(position, load) if around_level else contextlib.nullcontext()
        async with scope:
            result = await _run_one(
                base_url, params, load, n, w, model, base_seed * 1000 + position, gate, keep_records
            )
        results.append(result)
        if on_progress:
            on_progress(describe(result.metrics))
    return results


async def _run_one(
    base_url: str,
    params: BenchParams,
    load: float,
    n: int,
    w: int,
    model: str | None,
    seed: int,
    gate: Gate | None,
    keep_records: bool,
) -> LevelResult:
    """One level of ``params`` at ``load``."""
    return await run_level(
        base_url,
        concurrency=None if params.open_loop else int(load),
        rate=load if params.open_loop else None,
        arrivals=params.arrivals,
        num_requests=n,
        input_dist=params.in_dist(),
        output_dist=params.out_dist(),
        prefix_tokens=params.prefix_tokens,
        dataset=params.dataset,
        warmup=w,
        api=params.api,
        model=model,
        api_key=params.api_key,
        seed=seed,
        timeout_s=params.timeout_s,
        processes=params.processes,
        gate=gate,
        keep_records=keep_records,
        client=params.client,
        limits=params.limits,
    )


def bench_sync(
    base_url: str, params: BenchParams, *, on_progress: Callable[[str], None] | None = None
) -> list[LevelResult]:
    """``run_bench`` on a fresh uvloop, for synchronous callers such as RQ jobs."""
    import uvloop

    return uvloop.run(run_bench(base_url, params, on_progress=on_progress))
