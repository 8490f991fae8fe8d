"""``/bench slo ...`` against the simulator, whose capacity is known by construction.

The simulated engine runs its realistic performance model with ``--max-running-requests 8``: up to 8
requests are served at once, a 9th waits for a whole request to finish (16 tokens at ~15 ms each), so
p99 TTFT jumps from tens of ms to 200+ ms right above concurrency 8. With a 150 ms TTFT limit the
knee is therefore 8 on the grid 1, 2, 3, 4, 6, 8, 11, 16, ...; the search must land within one level
of it, store every point it measured, and draw the SLO plot.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.follow import read_result_runs
from bot.plots import draw_for_result
from tests.integration.harness import BenchbotHost
from workers.results import store

pytestmark = pytest.mark.slow
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def host(redis_url: str, tmp_path: Path) -> Iterator[BenchbotHost]:
    with BenchbotHost(redis_url, tmp_path) as h:
        ok, _ = h.launch_ok("alice", "/launch cutlass cudnn --max-running-requests 8")
        assert ok.type == "succeeded", ok.data
        yield h


def test_slo_search_finds_the_known_knee_and_plots_it(host: BenchbotHost, tmp_path: Path) -> None:
    reply = host.run("alice", "/bench slo ttft=150ms max=32 in=64 out=16 warmup=0")
    assert reply.ok and reply.job_id, reply.text
    terminal, seen = host.wait(reply.job_id, timeout=180)
    assert terminal.type == "succeeded", (terminal.data, host.worker_logs())
    run = store.get_run(host.r, terminal.data["run_id"])
    search = run.extra["slo"]
    assert search["loads"][:8] == [1, 2, 3, 4, 6, 8, 11, 16]
    assert search["knee"] in (6, 8, 11), search  # the known capacity is 8: within one level
    assert search["first_failing"] is not None and search["first_failing"] > search["knee"]
    knee_points = [p for p in search["points"] if p["load"] == search["knee"]]
    assert len(knee_points) == 2 and all(p["meets"] for p in knee_points)  # confirmed by a second look
    failing = next(p for p in search["points"] if p["load"] == search["first_failing"])
    assert not failing["meets"] and "p99 TTFT" in failing["reasons"][0]
    assert all(p["goodput_rps"] is not None for p in search["points"])
    # every measured load is a stored level; the reply names the knee
    assert sorted(run.loads) == sorted({p["load"] for p in search["points"]})
    assert f"SLO: knee at concurrency {search['knee']:g}" in terminal.data["table"]
    # the GPUs were sampled around every level, as a plain bench's are: a knee has its J/token (/tune ranks on it)
    assert run.extra["telemetry"]["j_per_tok"] > 0, run.extra.get("telemetry")
    assert all("telemetry" in level for level in run.levels)
    tried = [e.data["message"] for e in seen if e.type == "progress" and e.data.get("phase") == "slo"]
    assert tried[0].startswith("trying concurrency 1 (p99 TTFT <= 150 ms")
    kinds = {info.kind: info for info in draw_for_result(read_result_runs(host.r, terminal.data), tmp_path / "plots")}
    assert set(kinds) == {"throughput", "latency", "slo", "telemetry"}
    slo_plot = kinds["slo"]
    assert slo_plot.path.read_bytes()[:8] == PNG_MAGIC
    assert slo_plot.panel("p99").series[0].label == "p99 TTFT"
