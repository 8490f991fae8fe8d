"""Scale: 50 simulated hosts and 1,000 queued jobs -> /status and /queue latency, enqueue rate, Redis memory.

Builds a config with H hosts (local transport; each host's "GPU box" is this machine: nothing listens
on its engine port and its nvidia-smi is the simulator's), starts one observer per host the way each
``benchbot worker`` does (``workers.observer.ObserverService``), enqueues J jobs through the
dispatcher every front end uses (launches and benches from many users, spread over the hosts), then
times ``/queue`` (all hosts, read from Redis) and ``/status`` (all hosts: fresh answers asked for in
parallel within ``limits.status_deadline_s``, the observers' stored ones with their age otherwise) and
reads Redis's ``used_memory`` before and after. Issue 23's targets: ``/status`` of 50 hosts under 1 s p95,
``/queue`` of 1,000 jobs under 50 ms p95, enqueue p99 under 10 ms, each the median of 3 runs; then one
200-host run (50 observer processes serving 4 hosts each, as a worker serving several hosts does).
Prints one JSON object.

    .venv/bin/python bench/scale.py            # 3 x (50 hosts, 1,000 jobs), then 200 hosts
    .venv/bin/python bench/scale.py --quick    # 3 hosts, 60 jobs, no nvidia-smi: for tests
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
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
        "p95": round(_pct(values_ms, 0.95), 2),
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


def run(
    hosts: int, jobs: int, status_reps: int, queue_reps: int, *, gpus: bool = True, hosts_per_observer: int = 1
) -> dict:
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
        [sys.executable, __file__, "--serve-observers", url, str(hosts), str(int(gpus)), str(hosts_per_observer)],
        stdin=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 120
        while sum(bool(r.exists(keys.observer_alive(h))) for h in names) < hosts:
            if time.monotonic() > deadline:
                raise RuntimeError("observers did not come up")
            time.sleep(0.05)
        # Steady state, as a fleet that has run for a while is: every observer's first round is done before
        # anything is timed (at start all of them observe at once, a storm no running fleet sees).
        deadline = time.monotonic() + 120
        while sum(bool(r.exists(keys.host_observed(h))) for h in names) < hosts and time.monotonic() < deadline:
            time.sleep(0.1)
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
        fresh: list[int] = []
        stale: list[int] = []
        ages: list[float] = []
        unrefreshed: Counter[str] = Counter()
        for _ in range(status_reps):
            began = time.perf_counter()
            reply = dispatcher.handle("user00", "C0TEAM", "/status")
            status_ms.append((time.perf_counter() - began) * 1000)
            views = reply.data["hosts"]
            fresh.append(sum(1 for v in views if v["fresh"]))
            stale.append(sum(1 for v in views if v["stale"]))
            ages += [v["age_s"] for v in views if v["age_s"] is not None]
            unrefreshed.update(
                "never observed" if v["age_s"] is None else "answered from Redis" for v in views if not v["fresh"]
            )
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
            "status_all_hosts_fresh": {"min": min(fresh), "max": max(fresh)},
            "status_all_hosts_stale": {"min": min(stale), "max": max(stale)},
            "status_observation_age_s": {"p50": round(_pct(ages, 0.5), 2), "max": round(max(ages, default=0), 2)},
            "status_not_refreshed": dict(unrefreshed),
            "hosts_per_observer": hosts_per_observer,
            "status_one_host_ms": _stats(one_host_ms),
            "redis_used_memory_mb": {
                "before": round(memory_before / 2**20, 2),
                "after": round(memory_after / 2**20, 2),
                "per_job_kb": round((memory_after - memory_before) / jobs / 1024, 2),
            },
            "cpus": os.cpu_count(),
        }
    finally:
        try:
            observers.communicate(b"", timeout=60)  # EOF on stdin: the observers stop and the process exits
        except subprocess.TimeoutExpired:
            observers.kill()
            observers.wait(timeout=30)
        r.close()
        redis_conn.stop_redis_server(work / "redis")
        shutil.rmtree(work, ignore_errors=True)


def serve_observers(url: str, hosts: int, gpus: bool, per_observer: int) -> None:
    """One observer per ``per_observer`` hosts (as each ``benchbot worker`` runs one) until stdin closes."""
    from workers.observer import ObserverService

    config = scale_config(hosts, BASE_PORT, gpus=gpus)
    names = list(config.hosts)
    groups = [names[i : i + per_observer] for i in range(0, len(names), per_observer)]
    services = [ObserverService(config, url, group).start() for group in groups]
    sys.stdin.read()
    for service in services:
        service.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 hosts, 60 jobs, no nvidia-smi (for tests)")
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3, help="runs of the main size; figures are their medians")
    parser.add_argument("--big-hosts", type=int, default=200, help="hosts of the one extra large run (0: none)")
    parser.add_argument("--serve-observers", nargs=4, metavar=("URL", "HOSTS", "GPUS", "PER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_observers:
        url, hosts, gpus, per = args.serve_observers
        serve_observers(url, int(hosts), gpus == "1", int(per))
        return 0
    if args.quick:
        result = run(3, 60, status_reps=2, queue_reps=4, gpus=False)
    else:
        runs = [run(args.hosts, args.jobs, status_reps=10, queue_reps=20) for _ in range(args.repeat)]
        result = {**runs[-1], "runs": len(runs), "medians": medians(runs)}
        if args.big_hosts:
            # The big run is one more figure, not a condition of the others: a failure is reported in the JSON.
            try:
                big = run(args.big_hosts, args.jobs, status_reps=5, queue_reps=20, hosts_per_observer=4)
                result["big"] = {"hosts": args.big_hosts, "medians": medians([big])}
            except (RuntimeError, subprocess.SubprocessError) as exc:
                result["big"] = {"hosts": args.big_hosts, "error": str(exc)}
    print(json.dumps(result, indent=2))
    return 0


TARGETS = {  # issue 23: (figure path, at most ms)
    "status_all_hosts_ms.p95": 1000.0,
    "queue_all_hosts_ms.p95": 50.0,
    "enqueue_ms.p99": 10.0,
}


def medians(runs: list[dict]) -> dict:
    """Each latency figure as the median over runs, with issue 23's target beside it where it has one."""
    out: dict[str, dict[str, float | bool]] = {}
    for figure in ("enqueue_ms", "queue_all_hosts_ms", "status_all_hosts_ms", "status_one_host_ms"):
        for q in ("p50", "p95", "p99"):
            name = f"{figure}.{q}"
            value = round(statistics.median(r[figure][q] for r in runs), 2)
            out[name] = {"median": value}
            if name in TARGETS:
                out[name] |= {"target": TARGETS[name], "met": value < TARGETS[name]}
    return out


if __name__ == "__main__":
    sys.exit(main())
