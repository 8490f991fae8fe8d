"""Engine launches through the real job path are counted by diagnosis, and two workers for one host on one
machine share its metrics port (the second warns and runs without one: metrics never stop jobs)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import HOST, BenchbotHost
from tests.util import free_port, wait_until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    text = httpx.get(url, timeout=10).text
    return {
        (s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.mark.slow
def test_a_launch_and_a_failed_launch_are_counted_and_a_second_worker_shares_the_port(
    redis_url: str, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    extra = f"[metrics]\nworker_ports = {{ {HOST} = {port} }}\n"
    with BenchbotHost(redis_url, tmp_path, workers=2, launch_timeout_s=6, extra_toml=extra) as h:
        wait_until(
            lambda: "runs without its own /metrics" in h.worker_logs(), timeout=30, what="the second worker's warning"
        )
        assert all(proc.poll() is None for proc in h.workers)  # both still serve the queue
        assert value(scrape(url), "benchbot_queue_depth", host=HOST) == 0

        h.launch_ok("alice", "/launch cutlass cudnn")
        reply = h.run("alice", "/launch cutlass cudnn --mem-fraction-static 0.95")  # the simulator's OOM
        terminal, _ = h.wait(reply.job_id)
        assert terminal.type == "failed" and terminal.data["diagnosis"]["category"] == "oom"

        s = scrape(url)
        assert value(s, "benchbot_engine_launches_total", host=HOST, engine="sglang") == 2
        assert value(s, "benchbot_engine_launch_failures_total", host=HOST, engine="sglang", category="oom") == 1
        assert value(s, "benchbot_jobs_ended_total", host=HOST, kind="launch", state="succeeded") == 1
        assert value(s, "benchbot_job_failures_total", host=HOST, kind="launch", category="oom") == 1
        assert value(s, "benchbot_job_duration_seconds_count", kind="launch") == 2
        assert value(s, "benchbot_host_served", host=HOST) == 1
