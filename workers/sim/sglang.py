"""``python -m workers.sim.sglang [SGLang launch flags]``: a simulated ``sglang.launch_server``.

The process lives like the real one (``http_server.launch_server``), per imitated version
(``--sim-sglang-version`` / ``BENCHBOT_SIM_SGLANG_VERSION``, default 0.5.9):

1. **Loading, no listener.** ServerArgs is built (config errors end here: traceback, exit 1); the
   scheduler children start (``children``) and take GPU memory step by step while the log replays
   weight loading, the KV pool and CUDA graph capture over ``--sim-load-s``. Nothing listens on the port
   yet, so a client gets *connection refused*; a failure ends the launch like SGLang's (the scheduler's
   exception, the parent's sigquit line, the process tree killed).
2. **Listening, warming up.** uvicorn binds the port (a port in use ends it: exit 1). Every route
   answers at once, ``/server_info`` included, but ``/health`` says 503 until the warm-up (``GET
   /model_info`` and an 8-token generation, over HTTP) has run, by the end of ``--sim-startup-s``.
3. **Ready.** The ready line is logged; the server serves until SIGTERM/SIGINT (exit 0).

``--version`` prints the imitated SGLang version and exits 0 (a simulated host's answer to "which
SGLang is this"). ``serve ...`` and ``version`` are the console script's spellings (``sglang serve``,
``sglang version``). See docs/sim.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Mapping

import uvloop
from aiohttp import web

from workers.errors import BenchbotError
from workers.sim import answers, ledger, log, registry, rendezvous, texts
from workers.sim import args as sim_args
from workers.sim.children import ChildProcesses, scheduler_titles
from workers.sim.config_file import ConfigFileError
from workers.sim.engine import BatchScheduler, FixedScheduler, Stats
from workers.sim.gpu_load import LoadPublisher
from workers.sim.perf import PerfModel, memory_plan
from workers.sim.ports import InternalPortError, wait_internal_ports
from workers.sim.profile import load_profile, model_spec_for
from workers.sim.server import SimServer
from workers.sim.startup import args_traceback, early_lines, plan_startup, rank_tag, uvicorn_lines

KILLED = -9  # SGLang ends a failed launch with kill_process_tree(os.getpid()), itself included


def _bind(host: str, port: int) -> socket.socket | None:
    """Our own listening socket (so a taken port is detected at once); None if the port is in use."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(4096)
    except OSError:
        sock.close()
        return None
    sock.setblocking(False)
    return sock


def _gpu_ids(tp: int, base: int, count: int, env: Mapping[str, str]) -> list[int]:
    visible = env.get("CUDA_VISIBLE_DEVICES")
    ids = [int(x) for x in visible.split(",") if x.strip().isdigit()] if visible else list(range(count))
    return [g for g in ids[base : base + tp] if g < count]


def _keepalive_s(version: str, env: Mapping[str, str]) -> float:
    """uvicorn's ``timeout_keep_alive``: 5 s in 0.5.9; ``SGLANG_TIMEOUT_KEEP_ALIVE`` (default 5) from 0.5.15."""
    if sim_args.is_new_layout(version):
        with contextlib.suppress(ValueError):
            return float(env.get("SGLANG_TIMEOUT_KEEP_ALIVE", "5"))
    return 5.0


def _emit(lines: list[str], tag: str | None) -> None:
    for line in lines:
        if line.startswith("@"):
            log.raw(line[1:])
        elif line.startswith("#"):
            log.raw(line[1:], stream="stderr")
        elif line.startswith("="):
            log.info(line[1:], stream="stderr")
        elif line.startswith("!"):
            log.info(line[1:], rank=tag)
        else:
            log.info(line)


async def _sleep_until(t: float, stop: asyncio.Event) -> bool:
    """Wait until ``t`` or a stop signal; True when stopped."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, t - time.time()))
    return stop.is_set()


async def _serve(env: Mapping[str, str], ns) -> int:
    profile = load_profile(ns.sim_profile)
    model = model_spec_for(ns.model_path)
    res = sim_args.resolve(ns, profile, model, env)
    a = res.args
    contract = res.contract
    tag = rank_tag(res)
    if res.error is not None:  # ServerArgs refused the settings: nothing was started
        _emit(early_lines(res), tag)
        log.raw(args_traceback(res), stream="stderr")
        return 1
    perf = PerfModel(a, profile, model)
    mem = memory_plan(a, profile, model)
    stats = Stats()
    loop = asyncio.get_running_loop()
    pid = os.getpid()
    state = registry.state_dir(a.sim_state_dir)
    gang = rendezvous.gang_of(getattr(a, "nnodes", 1), getattr(a, "node_rank", 0), getattr(a, "dist_init_addr", None))
    per_node = max(1, a.tp_size * a.pp_size // (gang.nnodes if gang is not None else 1))
    gpus = _gpu_ids(per_node, a.base_gpu_id, profile.count, env)
    others = registry.used_mib_by_gpu(registry.live_entries(state), exclude_pid=pid)
    others_gb = max((others.get(g, 0) for g in gpus), default=0) / 1024.0
    entry = {
        "pid": pid,
        "port": a.port,
        "host": a.host,
        "tp": a.tp_size,
        "gpus": gpus,
        "mem_mib": 0,
        "util": 0,
        "model": a.model_path,
        "profile": profile.name,
        "started": time.time(),
        "status": "Loading",
        "sglang_version": res.version,
        "procs": [],
    }
    registered = False
    children = ChildProcesses()

    def publish(**changes: object) -> None:
        nonlocal registered
        entry.update(changes)
        registry.register(state, entry)
        registered = True

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, ledger.on_signal(sig.name, stop.set))
    ledger.engine_started("sglang", a.port)

    def nan_warning(kind: str) -> None:
        """NaN logits in a garbage-producing config: a warning, and the server keeps serving garbage."""
        if getattr(a, "enable_nan_detection", False):
            log.info(texts.say(contract, "nan_in_logits"), rank=tag)
        elif (
            sim_args.is_new_layout(res.version)
            and env.get("SGLANG_SANITIZE_NAN_LOGITS", "").lower() in ("1", "true")
            and not nan_warning.__dict__.get("done")
        ):
            nan_warning.__dict__["done"] = True
            log.info(texts.say(contract, "nan_sanitized_warning", msg="sampler: next_token_logits"), rank=tag)

    garbage = answers.quality_for(a, res.version, profile.sm) == answers.GARBAGE
    scheduler: FixedScheduler | BatchScheduler
    if a.sim_timing == "fixed":
        scheduler = FixedScheduler(stats, a.enable_metrics, a.sim_ttft_ms / 1000.0, a.sim_itl_ms / 1000.0)
    else:
        scheduler = BatchScheduler(
            stats,
            a.enable_metrics,
            perf,
            res.max_running,
            a.chunked_prefill_size,
            mem.max_total_num_tokens,
            a.decode_log_interval,
            model.hybrid,
            res.spec_on,
            lambda idle: None,
            rank=tag,
            on_forward=nan_warning if garbage else None,
        )
    server = SimServer(res, profile, model, perf, mem, stats, scheduler)
    runner: web.AppRunner | None = None
    t0 = time.time()
    load_s = max(0.0, a.sim_load_s)
    killed = False
    try:
        # --- 1. loading: no listener ---------------------------------------------------------------
        for i, step in enumerate(plan_startup(res, profile, model, mem, perf.allreduce, others_gb)):
            if await _sleep_until(t0 + step.frac * load_s, stop):
                return 0
            _emit(step.lines, tag)
            if gang is not None and "!Init torch distributed begin." in step.lines:
                try:  # every rank meets the others here, before "Init torch distributed ends."
                    t0 += await rendezvous.join(gang, delay_s=a.sim_join_delay_s, timeout_s=_join_timeout(a), stop=stop)
                except rendezvous.JoinFailed as exc:
                    log.info(exc.line, rank=tag)
                    return 1
                if stop.is_set():
                    return 0
            if i == 0:
                if a.enable_dp_attention:
                    try:
                        await wait_internal_ports(contract, a.port, log.info, stop)
                    except InternalPortError as exc:
                        for line in exc.logged:
                            log.info(line)
                        log.raw(
                            f'Traceback (most recent call last):\n  File "{__file__}", in init_new\n{exc.exc_line}',
                            stream="stderr",
                        )
                        return 1
                titles = scheduler_titles(a.tp_size, a.pp_size, a.ep_size)
                ranks = [(title, gpus[r] if r < len(gpus) else None) for r, title in enumerate(titles)]
                children.start(ranks)
                publish(procs=children.as_registry())
            if step.mem_gb is not None:
                publish(mem_mib=int(step.mem_gb * 1024))
            if step.fatal is not None:
                log.info(step.fatal.rstrip("\n"), rank=tag)
                log.info(texts.say(contract, "child_sigquit"))
                killed = True
                return KILLED
        if await _sleep_until(t0 + load_s, stop):
            return 0
        if gang is not None and not gang.is_head:  # a rank above 0 serves no HTTP: its schedulers wait
            publish(status="ready", mem_mib=int(mem.used_gb * 1024))
            await stop.wait()
            return 0
        # --- 2. listening: uvicorn binds, warm-up runs ----------------------------------------------
        sock = _bind(a.host, a.port)
        _emit(uvicorn_lines(res, pid, sock is not None), tag)
        if sock is None:
            return 1
        runner = web.AppRunner(
            server.app(), access_log=None, handle_signals=False, keepalive_timeout=_keepalive_s(res.version, env)
        )
        await runner.setup()
        await web.SockSite(runner, sock).start()
        if isinstance(scheduler, BatchScheduler):
            scheduler.start()
        publish(status="Starting")
        if await _sleep_until(t0 + a.sim_startup_s, stop):
            return 0
        if not a.skip_server_warmup:
            try:
                ledger.WARMING[0] = True
                await server.warmup()
            except Exception as exc:  # SGLang logs whatever the warm-up raised
                tb = "".join(traceback.format_exception(exc)).rstrip("\n")
                log.info(f"Initialization failed. warmup error: {tb}")
                killed = True
                return KILLED
        ledger.WARMING[0] = False
        server.up = True
        log.info(texts.say(contract, "ready"))
        publish(status="ready", mem_mib=int(mem.used_gb * 1024))
        # --- 3. ready -----------------------------------------------------------------------------
        await LoadPublisher(stats, perf, publish).run(stop)  # nvidia-smi's utilisation, power and PCIe
        return 0
    finally:
        ledger.record("engine_exit")
        server.shutting_down = True
        if registered:
            registry.unregister(state, pid)
        children.stop(timeout=0.5 if killed else 2.0)
        if isinstance(scheduler, BatchScheduler):
            await scheduler.stop()
        if runner is not None:
            await runner.cleanup()


def _join_timeout(a) -> float:
    """How long a gang's rank waits for the others: ``--sim-join-timeout-s``, else ``--dist-timeout``, else 60 s."""
    if a.sim_join_timeout_s is not None:
        return float(a.sim_join_timeout_s)
    return float(getattr(a, "dist_timeout", None) or 60)


def _print_traceback(message: str) -> None:
    """An uncaught ValueError of ``prepare_server_args`` (e.g. the --config merge), as Python prints it."""
    print(
        'Traceback (most recent call last):\n  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        f"ValueError: {message}",
        file=sys.stderr,
        flush=True,
    )


def serve_argv(words: list[str]) -> list[str]:
    """``sglang serve``'s words as its LLM backend hands them to ServerArgs (``sglang/cli/serve.py``): the
    backend choice ``--model-type X`` taken out, a first plain word read as ``--model-path``."""
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--model-type":
            skip = True
        elif not word.startswith("--model-type="):
            kept.append(word)
    return ["--model-path", kept[0], *kept[1:]] if kept and not kept[0].startswith("-") else kept


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``benchbot sim sglang`` / ``python -m workers.sim.sglang``; returns the exit code.

    A first word ``serve`` or ``version`` is SGLang's console script (``sglang serve ...``, ``sglang
    version``), so a shebang script that calls this stands in for ``/venv/bin/sglang``."""
    env = dict(os.environ)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["version"]:  # `sglang version`, as SGLang's console script answers it
        sim, _ = sim_args.split_sim_args(argv[1:], env)
        print(f"sglang version: {sim.sim_sglang_version}\ngit revision: N/A", flush=True)
        return 0
    if argv[:1] == ["serve"]:
        argv = serve_argv(argv[1:])
    try:
        sim, rest = sim_args.split_sim_args(argv, env)
        if "--version" in rest:
            print(sim.sim_sglang_version, flush=True)
            return 0
        ns = sim_args.parse(argv, env)
    except SystemExit as exc:  # argparse: 2 on bad flags, 0 on --help
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    except ConfigFileError as exc:
        _print_traceback(str(exc))
        return 1
    try:
        code = uvloop.run(_serve(env, ns))
    except BenchbotError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 0
    if code == KILLED:
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return code


if __name__ == "__main__":
    sys.exit(main())
