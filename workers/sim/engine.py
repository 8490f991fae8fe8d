"""The simulated scheduler: requests in, timed token events out.

Two schedulers share one ``Stream``/``Sink`` vocabulary:

* ``BatchScheduler`` (``--sim-timing model``) behaves like SGLang's: a waiting queue, prefill batches
  (up to ``chunked_prefill_size`` new tokens, capped by ``max_running_requests``) that stall decoding,
  and decode steps that emit one token (or one speculative chunk) for *every* running request at the
  same instant, with step durations from ``PerfModel``. It writes SGLang's prefill/decode log lines.
* ``FixedScheduler`` (``--sim-timing fixed``) is the ground truth: token i of a stream is due at
  exactly ``t_recv + ttft + i*itl`` (absolute, no drift, no batching effects); one precise timer
  serves a heap of all streams.

Schedulers only hand ``(stream, upto, t_sched, finished)`` to the stream's ``Sink``. A streaming
handler's ``Sink.direct`` formats and writes a token chunk on the spot (no task switch per token);
anything else is queued and wakes the handler, at most one future per HTTP request per step.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import math
import os
import time
from collections import deque
from collections.abc import Callable

from workers.sim import log, text
from workers.sim.perf import PerfModel
from workers.sim.timing import PreciseTimer, sleep_until

TICK_S = float(os.environ.get("BENCHBOT_SIM_TICK_S", "0.00025"))
MAX_BURST_S = 0.002  # longest stretch one wake-up writes before the loop polls sockets again
MAX_CATCH_UP_S = 0.05  # host hiccups up to this long are caught up; a later forward starts from now
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Sink:
    """The mailbox of one HTTP request: events from the scheduler, one waiter future.

    ``direct`` (set by a streaming handler) lets the scheduler's tick format and write a token chunk
    straight to the socket, so a token costs no task switch and no await: at 256 streams x 100 tok/s
    the per-token wake-up of every handler was most of the simulator's CPU. It returns False when it
    cannot (a final chunk, the socket backed up or closing) and the event is queued for the handler;
    nothing goes direct while events are queued, so chunks never overtake each other.
    """

    __slots__ = ("direct", "events", "waiter")

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.waiter: asyncio.Future | None = None
        self.direct: Callable[[tuple], bool] | None = None

    def push(self, event: tuple) -> None:
        direct = self.direct
        if direct is not None and not self.events and direct(event):
            return
        self.events.append(event)
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> list[tuple]:
        """All queued events so far (waits for at least one)."""
        if not self.events:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        events, self.events = self.events, []
        return events


class Stream:
    """One generation: its prompt, its planned tokens, and what has been emitted so far."""

    __slots__ = (
        "aborted",
        "accept_hist",
        "cached_tokens",
        "counted",
        "emitted",
        "finish",
        "garbage",
        "index",
        "pieces",
        "prefilled",
        "prompt_tokens",
        "rid",
        "rng",
        "sink",
        "t_done",
        "t_first",
        "t_last",
        "t_recv",
        "t_sched0",
        "target",
        "verify_ct",
    )

    def __init__(
        self,
        rid: str,
        index: int,
        prompt_tokens: int,
        cached_tokens: int,
        max_new: int,
        stop_at: int | None,
        rng,
        sink: Sink,
        t_recv: float,
        garbage: bool,
        counted: bool = True,
    ) -> None:
        self.rid = rid
        self.index = index
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens
        if stop_at is not None and stop_at < max_new:
            self.target, self.finish = max(1, stop_at), "stop"
        else:
            self.target, self.finish = max(1, max_new), "length"
        self.pieces = [text.GARBAGE_ID] * self.target if garbage else text.sample_pieces(rng, self.target)
        self.rng = rng
        self.sink = sink
        self.t_recv = t_recv
        self.garbage = garbage
        self.counted = counted  # False for /health probes (SGLang sends them with log_metrics=False)
        self.emitted = 0
        self.prefilled = 0  # uncached prompt tokens already prefilled by earlier chunks (a prompt > the chunk)
        self.verify_ct = 0
        self.accept_hist: list[int] = []
        self.aborted = False
        self.t_first = 0.0
        self.t_last = 0.0
        self.t_done = 0.0
        self.t_sched0 = 0.0

    @property
    def done(self) -> bool:
        return self.emitted >= self.target


class Stats:
    """Lifetime counters behind /metrics and /server_info.

    The request counters (requests, prompt, generation and cached tokens) move when a request finishes,
    as SGLang's ``observe_one_finished_request`` does, in every timing mode; ``running``/``queued`` are
    gauges.
    """

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.requests = 0
        self.aborted = 0
        self.spec_verify_ct = 0
        self.spec_tokens = 0
        self.last_gen_throughput = 0.0
        self.avg_spec_accept_length = 0.0
        self.running = 0
        self.queued = 0
        # live counters for the GPU telemetry stand-in (workers/sim/gpu_load.py): they move per token,
        # not per finished request, so a sampler sees the load while a level runs
        self.emitted_live = 0
        self.prefilled_live = 0
        self.kv_usage_fn: Callable[[], float] | None = None  # the scheduler's KV usage (0..1), when modelled
        self.hist: dict[str, list] = {
            name: [[0] * (len(LATENCY_BUCKETS) + 1), 0.0, 0] for name in ("ttft", "itl", "e2e", "queue")
        }

    def observe(self, name: str, value: float) -> None:
        h = self.hist[name]
        h[0][bisect.bisect_left(LATENCY_BUCKETS, value)] += 1
        h[1] += value
        h[2] += 1


class BaseScheduler:
    """What both schedulers share: the stats, the record-keeping on emit, the finish bookkeeping."""

    def __init__(self, stats: Stats, metrics: bool) -> None:
        self.stats = stats
        self.metrics = metrics
        #: Forward steps run so far (a batch scheduler's prefills and decodes; the fixed one's wake-ups that
        #: emitted): what ``/start_profile``'s ``num_steps`` counts (workers/sim/profiler.py).
        self.forwards = 0

    def _emit(self, s: Stream, n: int, t_sched: float) -> bool:
        """Advance ``s`` by ``n`` tokens at ``t_sched``; returns True when it finished."""
        n = min(n, s.target - s.emitted)
        first = s.emitted == 0
        s.emitted += n
        st = self.stats
        st.emitted_live += n
        if first:
            st.prefilled_live += max(0, s.prompt_tokens - s.cached_tokens)
        observe = self.metrics and s.counted
        if observe:
            if first:
                st.observe("ttft", t_sched - s.t_recv)
            else:
                st.observe("itl", (t_sched - s.t_last) / max(1, n))
        s.t_last = t_sched
        if first:
            s.t_first = t_sched
        done = s.emitted >= s.target
        if done:
            s.t_done = t_sched
            if s.counted:
                st.requests += 1
                st.prompt_tokens += s.prompt_tokens
                st.cached_tokens += s.cached_tokens
                st.generation_tokens += s.emitted
            if observe:
                st.observe("e2e", t_sched - s.t_recv)
        s.sink.push((s, s.emitted, t_sched, done))
        return done

    def submit(self, streams: list[Stream]) -> None:
        raise NotImplementedError

    def abort(self, streams: list[Stream]) -> None:
        for s in streams:
            if not s.done and not s.aborted:
                s.aborted = True
                self.stats.aborted += 1


class FixedScheduler(BaseScheduler):
    """Ground truth: first token at t_recv+ttft, then every itl, on an absolute schedule.

    One timer serves a heap of all streams; each wake-up writes every stream that is due (a burst,
    when streams share a phase). Wake-ups are rounded up to a ``tick_s`` grid (default 0.25 ms,
    ``BENCHBOT_SIM_TICK_S``): streams with spread phases then share wake-ups, which is what lets one
    process serve 256 streams x 100 tok/s, because arming a kernel timer costs tens of microseconds on
    a VM. A token is never emitted before its ``t_sched``; the lateness is reported in every chunk
    (``sim_t_emit``) and measured by bench/sim_capacity.py.
    """

    def __init__(self, stats: Stats, metrics: bool, ttft_s: float, itl_s: float, tick_s: float | None = None) -> None:
        super().__init__(stats, metrics)
        self.ttft = ttft_s
        self.itl = itl_s
        self.tick = TICK_S if tick_s is None else tick_s
        self.heap: list[tuple[float, int, Stream]] = []
        self._seq = itertools.count()
        self._timer: PreciseTimer | None = None

    def _slot(self, t: float) -> float:
        """The first grid point at or after ``t``."""
        if self.tick <= 0:
            return t
        return max(t, math.ceil(t / self.tick) * self.tick)

    def submit(self, streams: list[Stream]) -> None:
        timer = self._timer
        if timer is None:
            timer = self._timer = PreciseTimer(asyncio.get_running_loop(), self._tick)
        for s in streams:
            s.t_sched0 = s.t_recv + self.ttft
            heapq.heappush(self.heap, (s.t_sched0, next(self._seq), s))
            self.stats.running += 1
        target = self._slot(self.heap[0][0])
        if not timer.armed or target < timer.target:
            timer.arm(target)

    def _tick(self) -> None:
        heap = self.heap
        clock = time.time
        now = clock()
        until = now + MAX_BURST_S
        pop, push, itl, emit, stats = heapq.heappop, heapq.heappush, self.itl, self._emit, self.stats
        n = 0
        while heap:
            if heap[0][0] > now:
                now = clock()  # a long burst: tokens that fell due meanwhile go out in this wake-up too
                if heap[0][0] > now:
                    break
            n += 1
            if not n & 31 and clock() > until:
                # Overloaded: let the loop read new requests before going on (the timer fires again at
                # once), else a saturated simulator would stop accepting connections altogether.
                self._timer.arm(heap[0][0])  # type: ignore[union-attr]
                return
            t, seq, s = pop(heap)
            if s.aborted:
                stats.running -= 1
                continue
            if emit(s, 1, t):
                stats.running -= 1
            else:
                push(heap, (s.t_sched0 + s.emitted * itl, seq, s))
        if n:
            self.forwards += 1
        if heap:
            self._timer.arm(self._slot(heap[0][0]))  # type: ignore[union-attr]


class BatchScheduler(BaseScheduler):
    """SGLang-like continuous batching driven by the performance model."""

    def __init__(
        self,
        stats: Stats,
        metrics: bool,
        perf: PerfModel,
        max_running: int,
        chunked_prefill: int,
        max_total_tokens: int,
        log_interval: int,
        hybrid: bool,
        spec: bool,
        on_idle: Callable[[bool], None],
        rank: str | None = "TP0",
        on_forward: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(stats, metrics)
        self.perf = perf
        self.max_running = max(1, max_running)
        self.chunked_prefill = max(1, chunked_prefill)
        self.max_total_tokens = max(1, max_total_tokens)
        self.log_interval = max(1, log_interval)
        self.hybrid = hybrid
        self.spec = spec
        self.waiting: deque[Stream] = deque()
        self.running: list[Stream] = []
        self._wake = asyncio.Event()
        self._steps = 0
        self._interval_tokens = 0
        self._interval_start = time.time()
        self._task: asyncio.Task | None = None
        self._on_idle = on_idle
        self.rank = rank  # SGLang's scheduler log prefix (None at TP 1)
        self.on_forward = on_forward  # called with "prefill"/"decode" after a forward (NaN warnings)
        self.quiet = False  # warmup/health probes: no log lines
        self._clock = 0.0  # when the last forward was due to end: steps are laid end to end on this timeline
        stats.kv_usage_fn = lambda: self._token_usage()[1]

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def submit(self, streams: list[Stream]) -> None:
        self.waiting.extend(streams)
        self.stats.queued = len(self.waiting)
        self._wake.set()

    def _token_usage(self) -> tuple[int, float]:
        used = sum(s.prompt_tokens + s.emitted for s in self.running)
        return used, used / self.max_total_tokens

    async def _run(self) -> None:
        while True:
            if not self.running and not self.waiting:
                self._on_idle(True)
                self._wake.clear()
                await self._wake.wait()
                self._on_idle(False)
                self._interval_start = time.time()
                self._interval_tokens = 0
            self.running = [s for s in self.running if not s.aborted]
            self.waiting = deque(s for s in self.waiting if not s.aborted)
            if self.waiting and len(self.running) < self.max_running and await self._prefill():
                pass
            elif self.running:
                await self._decode()
            self.stats.running = len(self.running)
            self.stats.queued = len(self.waiting)

    async def _prefill(self) -> bool:
        """One prefill forward; False when nothing could be admitted (the KV cache is full: decode first).

        Admission is bounded three ways, as SGLang's PrefillAdder bounds it: ``max_running_requests``, the
        chunk's token budget, and the KV cache (a prompt whose tokens do not fit beside the running
        requests' waits in the queue; a lone request is always admitted). A prompt longer than the chunk
        is prefilled chunk by chunk, one forward each (each pays the fixed cost and a pass over the
        weights), and stays first in line until its last chunk: a small chunk lengthens its TTFT.
        """
        batch: list[Stream] = []
        new_tokens = cached = 0
        kv_used, _ = self._token_usage()
        chunked: Stream | None = None
        while self.waiting and len(self.running) + len(batch) < self.max_running:
            s = self.waiting[0]
            need = s.prompt_tokens - s.cached_tokens - s.prefilled
            room = self.chunked_prefill - new_tokens
            if batch and need > room:
                break
            if (self.running or batch) and kv_used + s.prompt_tokens > self.max_total_tokens:
                break  # the KV cache is full: it waits until running requests finish
            if need > room:  # the next chunk of a long prompt; it stays first in line
                chunked, s.prefilled = s, s.prefilled + room
                new_tokens += room
                break
            self.waiting.popleft()
            batch.append(s)
            new_tokens += need
            cached += s.cached_tokens
            kv_used += s.prompt_tokens
        if not batch and chunked is None:
            return False
        start = self._start()
        if self.metrics:
            for s in batch:
                if s.counted:
                    self.stats.observe("queue", max(0.0, start - s.t_recv))
        seqs = len(batch) + (chunked is not None)
        t = await self._run_forward(start, self.perf.prefill_s(new_tokens, seqs))
        before = len(self.running)
        for s in batch:
            if not s.aborted and not self._emit(s, 1, t):
                self.running.append(s)
        if self.on_forward is not None:
            self.on_forward("prefill")
        if not self.quiet:
            _used, usage = self._token_usage()
            usage_txt = (
                f"full token usage: {usage:.2f}, mamba usage: {len(self.running) / self.max_running:.2f}"
                if self.hybrid
                else f"token usage: {usage:.2f}"
            )
            log.info(
                f"Prefill batch, #new-seq: {seqs}, #new-token: {new_tokens}, #cached-token: {cached}, "
                f"{usage_txt}, #running-req: {before}, "
                f"#queue-req: {len(self.waiting)}",
                rank=self.rank,
            )
        return True

    def _start(self) -> float:
        """When the next forward starts: right after the last one when the loop only spent its own
        bookkeeping time in between (so per-step Python overhead does not slow the modelled GPU), else now."""
        now = time.time()
        return self._clock if 0.0 <= now - self._clock < MAX_CATCH_UP_S else now

    async def _run_forward(self, start: float, duration: float) -> float:
        end = start + duration
        await sleep_until(end)
        self._clock = end
        self.forwards += 1
        return end

    async def _decode(self) -> None:
        running = self.running
        b = len(running)
        avg_ctx = sum(s.prompt_tokens + s.emitted for s in running) / b
        t = await self._run_forward(self._start(), self.perf.decode_step_s(b, avg_ctx))
        draw = self.perf.draw_accept
        spec = self.spec
        emitted = 0
        still: list[Stream] = []
        for s in running:
            if s.aborted:
                continue
            if spec:
                n = draw(s.rng)
                s.verify_ct += 1
                self.stats.spec_verify_ct += 1
                n = min(n, s.target - s.emitted)
                self.stats.spec_tokens += n
                hist = s.accept_hist
                while len(hist) < n:
                    hist.append(0)
                hist[n - 1] += 1
            else:
                n = 1
            emitted += min(n, s.target - s.emitted)
            if not self._emit(s, n, t):
                still.append(s)
        # keep requests that arrived in self.running meanwhile (none: prefill only runs in this task)
        self.running = still
        self._steps += 1
        self._interval_tokens += emitted
        if self._steps % self.log_interval == 0:
            self._log_decode(b)
            if self.on_forward is not None:
                self.on_forward("decode")

    def _log_decode(self, batch: int) -> None:
        now = time.time()
        elapsed = max(1e-9, now - self._interval_start)
        tput = self._interval_tokens / elapsed
        self._interval_start, self._interval_tokens = now, 0
        st = self.stats
        st.last_gen_throughput = tput
        if self.spec and st.spec_verify_ct:
            st.avg_spec_accept_length = st.spec_tokens / st.spec_verify_ct
        if self.quiet:
            return
        used, usage = self._token_usage()
        if self.hybrid:
            mid = (
                f"#full token: {used}, full token usage: {usage:.2f}, mamba num: {2 * batch}, "
                f"mamba usage: {batch / self.max_running:.2f}, "
            )
        else:
            mid = f"#token: {used}, token usage: {usage:.2f}, "
        spec = ""
        if self.spec and st.spec_verify_ct:
            acc_len = st.avg_spec_accept_length
            rate = (acc_len - 1) / max(1, self.perf.draft_tokens - 1)
            spec = f"accept len: {acc_len:.2f}, accept rate: {rate:.2f}, "
        log.info(
            f"Decode batch, #running-req: {batch}, {mid}{spec}cuda graph: {self.perf.in_graph(batch)}, "
            f"gen throughput (token/s): {tput:.2f}, #queue-req: {len(self.waiting)}",
            rank=self.rank,
        )
