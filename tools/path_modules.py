"""How many modules a ``/launch`` and a result visit (issue 24), measured on a real run rather than counted by hand.

``python tools/path_modules.py`` runs, in this process, against a private Redis and a simulated SGLang host:

1. **launch**: ``/launch nextn cudnn`` through :class:`bot.dispatch.Dispatcher`, then its job through benchbot's
   own worker class, made to run the job in this process (RQ's ``SimpleWorker`` way: no fork), until it ends.
   The engine it starts is the simulator, a subprocess (as the actuator that spawns it is).
2. **result**: ``/launch nextn cudnn then bench 1,2 in=64 out=16 n=8`` the same way, then the notifier
   (:class:`bot.notifier.Notifier`) delivering the job's events to the Slack stand-in
   (:mod:`bot.slack_standin`): the thread's header, the verified config, the table and the plots.

While each runs, ``sys.setprofile`` (and ``threading.setprofile``) sees every Python call.

**Carrier.** The values a path is made of, at every stage:

* *seeds*, named by type: for the launch path the command's text (the whole line, or the part after
  ``/launch``, until the grammar has made the typed request), :class:`~bot.commands.requests.LaunchRequest`,
  :class:`~workers.presets.LaunchIntent`, :class:`~workers.jobs.payloads.LaunchPayload`,
  :class:`~workers.presets.LaunchSpec`, and the payload's JSON as RQ hands it to the worker (a mapping with
  ``kind == "launch"`` and its ``launch``); for the result path the level result
  (:class:`~workers.benchmark.metrics.LevelMetrics`, :class:`~workers.benchmark.level.LevelResult`), the run
  (:class:`~workers.results.record.RunRecord`), the outcomes (:class:`~workers.jobs.outcomes.BenchOutcome`,
  :class:`~workers.jobs.outcomes.LaunchOutcome`: the job's, the only ones made while it is watched), the job's
  ``succeeded`` event (an :class:`~workers.jobs.events.Event` of that job and type, or its raw stream entry) and
  the runs read back (:class:`~workers.results.store.ResultRuns`): where a path crosses Redis, what comes out is
  a seed again;
* *what they become*: what a project function returns, or the object its ``__init__`` builds, when it received
  a carrier (the outcomes, their JSON, a parsed event, the header state, the posts, a Block Kit message, the
  plots' infos), unless that is a single word or number (``str``, ``int``, ``float``, ``bool``, ``None``, a path),
  an empty container, or a third party's object;
* a ``list``, ``tuple`` or ``dict`` holding a carrier among its first 64 items (values, for a dict).

**Visit.** A module (under ``bot/``, ``workers/``, ``ops/``) is visited by a path when at least one function
written in it (a method, a property, a lambda) is called with a carrier among its arguments (``self``
included). Not visits: code generated at run time (a dataclass's ``__init__``: a module that only declares a
type is not a hop, though what its constructor builds is followed), a module that only creates the first carrier
from plain values, third-party code, and functions handed one word or number of a carrier. Only the runs'
own threads and the threads they start are watched (the Slack stand-in's server thread is not).
The JSON printed lists, per path, every module in the order first visited, with the first function seen there and
the type of the carrier it received (``--explain``: every function, with the carrier it received first).
"""

from __future__ import annotations

import argparse
import contextlib
import dis
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROJECT = ("bot.", "workers.", "ops.")
PROJECT_TOP = frozenset({"bot", "workers", "ops"})
HOST = "gpu-1"
CHANNEL = "C-path"
USER = "path-tool"
LAUNCH = "/launch nextn cudnn"
RESULT = "/launch nextn cudnn then bench 1,2 in=64 out=16 n=8"
SCAN = 64
_GENERATORS = 0x20 | 0x80 | 0x100 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR
_RETURNS = {dis.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST") if name in dis.opmap}
_WORDS = (str, bytes, int, float, bool, type(None), PurePath)


@dataclass
class Visit:
    """The first call seen in a module with a carrier, and how many of its functions received one."""

    module: str
    first: str
    carrier: str
    functions: dict[str, str]  # function -> the carrier it received first, briefly
    typed: bool = False  # received more than the command's text (the launch path's first seed)


def _is_project(name: str) -> bool:
    return name in PROJECT_TOP or name.startswith(PROJECT)


class Tracker:
    """Follows one path's carriers through calls and returns (see the module docstring)."""

    def __init__(self, seed: Callable[[object], bool]) -> None:
        self.seed = seed
        self.carriers: dict[int, object] = {}  # id -> value, kept alive so an id is never reused
        self.receiving: set[int] = set()  # frames (by id) that received a carrier and have not returned
        self.visits: dict[str, Visit] = {}
        self._lock = threading.Lock()

    def _carrier(self, value: object) -> bool:
        if id(value) in self.carriers:
            return True
        try:
            return bool(self.seed(value))
        except Exception:  # a seed test never breaks the run it watches
            return False

    def carried(self, value: object) -> object | None:
        """The carrier ``value`` is or holds at its top level, else None."""
        if self._carrier(value):
            return value
        if isinstance(value, list | tuple | deque):
            items = itertools.islice(value, SCAN)
        elif isinstance(value, dict):
            items = itertools.islice(value.values(), SCAN)
        else:
            return None
        return next((item for item in items if self._carrier(item)), None)

    def _arguments(self, frame: types.FrameType) -> Iterator[object]:
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        local = frame.f_locals
        for name in code.co_varnames[:count]:
            if name in local:
                yield local[name]
        if code.co_flags & 0x04:  # *args
            yield from local.get(code.co_varnames[count], ())
            count += 1
        if code.co_flags & 0x08:  # **kwargs
            yield from local.get(code.co_varnames[count], {}).values()

    def profile(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if not isinstance(module, str) or not _is_project(module):
                return
            for value in self._arguments(frame):
                found = self.carried(value)
                if found is not None:
                    self._receive(module, frame, found)
                    return
        elif event == "return" and id(frame) in self.receiving:
            code = frame.f_code
            if code.co_flags & _GENERATORS and code.co_code[frame.f_lasti] not in _RETURNS:
                return  # a generator or coroutine suspended: it yields, it has not returned
            self.receiving.discard(id(frame))
            if code.co_name == "__init__" and code.co_argcount:  # what a constructor built from a carrier
                arg = frame.f_locals.get(code.co_varnames[0])
            if _becomes_carrier(arg):
                with self._lock:
                    self.carriers[id(arg)] = arg

    def _receive(self, module: str, frame: types.FrameType, found: object) -> None:
        with self._lock:
            self.receiving.add(id(frame))  # what it returns (or builds) is a carrier too
            if frame.f_code.co_filename.startswith("<"):
                return  # code generated at run time (a dataclass's __init__): not code written in the module
            name = frame.f_code.co_qualname
            brief = f"{type(found).__name__}: {_brief(found)}"
            visit = self.visits.get(module)
            if visit is None and os.environ.get("PATH_MODULES_TRACE") == module:  # who handed it over
                import traceback

                traceback.print_stack(frame, limit=8)
            if visit is None:
                visit = self.visits[module] = Visit(module, name, type(found).__name__, {name: brief})
            else:
                visit.functions.setdefault(name, brief)
            visit.typed = visit.typed or not _is_text(found)

    def report(self, explain: bool = False) -> dict[str, object]:
        """``count``: modules visited by the typed values (for the launch path: from the typed request on, the
        carriers the issue names); ``text_only``: modules only the command's text or its words visited (the
        grammar, before the request exists)."""

        def row(v: Visit) -> dict[str, object]:
            functions = v.functions if explain else len(v.functions)
            return {"module": v.module, "first": v.first, "carrier": v.carrier, "functions": functions}

        typed = [row(v) for v in self.visits.values() if v.typed]
        text_only = [v.module for v in self.visits.values() if not v.typed]
        return {
            "count": len(typed),
            "count_with_text": len(typed) + len(text_only),
            "modules": typed,
            "text_only": text_only,
        }


def _is_text(value: object) -> bool:
    """The command's text, or its words as the tokenizer split them."""
    if isinstance(value, str):
        return True
    return isinstance(value, list | tuple) and all(isinstance(item, str) for item in value)


def _brief(value: object) -> str:
    try:
        text = repr(value)
    except Exception:
        text = object.__repr__(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _becomes_carrier(value: object) -> bool:
    """Whether a returned value is what a carrier became: a container or one of the project's own objects."""
    if isinstance(value, (*_WORDS, type, types.ModuleType, types.FunctionType)):
        return False
    if isinstance(value, dict | list | tuple | set | frozenset | deque):
        return bool(value)  # an empty one holds nothing of the path (and ``()`` is one shared object)
    return _is_project(type(value).__module__)


@contextlib.contextmanager
def watching(tracker: Tracker) -> Iterator[Tracker]:
    """Every call of this thread and of threads started meanwhile goes through ``tracker``."""
    threading.setprofile(tracker.profile)
    sys.setprofile(tracker.profile)
    try:
        yield tracker
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


# ---- the running benchbot ---------------------------------------------------------------------------------


class Bench:
    """A private Redis, a config with one simulated SGLang host, a dispatcher, a worker run in this process,
    the Slack stand-in and a notifier posting to it."""

    def __init__(self, work: Path) -> None:
        from bot.demo import demo_config
        from workers.ports import free_local_port

        self.work = work
        self.port = free_local_port()
        config_path = work / "benchbot.toml"
        config_path.write_text(demo_config(self.port, work / "logs", free_local_port()))
        self.config_path = config_path

    def __enter__(self) -> Bench:
        from bot.dispatch import Dispatcher
        from bot.notifier import Notifier
        from bot.slack_app import make_client
        from bot.slack_standin import BOT_TOKEN, SlackStandIn
        from workers import redis_conn
        from workers.config import load_config

        sock = redis_conn.start_redis_server(self.work / "redis")
        os.environ.update(
            {
                "REDIS_URL": f"unix://{sock}",
                "BENCHBOT_CONFIG": str(self.config_path),
                "BENCHBOT_STATE_DIR": str(self.work / "state"),
                "BENCHBOT_SIM_STARTUP_S": "0.2",
                "BENCHBOT_SIM_STATE_DIR": str(self.work / "sim"),
            }
        )
        self.r = redis_conn.connect(os.environ["REDIS_URL"])
        self.config = load_config(str(self.config_path))
        self.dispatcher = Dispatcher(self.config, self.r, plots_dir=self.work / "plots")
        self.standin = SlackStandIn().start()
        self.notifier = Notifier(
            self.r,
            make_client(BOT_TOKEN, self.standin.base_url),
            consumer="path-tool",
            default_channel=CHANNEL,
            plots_dir=self.work / "plots",
            progress_interval_s=0.0,
            thread_wait_s=0.0,
            block_ms=50,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        from workers import redis_conn

        with contextlib.suppress(Exception):
            self.run("/stop")
        self._kill_engine()
        self.standin.stop()
        self.r.close()
        redis_conn.stop_redis_server(self.work / "redis")

    def run(self, line: str) -> str:
        """Queue ``line`` and run its job here, to its end; its job id."""
        reply = self.dispatcher.handle(USER, CHANNEL, line)
        if not reply.ok or reply.job_id is None:
            raise SystemExit(f"{line!r} was refused: {reply.text}")
        self.work_queue()
        return reply.job_id

    def work_queue(self) -> None:
        from rq.serializers import JSONSerializer

        from workers.jobs.queue import queue_name
        from workers.redis_conn import rq_client

        worker = _in_process_worker_class()(
            [queue_name(HOST)],
            name=f"path-tool-{os.getpid()}",
            connection=rq_client(self.r),
            serializer=JSONSerializer,
            log_job_description=False,
            lease_ttl_s=self.config.limits.lease_ttl_s,
        )
        worker.work(burst=True, logging_level="WARNING")

    def deliver(self, job_id: str, timeout_s: float = 60.0) -> None:
        """Run the notifier until every event of ``job_id`` reached the stand-in."""
        from workers.jobs import events

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.notifier.run_once(block_ms=50)
            if events.is_terminal(self.r, job_id) and self.notifier.backlog == 0:
                pending = self.r.xpending(events.GLOBAL_STREAM, self.notifier.group)
                if not pending or not pending.get("pending"):
                    return
        raise SystemExit(f"the notifier did not deliver job {job_id} within {timeout_s:g} s")

    def _kill_engine(self) -> None:
        import asyncio

        from workers.host.local import LocalTransport

        async def kill() -> None:
            transport = LocalTransport()
            pid = await transport.listener_pid(self.port)
            if pid:
                info = await transport.process_info(pid)
                with contextlib.suppress(ProcessLookupError):
                    if info and info.pgid == pid:
                        os.killpg(pid, signal.SIGKILL)  # this tool's own simulator, on its own port
                    else:
                        os.kill(pid, signal.SIGKILL)

        asyncio.run(kill())


def _in_process_worker_class() -> type:
    """benchbot's worker class, running each job in this process: RQ's ``SimpleWorker.execute_job`` in place
    of the fork, so the profile hook sees the job (its dequeue bookkeeping and terminal-event guarantee kept)."""
    from rq.worker import SimpleWorker, Worker

    from workers.jobs.worker import BenchbotWorker

    class NoFork(Worker):
        def execute_job(self, job: object, queue: object) -> None:
            SimpleWorker.execute_job(self, job, queue)  # type: ignore[arg-type]

        def get_heartbeat_ttl(self, job: object, working_time: float = 0.0) -> int:
            return SimpleWorker.get_heartbeat_ttl(self, job, working_time)  # type: ignore[arg-type]

    class InProcessWorker(BenchbotWorker, NoFork):
        pass

    return InProcessWorker


# ---- the two paths' seeds -----------------------------------------------------------------------------------


def launch_seed(line: str) -> Callable[[object], bool]:
    from bot.commands.requests import LaunchRequest
    from workers.jobs.payloads import LaunchPayload
    from workers.presets import LaunchIntent, LaunchSpec

    texts = {line, line.partition(" ")[2]}
    typed = (LaunchRequest, LaunchIntent, LaunchPayload, LaunchSpec)
    parsed: list[bool] = []  # the text is the carrier until the grammar has made the typed request

    def seed(value: object) -> bool:
        if isinstance(value, str):
            return not parsed and value in texts
        if isinstance(value, typed):
            parsed.append(True)
            return True
        return isinstance(value, Mapping) and value.get("kind") == "launch" and "launch" in value

    return seed


def result_seed(job: list[str]) -> Callable[[object], bool]:
    """``job``: filled with the job's id once it is queued (the events are recognised by it)."""
    from workers.benchmark.level import LevelResult
    from workers.benchmark.metrics import LevelMetrics
    from workers.jobs.events import Event
    from workers.jobs.outcomes import BenchOutcome, LaunchOutcome
    from workers.results.record import RunRecord
    from workers.results.store import ResultRuns

    typed = (LevelMetrics, LevelResult, RunRecord, BenchOutcome, LaunchOutcome, ResultRuns)

    def seed(value: object) -> bool:
        if isinstance(value, typed):
            return True
        if not job:
            return False
        if isinstance(value, Event):
            return value.job == job[0] and value.type == "succeeded"
        if isinstance(value, Mapping) and isinstance(value.get("event"), str):  # a raw stream entry
            text = value["event"]
            return f'"job":"{job[0]}"' in text and '"type":"succeeded"' in text
        return False

    return seed


def measure(explain: bool = False) -> dict[str, object]:
    """Both paths, each with its own tracker (see the module docstring)."""
    work = Path(tempfile.mkdtemp(prefix="benchbot-paths-"))
    try:
        with Bench(work) as bench:
            with watching(Tracker(launch_seed(LAUNCH))) as launch:
                first = bench.run(LAUNCH)
            bench.deliver(first)  # its thread, unwatched: the result path starts from a quiet stream
            job: list[str] = []
            with watching(Tracker(result_seed(job))) as result:
                reply = bench.dispatcher.handle(USER, CHANNEL, RESULT)
                if not reply.ok or reply.job_id is None:
                    raise SystemExit(f"{RESULT!r} was refused: {reply.text}")
                job.append(reply.job_id)
                bench.work_queue()
                bench.deliver(reply.job_id)
            posted = [c.method for c in bench.standin.calls]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "definition": "a module is visited when a function defined in it receives a carrier (tools/path_modules.py)",
        "launch": {"command": LAUNCH, **launch.report(explain)},
        "result": {"command": RESULT, "slack_calls": sorted(set(posted)), **result.report(explain)},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--max", type=int, default=12, help="exit 1 when a path visits more modules (default 12)")
    parser.add_argument("--explain", action="store_true", help="every function seen, with the carrier it received")
    args = parser.parse_args(argv)
    found = measure(args.explain)
    print(json.dumps(found, indent=2))
    over = [name for name in ("launch", "result") if found[name]["count"] > args.max]  # type: ignore[index]
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
