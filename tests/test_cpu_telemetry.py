"""A host without GPUs (``gpus = 0``: vLLM's CPU build) has no GPU to miss (issue 36 item 5).

Its telemetry samples what the host has (the server's own gauges, from a real HTTP server on 127.0.0.1 that
answers as vLLM's /metrics does), says nothing about a missing nvidia-smi, and its figure draws the server
panels only: no empty GPU power and PCIe panels. A GPU host whose config names no nvidia-smi still says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bot import plots
from tests.factories import make_run
from tests.test_cpu_host import CPU_HOST
from tests.util import async_wait_until
from workers.config import parse_config
from workers.host.local import LocalTransport
from workers.results import tables
from workers.telemetry import fingerprint
from workers.telemetry import run as telemetry_run
from workers.telemetry.sampler import NO_GPUS
from workers.telemetry.summary import attach, run_extra

METRICS = b"""# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="tiny"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="tiny"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="tiny"} 0.25
"""


@pytest.fixture
def metrics_port() -> Iterator[int]:
    """A real HTTP server answering /metrics with vLLM's gauges."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(METRICS)))
            self.end_headers()
            self.wfile.write(METRICS)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_cpu_hosts_telemetry_misses_no_gpu_and_draws_only_what_it_sampled(metrics_port: int, tmp_path: Path) -> None:
    config = parse_config(CPU_HOST.replace("port = 18500", f"port = {metrics_port}"), "t.toml")
    tel = telemetry_run.for_host(config.hosts["cpu"], LocalTransport())
    tel.interval_s = 0.05
    assert tel.gpu_missing == NO_GPUS

    async def one_level() -> None:
        async with tel.level() as samples:

            async def ticked() -> bool:
                return len(samples) >= 3

            await async_wait_until(ticked, what="three sampler ticks")

    asyncio.run(one_level())
    run = make_run("r1", levels=(1,))
    (level,) = attach(tel, 0, [dict(run.levels[0])])
    sampled = level["telemetry"]
    assert sampled["missing"] == [] and sampled["no_gpus"] is True, sampled
    assert sampled["kv_usage_peak"] == 0.25 and sampled["queue_mean"] == 2.0  # the CPU-side telemetry stays
    run = dataclasses.replace(run, levels=(level,), extra={**run.extra, **run_extra((level,))})
    assert "telemetry missing" not in tables.format_levels_table(run)

    figure = plots.draw_bench(run, None, tmp_path)[-1]
    assert figure.kind == "telemetry"
    assert [p.title for p in figure.panels] == ["KV-cache usage", "Requests queued in the server"]
    assert figure.alt_text.startswith("KV-cache usage and queued requests over time")

    cpu = asyncio.run(telemetry_run.host_extra(config.hosts["cpu"], LocalTransport(), "0.32.0"))
    assert not any("nvidia-smi" in m for m in cpu[fingerprint.EXTRA_KEY]["missing"])
    gpu = asyncio.run(fingerprint.collect(LocalTransport(), (), config.hosts["gpu"].engine.command, "0.32.0"))
    assert "the host config names no nvidia-smi" in gpu.missing  # a GPU host without one misses it
    assert telemetry_run.for_host(config.hosts["gpu"], LocalTransport()).gpu_missing is None
