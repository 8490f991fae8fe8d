"""The load scripts in ``--quick`` mode: they run, print one JSON object, and their promises hold.

Speed targets are *reported* by the scripts (``meets_goal``), never asserted here: a test must not fail
because the box is busy. What is asserted is what must hold at any speed: every command acknowledged
with 200, every job queued once and in order per host, none lost; every queued job listed by /queue.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def run_script(name: str) -> dict:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / name), "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def finite_stats(stats: dict) -> None:
    for key in ("p50", "p99", "max"):
        assert isinstance(stats[key], float | int) and math.isfinite(stats[key]) and stats[key] > 0
    assert stats["p50"] <= stats["p99"] <= stats["max"]


def test_ack_latency_quick_acks_everything_and_loses_nothing() -> None:
    result = run_script("ack_latency.py")
    assert result["schema"] == 1 and result["bench"] == "ack_latency"
    total = result["users"] * result["commands_per_user"]
    assert (result["users"], result["commands_per_user"]) == (5, 4)
    assert result["commands"] == total == result["acked_200"]
    assert result["jobs_queued"] == result["distinct_jobs"] == total and result["lost"] == 0
    assert sum(result["jobs_per_host"].values()) == total
    assert result["headers_posted"] == total
    assert result["order_per_host_ok"] is True
    finite_stats(result["ack_ms"])
    assert result["ack_ms"]["max"] < 3000  # Slack's own limit: a miss here is a user-visible failure
    assert isinstance(result["meets_goal"], bool) and result["goal_p99_ms"] == 50.0


def test_scale_quick_reports_latency_and_memory_for_every_host() -> None:
    result = run_script("scale.py")
    assert result["schema"] == 1 and result["bench"] == "scale"
    assert result["jobs_listed_by_queue"] == result["jobs_queued"] == 60
    assert result["hosts"] == 3
    # Every host shown: fresh within the deadline, or its stored observation with an age; none stale, none unseen.
    assert 0 <= result["status_all_hosts_fresh"]["min"] <= result["status_all_hosts_fresh"]["max"] <= 3
    assert result["status_all_hosts_stale"]["max"] == 0
    assert "never observed" not in result["status_not_refreshed"]
    assert 0 <= result["status_observation_age_s"]["max"] < 60
    for key in ("enqueue_ms", "queue_all_hosts_ms", "status_all_hosts_ms", "status_one_host_ms"):
        finite_stats(result[key])
    memory = result["redis_used_memory_mb"]
    assert memory["after"] > memory["before"] > 0 and memory["per_job_kb"] > 0
