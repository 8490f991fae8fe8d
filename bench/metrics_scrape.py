"""What one Prometheus scrape of benchbot costs: 50 hosts, 1,000 unfinished jobs, a history of endings.

Starts a private Redis, enqueues J jobs over H hosts (the real ``queue.enqueue``), gives some hosts a
lease holder and an observation, ends E more jobs through the real terminal publish (so the counters
and the duration histogram are what a busy week leaves), serves the bot-scope endpoint
(``workers.ops_metrics``: every host) on 127.0.0.1 and times N scrapes over HTTP, parsed by
prometheus_client's parser as Prometheus would. Prints one JSON object.

    .venv/bin/python bench/metrics_scrape.py            # 50 hosts, 1,000 jobs, 2,000 endings, 30 scrapes
    .venv/bin/python bench/metrics_scrape.py --quick    # 3 hosts, 30 jobs: for tests
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KINDS = ("launch", "bench", "sweep", "stop", "eval")
CATEGORIES = ("cuda_oom", "timeout", "lease_lost", "bench_failed", "internal")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))] if ordered else float("nan")


def run(hosts: int, jobs: int, endings: int, scrapes: int) -> dict[str, object]:
    import httpx
    import redis
    from prometheus_client.parser import text_string_to_metric_families

    from workers import keys, ops_metrics, redis_conn
    from workers.jobs import events, lease, queue, waiting_line

    work = Path(tempfile.mkdtemp(prefix="bb-metrics-"))
    sock = redis_conn.start_redis_server(work / "redis")
    r = redis.Redis.from_url(f"unix://{sock}")
    names = [f"gpu-{i:03d}" for i in range(1, hosts + 1)]

    def enqueue(j: int) -> queue.QueuedJob:
        host = names[j % hosts]
        return queue.enqueue(
            r,
            host,
            KINDS[j % len(KINDS)],
            {"j": j},
            user=f"user{j % 40:02d}",
            channel="C0",
            summary="x",
            job_timeout_s=60,
        )

    try:
        for j in range(endings):  # a history: each held its host, then ended
            job = enqueue(j)
            waiting_line.remove_waiter(r, job.host, job.job_id)
            held = lease.try_acquire(r, job.host, job=job.job_id, user="u", seq=job.seq)
            data = {"diagnosis": {"category": CATEGORIES[j % len(CATEGORIES)]}} if j % 3 == 0 else {}
            events.publish(r, job.job_id, events.FAILED if j % 3 == 0 else events.SUCCEEDED, data)
            if isinstance(held, lease.Lease):
                held.release()
        for j in range(jobs):
            enqueue(endings + j)
        for host in names[: hosts // 2]:
            r.set(keys.host_observed(host), json.dumps({"observed_at": time.time() - 5}))
        server = ops_metrics.serve(ops_metrics.fleet_registry(r, names, all_series=True), 0)
        try:
            took_ms: list[float] = []
            size = series = 0
            for _ in range(scrapes):
                began = time.perf_counter()
                text = httpx.get(server.url, timeout=30).text
                families = list(text_string_to_metric_families(text))
                took_ms.append((time.perf_counter() - began) * 1000)
                size, series = len(text), sum(len(f.samples) for f in families)
            last = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}
            depth = sum(
                s.value
                for f in text_string_to_metric_families(text)
                if f.name == "benchbot_queue_depth"
                for s in f.samples
            )
        finally:
            server.stop()
        return {
            "schema": 1,
            "bench": "metrics_scrape",
            "hosts": hosts,
            "jobs_unfinished": jobs,
            "jobs_ended": endings,
            "queue_depth_scraped": depth,
            "scrape_ms": {
                "n": len(took_ms),
                "p50": round(_pct(took_ms, 0.5), 2),
                "p95": round(_pct(took_ms, 0.95), 2),
                "max": round(max(took_ms), 2),
            },
            "collect_ms_last": round(last["benchbot_metrics_collect_seconds"] * 1000, 2),  # Redis reads, server side
            "scrape_bytes": size,
            "series": series,
            "cpus": os.cpu_count(),
        }
    finally:
        r.close()
        redis_conn.stop_redis_server(work / "redis")
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 hosts, 30 jobs, 30 endings, 5 scrapes")
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--endings", type=int, default=2000)
    parser.add_argument("--scrapes", type=int, default=30)
    args = parser.parse_args()
    if args.quick:
        args.hosts, args.jobs, args.endings, args.scrapes = 3, 30, 30, 5
    print(json.dumps(run(args.hosts, args.jobs, args.endings, args.scrapes), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
