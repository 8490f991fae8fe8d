"""``/bench ... profile=STEPS``: a bounded engine profile around one level, and where its trace landed.

The capture wraps the bench's highest level (the load a person profiles for) through the load generator's
``around_level`` hook, next to the telemetry sampler: a fence check, the engine's start call, the level,
the engine's stop call where it needs one (fence-checked too), then a bounded look on the host for the
trace files (name and size, listed with ``find`` through the transport: an argv list, quoted across SSH).
A profile that fails is said in the run, never fails the bench; an unbounded one is never asked for
(``workers.engines.profiling``). Steps count from the level's start, its warmup requests included.

A profile never outlives its job (issue 39 round 4, item 5): the stop is sent at the level's end and when
the bench is cancelled, also to an engine whose capture stops by itself after its steps (SGLang), and the
engine's answer says whether the steps were reached; a capture found still armed when one starts (an
earlier job's, killed mid-level) is stopped first. ``<log_dir>/profiles`` is kept under
:data:`PROFILES_MAX_BYTES` and :data:`PROFILES_MAX_AGE_S`: after each capture, benchbot's older trace
files there (``benchbot-*``, never this capture's) are removed, oldest first, fence-checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from workers.benchmark.limits import format_bytes
from workers.benchmark.spec import BenchSpec
from workers.capped_http import capped_client
from workers.config import HostConfig
from workers.engines.interface import EngineDriver
from workers.engines.profiling import ProfileCall, ProfileResult, TraceFile
from workers.errors import LeaseLostError
from workers.host.transport import Transport

#: How long the job looks for trace files after the level (SGLang writes them when the capture stops,
#: "this will take some time" on a real GPU box: seconds to a minute for a few steps at TP8).
TRACE_WAIT_S = 60.0
CALL_TIMEOUT_S = 30.0
#: vLLM's /stop_profile answers only once the traces are written: 30-60 s for 3 steps of a tiny model on
#: this 2-core box (the real tier measured it), longer for a big model's GPU trace.
STOP_TIMEOUT_S = 300.0
LIST_TIMEOUT_S = 10.0
#: ``<log_dir>/profiles`` is kept under this many bytes of benchbot's trace files...
PROFILES_MAX_BYTES = 2 * 2**30
#: ...none older than this.
PROFILES_MAX_AGE_S = 7 * 86400.0


def profile_id(job_id: str, now: float | None = None) -> str:
    """``benchbot-17-1733300000``: valid as SGLang's profile_id and vLLM's profile_prefix ([A-Za-z0-9._-])."""
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in job_id)[:64]
    return f"benchbot-{safe}-{int(now if now is not None else time.time())}"


def listing_argv(trace_dir: str, prefix: str) -> list[str]:
    """``find`` of the capture's files: size and path per line, this directory only."""
    return ["find", trace_dir, "-maxdepth", "1", "-type", "f", "-name", f"{prefix}*", "-printf", r"%s\t%p\n"]


def parse_listing(text: str) -> tuple[TraceFile, ...]:
    """``find -printf '%s\\t%p\\n'`` lines -> files, sorted by path; lines that do not parse are skipped."""
    files = []
    for line in text.splitlines():
        size, sep, path = line.partition("\t")
        if sep and size.isdigit() and path:
            files.append(TraceFile(path=path, size_bytes=int(size)))
    return tuple(sorted(files, key=lambda f: f.path))


@dataclass
class LevelProfile:
    """One bounded capture at ``target_load``; :attr:`result` is set once that level has run."""

    base_url: str
    api_key: str | None
    transport: Transport
    call: ProfileCall
    steps: int
    target_load: float
    gate: Callable[[], None]  # the fence check before each call to the engine
    trace_wait_s: float = TRACE_WAIT_S
    poll_s: float = 1.0
    #: benchbot's own trace directory (``<log_dir>/profiles``), pruned after the capture; None: not pruned.
    prune_dir: str | None = None
    max_bytes: int = PROFILES_MAX_BYTES
    max_age_s: float = PROFILES_MAX_AGE_S
    result: ProfileResult | None = None
    _notes: list[str] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def level(self, position: int = 0, load: float = 0.0) -> AsyncIterator[None]:
        """Profile this level if it is the target and nothing was profiled yet; otherwise just run it."""
        if self.result is not None or load != self.target_load:
            yield
            return
        started = await self._start()
        files: tuple[TraceFile, ...] = ()
        try:
            yield
        finally:
            if started:
                await self._stop()  # at the level's end, and when the bench is cancelled
                files = await self._find_files()
                if not files and not self._notes:
                    where = self.call.trace_dir or "the engine's profiler directory"
                    self._notes.append(f"no trace file under {where} after {self.trace_wait_s:g} s")
                await self._prune({f.path for f in files})
            self.result = ProfileResult(
                steps=self.steps, load=load, trace_dir=self.call.trace_dir, files=files, note="; ".join(self._notes)
            )

    async def _post(self, path: str, body: Mapping[str, object] | None, timeout_s: float) -> httpx.Response | None:
        """POST ``path`` to the engine; the response, or None with a note saying what went wrong."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            async with capped_client(headers=headers, timeout=timeout_s) as client:
                return await client.post(self.base_url.rstrip("/") + path, json=body)
        except httpx.HTTPError as exc:
            self._notes.append(f"{path} failed: {type(exc).__name__}: {exc}")
            return None

    async def _call(self, path: str, body: Mapping[str, object] | None, timeout_s: float) -> bool:
        """POST ``path`` to the engine; True on 200, else a note saying what went wrong."""
        resp = await self._post(path, body, timeout_s)
        if resp is not None and resp.status_code != 200:
            self._notes.append(f"the server refused {path}: HTTP {resp.status_code} {resp.text[:200]}")
        return resp is not None and resp.status_code == 200

    async def _start(self) -> bool:
        self.gate()  # a side effect on the host: only while the lease is still ours (LeaseLostError aborts)
        call = self.call
        first = await self._post(call.start_path, call.start_body, CALL_TIMEOUT_S)
        if first is not None and first.status_code != 200 and call.stops_itself and call.stop_path is not None:
            # a capture still armed (an earlier job's, killed before its level ended): disarm it, start once more
            self.gate()
            if (await self._post(call.stop_path, None, STOP_TIMEOUT_S) or first).status_code == 200:
                self._notes.append(f"a capture left armed on the engine was stopped first ({call.stop_path})")
                return await self._call(call.start_path, call.start_body, CALL_TIMEOUT_S)
        if first is not None and first.status_code != 200:
            self._notes.append(f"the server refused {call.start_path}: HTTP {first.status_code} {first.text[:200]}")
        return first is not None and first.status_code == 200

    async def _stop(self) -> None:
        if self.call.stop_path is None:
            return
        try:
            self.gate()
        except LeaseLostError:
            self._notes.append(f"{self.call.stop_path} not sent: the lease on the host was lost")
            return
        if not self.call.stops_itself:
            await self._call(self.call.stop_path, None, STOP_TIMEOUT_S)
            return
        resp = await self._post(self.call.stop_path, None, STOP_TIMEOUT_S)
        if resp is not None and resp.status_code == 200:  # still armed: the level ended before its steps
            self._notes.append(
                f"the level ended before the capture's {self.steps} steps were reached: benchbot stopped it "
                f"({self.call.stop_path}), so its trace holds fewer steps"
            )
        # refused: it had stopped by itself, after its steps

    async def _prune(self, keep: set[str]) -> None:
        """Keep ``prune_dir`` under :attr:`max_bytes` and :attr:`max_age_s`: benchbot's older trace files
        there are removed, oldest first (never ``keep``, this capture's); a note says what went."""
        if self.prune_dir is None:
            return
        argv = [
            "find",
            self.prune_dir,
            "-maxdepth",
            "1",
            "-type",
            "f",
            "-name",
            "benchbot-*",
            "-printf",
            r"%T@\t%s\t%p\n",
        ]
        try:
            listed = await self.transport.run(argv, timeout=LIST_TIMEOUT_S)
        except Exception:  # best effort: nothing listed, nothing removed
            return
        doomed = files_to_prune(listed.stdout if listed.ok else "", keep, self.max_bytes, self.max_age_s, time.time())
        if not doomed:
            return
        try:
            self.gate()  # removing files is a side effect on the host
            result = await self.transport.run(["rm", "-f", "--", *(path for path, _ in doomed)], timeout=LIST_TIMEOUT_S)
        except LeaseLostError:
            return
        except Exception as exc:
            self._notes.append(f"could not prune {self.prune_dir}: {exc}")
            return
        if result.ok:
            freed = format_bytes(sum(size for _, size in doomed))
            self._notes.append(f"removed {len(doomed)} older trace file(s) ({freed}) from {self.prune_dir}")

    async def _find_files(self) -> tuple[TraceFile, ...]:
        """The capture's files once two listings a poll apart agree (the engine finished writing), or what
        was there when the wait ran out."""
        if self.call.trace_dir is None or self.call.file_prefix is None:
            return ()
        argv = listing_argv(self.call.trace_dir, self.call.file_prefix)
        deadline = time.monotonic() + self.trace_wait_s
        last: Sequence[TraceFile] = ()
        while True:
            files = await self._list(argv)
            if files and tuple(files) == tuple(last):
                return tuple(files)
            last = files
            if time.monotonic() >= deadline:
                return tuple(files)
            await asyncio.sleep(self.poll_s)

    async def _list(self, argv: list[str]) -> tuple[TraceFile, ...]:
        try:
            result = await self.transport.run(argv, timeout=LIST_TIMEOUT_S)
        except Exception as exc:  # best effort: a listing that fails is a note, not a failed bench
            note = f"could not list {self.call.trace_dir}: {exc}"
            if note not in self._notes:
                self._notes.append(note)
            return ()
        return parse_listing(result.stdout) if result.ok else ()


def files_to_prune(listing: str, keep: set[str], max_bytes: int, max_age_s: float, now: float) -> list[tuple[str, int]]:
    """(path, size) of the files in ``find -printf '%T@\\t%s\\t%p\\n'`` output to remove: older than
    ``max_age_s``, then the oldest until the rest fit ``max_bytes``; ``keep`` is never removed."""
    rows: list[tuple[float, int, str]] = []
    for line in listing.splitlines():
        fields = line.split("\t", 2)
        try:
            rows.append((float(fields[0]), int(fields[1]), fields[2]))
        except (ValueError, IndexError):
            continue
    rows.sort()
    total = sum(size for _, size, _ in rows)
    doomed: list[tuple[str, int]] = []
    for mtime, size, path in rows:
        if path in keep:
            continue
        if now - mtime > max_age_s or total > max_bytes:
            doomed.append((path, size))
            total -= size
    return doomed


def combine(
    *hooks: Callable[[int, float], contextlib.AbstractAsyncContextManager[object]] | None,
) -> Callable[[int, float], contextlib.AbstractAsyncContextManager[object]] | None:
    """Several ``around_level`` hooks as one (entered in order, left in reverse); None when there are none."""
    present = [h for h in hooks if h is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]

    @contextlib.asynccontextmanager
    async def both(position: int, load: float) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for hook in present:
                await stack.enter_async_context(hook(position, load))
            yield

    return both


def for_bench(
    driver: EngineDriver,
    host: HostConfig,
    transport: Transport,
    spec: BenchSpec,
    argv: Sequence[str],
    job_id: str,
    gate: Callable[[], None],
) -> LevelProfile | None:
    """The capture a bench asked for (``profile=``), at its highest load; None when it asked for none.

    ``argv`` is the serving process's (the observation's): vLLM can profile only when it was started with
    ``--profiler-config``, and the refusal (BenchbotError) comes before any request is sent.
    """
    if not spec.profile_steps:
        return None
    loads = spec.rates or tuple(float(c) for c in spec.levels)
    output_dir = host.log_dir.rstrip("/") + "/profiles"
    call = driver.profile_call(spec.profile_steps, profile_id(job_id), output_dir, driver.launch_args(argv))
    return LevelProfile(
        base_url=host.base_url,
        api_key=host.engine.api_key(),
        transport=transport,
        call=call,
        steps=spec.profile_steps,
        target_load=max(loads),
        gate=gate,
        prune_dir=output_dir,
    )


def describe(result: ProfileResult, open_loop: bool) -> str:
    """``profile: 5 steps at c=32: 8 files, 12.3 MB in /var/tmp/benchbot/profiles`` (or why none)."""
    where = f"rate={result.load:g}/s" if open_loop else f"c={int(result.load)}"
    head = f"profile: {result.steps} steps at {where}"
    if result.files:
        text = f"{head}: {len(result.files)} trace file(s), {format_bytes(result.total_bytes)} in {result.trace_dir}"
    else:
        text = f"{head}: no trace file found"
    return text + (f" ({result.note})" if result.note else "")
