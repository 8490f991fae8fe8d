"""Round 4, items 4 and 6 (issue 39): a scrape never disturbs the load it measures, and an engine's figure
is checked before it is a fact.

A real HTTP server on 127.0.0.1 serves a 16 MiB ``/metrics`` (a real engine with many series and DP ranks
reaches 1 MiB), with the gauges benchbot reads at its very end. The sampler runs on the same event loop as
a probe that measures how late its own timer fires (what the load generator's TTFT/ITL would carry): the
parse runs off the loop, the gauges are still read, and the level says what the sampler cost.
"""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from workers.telemetry import summary
from workers.telemetry.sampler import RunTelemetry, Sample
from workers.telemetry.server_metrics import ServerReading, parse_server_metrics

GAUGES = (
    "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 7\n"
    "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 2\n"
    "# TYPE sglang:token_usage gauge\nsglang:token_usage 0.25\n"
)


def big_metrics(size: int) -> bytes:
    """``size`` bytes of one histogram with many label sets, then the gauges."""
    lines = ["# HELP junk_seconds A histogram of many series.", "# TYPE junk_seconds histogram"]
    total, i = 0, 0
    while total < size:
        line = f'junk_seconds_bucket{{rank="{i % 64}",model="m{i // 64}",le="{i % 17}.0"}} {i}'
        lines.append(line)
        total += len(line) + 1
        i += 1
    return ("\n".join(lines) + "\n" + GAUGES).encode()


class MetricsServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    body = b""


class MetricsHandler(http.server.BaseHTTPRequestHandler):
    server: MetricsServer

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def metrics_url() -> Iterator[str]:
    server = MetricsServer(("127.0.0.1", 0), MetricsHandler)
    server.body = big_metrics(16 * 2**20 - 4096)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def test_a_16_mib_metrics_is_read_off_the_loop_and_the_level_says_what_it_cost(metrics_url: str) -> None:
    tel = RunTelemetry(transport=None, nvidia_smi=(), metrics_url=metrics_url, interval_s=0.2)  # type: ignore[arg-type]

    async def level() -> tuple[list[Sample], float]:
        worst = 0.0
        async with tel.level() as samples:
            deadline = time.monotonic() + 4.0
            while time.monotonic() < deadline or not any(s.server for s in samples):
                before = time.monotonic()
                await asyncio.sleep(0.01)
                worst = max(worst, time.monotonic() - before - 0.01)
                if time.monotonic() > deadline + 60:
                    break
        return samples, worst

    samples, worst_lag = asyncio.run(level())
    read = [s.server for s in samples if s.server is not None]
    assert read and read[0] == ServerReading(7.0, 2.0, 0.25), read[:1]  # the gauges at the end of 16 MiB
    # the client's loop was never held for the parse (on the loop, it held it for seconds at a time)
    assert worst_lag < 0.5, f"the event loop stalled {worst_lag:.2f} s while the sampler scraped"
    scraped = [s for s in samples if s.scrape_bytes]
    assert scraped and all(s.scrape_bytes > 16 * 10**6 for s in scraped)
    # the next scrape waits for the last parse's CPU to stay under 5 % of the time
    assert len(scraped) < len(samples) or len(samples) == 1
    cost = summary.sampler_cost(samples, {"duration_s": 4.0})
    assert cost["cpu_s"] > 0 and cost["bytes_max"] == scraped[0].scrape_bytes
    assert "disturbed" in cost and "client's timings may be inflated" in str(cost["disturbed"])


def test_a_small_metrics_is_not_flagged() -> None:
    samples = [Sample(float(t), (), (), ServerReading(1, 0, 0.1), None, 0.0005, 4000) for t in range(8)]
    cost = summary.sampler_cost(samples, {"duration_s": 8.0})
    assert "disturbed" not in cost and cost["bytes_max"] == 4000


def test_impossible_engine_figures_are_dropped_and_counted_not_facts() -> None:
    text = (
        "# TYPE sglang:token_usage gauge\n"
        'sglang:token_usage{dp="0"} +Inf\nsglang:token_usage{dp="1"} 0.5\nsglang:token_usage{dp="2"} 3.5\n'
        "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs -5\n"
        "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs NaN\n"
    )
    reading = parse_server_metrics(text)
    assert reading == ServerReading(None, None, 0.5, dropped=4)
    only_bad = parse_server_metrics("sglang:token_usage +Inf\nsglang:num_queue_reqs -5\n")
    assert only_bad.kv_usage is None and only_bad.queued is None and only_bad.dropped == 2
    samples = [Sample(float(t), (), (), only_bad) for t in range(4)]
    tel = summary.summarize_level(samples, {"duration_s": 4.0}, None)
    assert tel["kv_usage_peak"] is None and tel["queue_mean"] is None and tel["bound"] == []
    assert any("8 impossible /metrics value(s) dropped" in m for m in tel["missing"]), tel["missing"]


def test_the_bench_table_notes_a_level_the_sampler_disturbed() -> None:
    import dataclasses

    from tests.factories import make_run
    from workers.results.tables import format_levels_table

    run = make_run("r9", levels=(1, 8))
    busy = [Sample(float(t), (), (), ServerReading(1, 0, 0.1), None, 0.2, 16 * 10**6) for t in range(4)]
    flagged = {**run.levels[1], "telemetry": {"sampler": summary.sampler_cost(busy, {"duration_s": 4.0})}}
    text = format_levels_table(dataclasses.replace(run, levels=(run.levels[0], flagged)))
    notes = [line for line in text.splitlines() if "sampler" in line]
    assert len(notes) == 1 and notes[0].startswith("c=8: the /metrics sampler took 800 ms of CPU"), notes
