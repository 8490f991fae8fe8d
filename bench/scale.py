"""Scale: 50 simulated hosts and 1,000 queued jobs -> /status and /queue latency, enqueue rate, Redis memory.

Builds a config with H hosts (local transport; each host's "GPU box" is this machine: nothing listens
on its engine port and its nvidia-smi is the simulator's), starts one observer per host the way each
``benchbot worker`` does (``workers.observer.ObserverService``), enqueues J jobs through the
dispatcher every front end uses (launches and benches from many users, spread over the hosts), then
times ``/queue`` (all hosts, read from Redis) and ``/status`` (all hosts, each observed afresh by its
observer) and reads Redis's ``used_memory`` before and after. Prints one JSON object.

    .venv/bin/python bench/scale.py            # 50 hosts, 1,000 jobs
    .venv/bin/python bench/scale.py --quick    # 3 hosts, 60 jobs, no nvidia-smi: for tests
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


BASE_PORT = 41000


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))] if ordered else float("nan")


def _stats(values_ms: list[float]) -> dict:
    return {
        "n": len(values_ms),
        "p50": round(_pct(values_ms, 0.5), 2),
        "p99": round(_pct(values_ms, 0.99), 2),
        "max": round(max(values_ms), 2),
    }


def scale_config(hosts: int, base_port: int, *, gpus: bool = True):
    """H simulated hosts with the seed's presets; limits that let one user queue many jobs.

    ``gpus=False`` gives the hosts no nvidia-smi (no process per observation): quick mode only.
    """
    from workers.config import SEED_PRESETS_TOML, parse_config

    lines = [
        'default_host = "gpu-001"',
        "[engine]",
        'command = ["{python}", "-m", "workers.sim.sglang"]',
        'flags = { "--tp-size" = 8, "--disable-custom-all-reduce" = true }',
    ]
    for i in range(1, hosts + 1):
        smi = '["{python}", "-m", "workers.sim.nvidia_smi"]' if gpus else "[]"
        lines += [f"[hosts.gpu-{i:03d}]", f"port = {base_port + i}", f"nvidia_smi = {smi}"]
    lines += ["[limits]", "max_queued_per_user = 10000"]
    return parse_config("\n".join(lines) + "\n" + SEED_PRESETS_TOML, "scale.toml")


def run(hosts: int, jobs: int, status_reps: int, queue_reps: int, *, gpus: bool = True) -> dict:
    import redis

    from bot.dispatch import Dispatcher
    from workers import keys, redis_conn

    work = Path(tempfile.mkdtemp(prefix="bb-scale-"))
    sock = redis_conn.start_redis_server(work / "redis")
    url = f"unix://{sock}"
    os.environ["BENCHBOT_SIM_STATE_DIR"] = str(work / "sim")
    r = redis.Redis.from_url(url)
    config = scale_config(hosts, BASE_PORT, gpus=gpus)
    names = list(config.hosts)
    # The observers live in another process, as they do in each worker: not in the dispatcher's GIL.
    observers = subprocess.Popen(
        [sys.executable, __file__, "--serve-observers", url, str(hosts), str(int(gpus))],
        stdin=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 60
        while sum(bool(r.exists(keys.observer_alive(h))) for h in names) < hosts:
            if time.monotonic() > deadline:
                raise RuntimeError("observers did not come up")
            time.sleep(0.05)
        dispatcher = Dispatcher(config, r, plots_dir=work / "plots")
        memory_before = int(r.info("memory")["used_memory"])
        enqueue_ms: list[float] = []
        for j in range(jobs):
            host = names[j % hosts]
            line = f"/launch cutlass cudnn on {host}" if j % 2 == 0 else f"/bench 1,8,32 in=512 out=64 on {host} any"
            began = time.perf_counter()
            reply = dispatcher.handle(f"user{j % 40:02d}", "C0TEAM", line)
            enqueue_ms.append((time.perf_counter() - began) * 1000)
            if not reply.ok:
                raise RuntimeError(f"{line!r} was refused: {reply.text}")
        memory_after = int(r.info("memory")["used_memory"])

        queue_ms: list[float] = []
        for _ in range(queue_reps):
            began = time.perf_counter()
            reply = dispatcher.handle("user00", "C0TEAM", "/queue")
            queue_ms.append((time.perf_counter() - began) * 1000)
        listed = sum(len(v) for v in reply.data["hosts"].values())

        status_ms: list[float] = []
        for _ in range(status_reps):
            began = time.perf_counter()
            reply = dispatcher.handle("user00", "C0TEAM", "/status")
            status_ms.append((time.perf_counter() - began) * 1000)
        fresh = sum(1 for v in reply.data["hosts"] if v["fresh"])
        one_host_ms: list[float] = []
        for _ in range(max(2, queue_reps // 4)):
            began = time.perf_counter()
            dispatcher.handle("user00", "C0TEAM", f"/status {names[0]}")
            one_host_ms.append((time.perf_counter() - began) * 1000)
        return {
            "schema": 1,
            "bench": "scale",
            "hosts": hosts,
            "nvidia_smi": "simulated" if gpus else "none",
            "jobs_queued": jobs,
            "jobs_listed_by_queue": listed,
            "enqueue_ms": _stats(enqueue_ms),
            "queue_all_hosts_ms": _stats(queue_ms),
            "status_all_hosts_ms": _stats(status_ms),
            "status_all_hosts_fresh": fresh,
            "status_one_host_ms": _stats(one_host_ms),
            "redis_used_memory_mb": {
                "before": round(memory_before / 2**20, 2),
                "after": round(memory_after / 2**20, 2),
                "per_job_kb": round((memory_after - memory_before) / jobs / 1024, 2),
            },
            "cpus": os.cpu_count(),
        }
    finally:
        observers.communicate(b"", timeout=60)  # EOF on stdin: the observers stop and the process exits
        r.close()
        redis_conn.stop_redis_server(work / "redis")
        shutil.rmtree(work, ignore_errors=True)


def serve_observers(url: str, hosts: int, gpus: bool) -> None:
    """One observer per host (as each ``benchbot worker`` runs one) until stdin closes."""
    from workers.observer import ObserverService

    config = scale_config(hosts, BASE_PORT, gpus=gpus)
    services = [ObserverService(config, url, [h]).start() for h in config.hosts]
    sys.stdin.read()
    for service in services:
        service.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 hosts, 60 jobs, no nvidia-smi (for tests)")
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--serve-observers", nargs=3, metavar=("URL", "HOSTS", "GPUS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_observers:
        url, hosts, gpus = args.serve_observers
        serve_observers(url, int(hosts), gpus == "1")
        return 0
    if args.quick:
        result = run(3, 60, status_reps=1, queue_reps=4, gpus=False)
    else:
        result = run(args.hosts, args.jobs, status_reps=2, queue_reps=20)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
