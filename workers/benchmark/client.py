"""Closed-loop streaming load generator for SGLang-style servers (``/generate`` and ``/v1/completions``).

Accuracy first (see shared/reference/bench-clients.md and sse-client-capacity.md for why):
- the hot path is aiohttp on uvloop: one shared ``ClientSession`` (``TCPConnector(limit=0)``, 10 MB read
  buffer), ``resp.content.readany()`` (``iter_any``), and per read only ``perf_counter_ns()`` + append of
  the raw bytes;
- SSE splitting and JSON parsing happen after the whole level has finished, so parsing one stream never
  delays the timestamps of the others;
- output tokens come from the server (``meta_info.completion_tokens`` / ``usage.completion_tokens``);
- prompts are token ids generated locally (exact input length, different per request so the prefix cache
  cannot help); the client measures its own CPU and event-loop lag and flags a level it could not keep up
  with; when one loop is not enough the load is sharded over processes, each with its own uvloop;
- an optional ``gate()`` runs before every request is sent (each level's first included): a job passes its
  lease fence check, so a worker that lost its host stops sending at once. It raises to abort the bench
  (the other in-flight requests are cancelled) and costs a clock comparison on the hot path.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from workers.benchmark.metrics import ClientLoad, LevelMetrics, RequestRecord, level_metrics
from workers.errors import BenchbotError, LeaseLostError

APIS = ("generate", "completions")
READ_BUFSIZE = 10 * 2**20
DEFAULT_TIMEOUT_S = 900.0
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


@dataclass(frozen=True)
class BenchParams:
    """A sweep over concurrency levels; ``None`` counts scale with each level (see the defaults above).

    ``seed=None`` draws a fresh seed per sweep: a server's prefix cache survives between runs, so
    repeating yesterday's prompts would measure cached prefills. Each level also gets its own prompts.
    """

    levels: tuple[int, ...]
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

    def __post_init__(self) -> None:
        if not self.levels or any(not isinstance(c, int) or c < 1 for c in self.levels):
            raise BenchbotError(f"Concurrency levels must be positive whole numbers, got {self.levels!r}.")
        _check_lengths(self.input_len, self.output_len, self.api)
        if self.num_requests is not None and self.num_requests < 1:
            raise BenchbotError("The number of requests per level must be at least 1.")

    def requests_for(self, level: int) -> int:
        return self.num_requests if self.num_requests is not None else default_num_requests(level)

    def warmup_for(self, level: int) -> int:
        return self.warmup if self.warmup is not None else default_warmup(level)


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


def request_body(api: str, ids: list[int], output_len: int, model: str | None) -> bytes:
    """Greedy, EOS ignored, so every request generates exactly ``output_len`` tokens."""
    if api == "generate":
        body: dict[str, Any] = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True},
            "stream": True,
        }
    else:
        body = {
            "model": model,
            "prompt": ids,
            "max_tokens": output_len,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    return json.dumps(body, separators=(",", ":")).encode()


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
    raw: RawResponse, api: str, input_len: int, wall_offset_s: float = 0.0, keep_events: bool = False
) -> RequestRecord:
    """Decode one response into a ``RequestRecord``: token events, their token counts, errors."""
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
            if isinstance(count, int):
                total = count
            choices = obj.get("choices") or []
            text = choices[0].get("text") if choices and isinstance(choices[0], dict) else None
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
        input_tokens=input_len,
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


# --- the hot path ----------------------------------------------------------------------------------


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeout_s: float,
    gate: Gate | None = None,
) -> RawResponse:
    """One streamed request: stamp each read as it arrives, keep the bytes, decode nothing.

    The loop is ``iter_any()`` unrolled into ``readany()`` (one coroutine frame less per read), and the
    deadline is one ``asyncio.timeout`` per request rather than aiohttp's per-read timer context.
    ``gate()`` runs before the send instant is taken, outside the error handling: what it raises ends the bench.
    """
    if gate is not None:
        gate()
    reads: list[_Read] = []
    append = reads.append
    clock = time.perf_counter_ns
    t_send = clock()
    try:
        async with asyncio.timeout(timeout_s), session.post(url, data=body, headers=headers) as resp:
            if resp.status != 200:
                text = (await resp.read())[:300].decode(errors="replace").strip()
                return RawResponse(t_send, clock(), (), f"HTTP {resp.status}: {text}")
            readany = resp.content.readany
            while data := await readany():
                append((clock(), data))
    except TimeoutError:
        return RawResponse(t_send, clock(), tuple(reads), f"timed out after {timeout_s:g} s")
    except aiohttp.ClientError as exc:
        return RawResponse(t_send, clock(), tuple(reads), f"{type(exc).__name__}: {exc}".strip(": "))
    return RawResponse(t_send, clock(), tuple(reads))


async def _closed_loop(
    session: aiohttp.ClientSession,
    url: str,
    bodies: Sequence[bytes],
    concurrency: int,
    headers: dict[str, str],
    timeout_s: float,
    gate: Gate | None = None,
) -> list[RawResponse]:
    """Exactly ``concurrency`` requests in flight: each worker sends its next request when one ends.

    If one worker raises (the gate refused), the others are cancelled, in-flight requests included, and
    the first exception propagates as it is.
    """
    results: list[RawResponse | None] = [None] * len(bodies)
    todo = iter(range(len(bodies)))

    async def worker() -> None:
        for i in todo:  # one shared iterator: next() never awaits, so no index is taken twice
            results[i] = await _send(session, url, bodies[i], headers, timeout_s, gate)

    tasks = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, len(bodies)))]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return [r for r in results if r is not None]


async def _open_connections(
    session: aiohttp.ClientSession, base_url: str, count: int, headers: dict[str, str], gate: Gate | None = None
) -> None:
    """Fill the keep-alive pool with ``count`` connections before timing starts, so the first wave's
    TTFT measures the server rather than ``count`` simultaneous TCP handshakes. ``GET /v1/models`` is
    cheap on SGLang (``/health`` would run a generation); any answer leaves a reusable connection.
    """
    url = base_url.rstrip("/") + "/v1/models"
    if gate is not None:
        gate()

    async def touch() -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with asyncio.timeout(10), session.get(url, headers=headers) as resp:
                await resp.read()

    await asyncio.gather(*(touch() for _ in range(count)))


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
    """Everything a shard needs, picklable so it can be shipped to a child process."""

    base_url: str
    api: str
    concurrency: int
    warmup_indices: tuple[int, ...]
    measure_indices: tuple[int, ...]
    input_len: int
    output_len: int
    model: str | None
    api_key: str | None
    seed: int
    timeout_s: float
    keep_events: bool = False
    gate: Gate | None = None


@dataclass(frozen=True)
class ShardOutput:
    records: tuple[RequestRecord, ...]
    load: ClientLoad


def _raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


def _url(spec: ShardSpec) -> str:
    return spec.base_url.rstrip("/") + ("/generate" if spec.api == "generate" else "/v1/completions")


async def run_shard(spec: ShardSpec, barrier: Callable[[], Any] | None = None) -> ShardOutput:
    """Warm up, wait at ``barrier`` (multi-process start), run the measured closed loop, decode."""
    _raise_fd_limit(4 * spec.concurrency + 256)
    headers = {"Content-Type": "application/json"}
    if spec.api_key:
        headers["Authorization"] = f"Bearer {spec.api_key}"

    def bodies(indices: Sequence[int]) -> list[bytes]:
        return [
            request_body(spec.api, prompt_ids(spec.seed, i, spec.input_len), spec.output_len, spec.model)
            for i in indices
        ]

    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=300)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)
    url = _url(spec)
    loop_name = "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
    session = aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=READ_BUFSIZE)
    async with session:
        if spec.warmup_indices:
            await _closed_loop(
                session, url, bodies(spec.warmup_indices), spec.concurrency, headers, spec.timeout_s, spec.gate
            )
        await _open_connections(
            session, spec.base_url, min(spec.concurrency, len(spec.measure_indices)), headers, spec.gate
        )
        measured = bodies(spec.measure_indices)
        if barrier is not None:
            await barrier()
        gc_was_enabled = gc.isenabled()
        gc.collect()
        gc.disable()  # a full collection over many live buffers is a multi-ms pause in the timing path
        probe = LagProbe()
        probe.start()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        try:
            raws = await _closed_loop(session, url, measured, spec.concurrency, headers, spec.timeout_s, spec.gate)
        finally:
            cpu1, wall1 = time.process_time(), time.perf_counter()
            lags = await probe.stop()
            if gc_was_enabled:
                gc.enable()
    offset = time.time() - time.perf_counter()
    records = tuple(record_from_raw(r, spec.api, spec.input_len, offset, spec.keep_events) for r in raws)
    chunks = sum(len(r.chunk_t_ns) for r in records)
    load = ClientLoad(wall_s=wall1 - wall0, cpu_s=(cpu1 - cpu0,), chunks=chunks, lag_ms=tuple(lags), loop=loop_name)
    return ShardOutput(records, load)


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
        async with httpx.AsyncClient(timeout=10) as client:
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
    concurrency: int,
    num_requests: int,
    input_len: int,
    output_len: int,
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
) -> LevelResult:
    """Run one closed-loop level: ``warmup`` requests (not measured), then ``num_requests`` with exactly
    ``concurrency`` in flight. Errors are counted, never raised; bad arguments raise ``BenchbotError``.

    Runs on the caller's event loop when ``processes`` resolves to 1 (use uvloop: ``bench_sync`` or
    ``uvloop.run``), else in that many spawned processes, each with its own uvloop, started together.
    ``keep_records`` returns the per-request records too; ``keep_events`` also keeps each token event's
    parsed JSON (e.g. a simulator's ``sim_t_emit``), which is memory-hungry. ``gate()`` runs before
    every request (see the module docstring); in several processes each gets a pickled copy.
    """
    _check_lengths(input_len, output_len, api)
    if concurrency < 1 or num_requests < 1 or warmup < 0:
        raise BenchbotError("Concurrency and request count must be at least 1, warmup at least 0.")
    if api == "completions" and not model:
        model = await _first_model(base_url, api_key, gate)
    nproc = auto_processes(concurrency) if processes is None else max(1, processes)
    nproc = min(nproc, concurrency, num_requests)
    conc = _split(concurrency, nproc)
    nreq = _split(num_requests, nproc)
    nwarm = _split(warmup, nproc)
    specs, next_req, next_warm = [], 0, num_requests
    for c, n, w in zip(conc, nreq, nwarm, strict=True):
        specs.append(
            ShardSpec(
                base_url=base_url,
                api=api,
                concurrency=c,
                warmup_indices=tuple(range(next_warm, next_warm + w)),
                measure_indices=tuple(range(next_req, next_req + n)),
                input_len=input_len,
                output_len=output_len,
                model=model,
                api_key=api_key,
                seed=seed,
                timeout_s=timeout_s,
                keep_events=keep_events,
                gate=gate,
            )
        )
        next_req += n
        next_warm += w
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
    metrics = level_metrics(records, concurrency, [load])
    return LevelResult(metrics, tuple(records) if keep_records or keep_events else ())


def describe(m: LevelMetrics) -> str:
    """One progress line per finished level."""

    def ms(d: dict[str, float | None], key: str) -> str:
        v = d.get(key)
        return "-" if v is None else f"{v:.1f}"

    line = (
        f"c={m.concurrency}: {m.completed}/{m.num_requests} ok, {m.output_tok_s:.0f} out tok/s, "
        f"TTFT p50 {ms(m.ttft_ms, 'p50')} ms, ITL p50 {ms(m.itl_ms, 'p50')} ms"
    )
    if m.errors:
        line += f", {m.errors} errors ({m.error_samples[0]})"
    if m.client.get("bottleneck"):
        line += f" [client-bound: {m.client['reason']}]"
    return line


async def run_bench(
    base_url: str,
    params: BenchParams,
    *,
    on_progress: Callable[[str], None] | None = None,
    gate: Gate | None = None,
) -> list[LevelResult]:
    """Run every level of ``params`` in order against one server; progress lines go to ``on_progress``.

    ``gate()`` runs before every request (so before each level's first); what it raises aborts the bench.
    """
    model = params.model
    if params.api == "completions" and not model:
        model = await _first_model(base_url, params.api_key, gate)
    base_seed = params.seed if params.seed is not None else random.randrange(2**31)
    results = []
    for position, level in enumerate(params.levels):
        n, w = params.requests_for(level), params.warmup_for(level)
        if on_progress:
            on_progress(
                f"c={level}: running {n} requests ({w} warmup), {params.input_len} in / {params.output_len} out tokens"
            )
        result = await run_level(
            base_url,
            concurrency=level,
            num_requests=n,
            input_len=params.input_len,
            output_len=params.output_len,
            warmup=w,
            api=params.api,
            model=model,
            api_key=params.api_key,
            seed=base_seed * 1000 + position,
            timeout_s=params.timeout_s,
            processes=params.processes,
            gate=gate,
        )
        results.append(result)
        if on_progress:
            on_progress(describe(result.metrics))
    return results


def bench_sync(
    base_url: str, params: BenchParams, *, on_progress: Callable[[str], None] | None = None
) -> list[LevelResult]:
    """``run_bench`` on a fresh uvloop, for synchronous callers such as RQ jobs."""
    import uvloop

    return uvloop.run(run_bench(base_url, params, on_progress=on_progress))
