"""``python -m workers.sim.sglang [SGLang launch flags]``: a simulated ``sglang.launch_server``.

Start-up replays SGLang's log over ``--sim-startup-s`` seconds (``/health`` answers 503 meanwhile),
dies like SGLang on the seed's bad configs, registers the server for the ``nvidia-smi`` stand-in,
then serves the HTTP surface until SIGTERM/SIGINT (exit 0) -- see docs/sim.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping

import uvloop
from aiohttp import web

from workers.errors import BenchbotError
from workers.sim import args as sim_args
from workers.sim import log, registry
from workers.sim.engine import BatchScheduler, FixedScheduler, Stats
from workers.sim.perf import PerfModel, memory_plan
from workers.sim.profile import load_profile, model_spec_for
from workers.sim.server import SimServer
from workers.sim.startup import READY_LINE, plan_startup

SIGQUIT_LINE = "Received sigquit from a child process. It usually means the child failed."


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
    return [g for g in ids[base: base + tp] if g < count]


async def _serve(argv_env: Mapping[str, str], ns) -> int:
    profile = load_profile(ns.sim_profile)
    model = model_spec_for(ns.model_path)
    res = sim_args.resolve(ns, profile, model, argv_env)
    a = res.args
    perf = PerfModel(a, profile, model)
    mem = memory_plan(a, profile, model)
    stats = Stats()
    loop = asyncio.get_running_loop()
    pid = os.getpid()
    state = registry.state_dir(a.sim_state_dir)
    gpus = _gpu_ids(a.tp_size, a.base_gpu_id, profile.count, argv_env)
    others = registry.used_mib_by_gpu(registry.live_entries(state), exclude_pid=pid)
    others_gb = max((others.get(g, 0) for g in gpus), default=0) / 1024.0
    entry = {"pid": pid, "port": a.port, "host": a.host, "tp": a.tp_size, "gpus": gpus, "mem_mib": 0,
             "util": 0, "model": a.model_path, "profile": profile.name, "started": time.time(), "status": "Starting"}
    registered = False

    def publish(**changes: object) -> None:
        nonlocal registered
        entry.update(changes)
        registry.register(state, entry)
        registered = True

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    if a.sim_timing == "fixed":
        scheduler = FixedScheduler(stats, a.enable_metrics, a.sim_ttft_ms / 1000.0, a.sim_itl_ms / 1000.0)
    else:
        scheduler = BatchScheduler(
            stats, a.enable_metrics, perf, a.max_running_requests, a.chunked_prefill_size,
            mem.max_total_num_tokens, a.decode_log_interval, model.hybrid, res.spec_on, lambda idle: None,
        )
    server = SimServer(res, profile, model, perf, mem, stats, scheduler)
    sock = _bind(a.host, a.port)
    runner: web.AppRunner | None = None
    if sock is not None:
        runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)
        await runner.setup()
        await web.SockSite(runner, sock).start()

    steps = plan_startup(res, profile, model, mem, perf.allreduce, others_gb, sock is None, pid)
    t0 = time.time()
    code = 0
    try:
        for step in steps:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, t0 + step.frac * a.sim_startup_s - time.time()))
            if stop.is_set():
                return 0
            for line in step.lines:
                if line.startswith("@"):
                    log.raw(line[1:])
                elif line.startswith("!"):
                    log.info(line[1:], rank="TP0")
                else:
                    log.info(line)
            if step.mem_gb is not None:
                publish(mem_mib=int(step.mem_gb * 1024))
            if step.fatal is not None:
                if step.fatal.startswith("Scheduler hit an exception"):
                    log.info(step.fatal.rstrip("\n"), rank="TP0")
                    log.info(SIGQUIT_LINE)
                elif step.fatal:
                    log.raw(step.fatal, stream="stderr")
                return 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, t0 + a.sim_startup_s - time.time()))
        if stop.is_set():
            return 0
        if isinstance(scheduler, BatchScheduler):
            scheduler.start()
        server.status = "ready"
        if not a.skip_server_warmup:
            await server.probe(8)
        log.info(READY_LINE)
        publish(status="ready", mem_mib=int(mem.used_gb * 1024))
        busy = False
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            now_busy = stats.running > 0 or stats.queued > 0
            if now_busy != busy:
                busy = now_busy
                publish(util=100 if busy else 0)
        return code
    finally:
        server.status = "shutting down"
        if registered:
            registry.unregister(state, pid)
        if isinstance(scheduler, BatchScheduler):
            await scheduler.stop()
        if runner is not None:
            await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``benchbot sim sglang`` / ``python -m workers.sim.sglang``; returns the exit code."""
    env = dict(os.environ)
    try:
        ns = sim_args.parse(argv, env)
    except SystemExit as exc:  # argparse: 2 on bad flags, 0 on --help
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    try:
        return uvloop.run(_serve(env, ns))
    except BenchbotError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
