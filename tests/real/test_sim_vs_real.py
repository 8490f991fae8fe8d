"""The simulator's vLLM personality against the real CPU build: one script of requests, side by side.

Both servers get the same requests (``tests/real/surface.py``). Every fact that differs must be a row of
the table in docs/sim.md ("Simulator vs the real vLLM"), with its reason; a row whose fact no longer
differs must go too. So the simulator can only drift from the real engine in ways someone wrote down.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.real import surface
from tests.util import free_port

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "sim.md"
TABLE_TITLE = "### Simulator vs the real vLLM"

pytestmark = pytest.mark.timeout(900)


def documented() -> dict[str, str]:
    """``{fact: reason}`` from docs/sim.md's table (first column the fact in backticks, last the reason)."""
    text = DOC.read_text(encoding="utf-8")
    assert TABLE_TITLE in text, f"docs/sim.md has no {TABLE_TITLE!r} section"
    section = text.split(TABLE_TITLE, 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\|\s*`([^`]+)`\s*\|.*\|\s*([^|]+?)\s*\|\s*$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def stop(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except Exception:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_the_simulator_answers_like_the_real_vllm_or_says_why_not(venv: Path, models: dict, tmp_path: Path) -> None:
    model = str(models["real-1"])
    real_port, sim_port = free_port(), free_port()
    real_env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
    }
    common = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--host", "127.0.0.1"]
    common += ["--kv-cache-memory-bytes", str(1 << 30)]
    real_argv = [str(venv / "bin" / "vllm"), "serve", model, *common, "--port", str(real_port)]
    # The simulator plays an 8-GPU NVFP4 box; it is told to start in 3 s so "while loading" is seen too.
    sim_argv = [sys.executable, "-m", "workers.sim.vllm", "serve", model, *common, "--port", str(sim_port)]
    sim_argv += ["--tensor-parallel-size", "8", "--quantization", "modelopt_fp4"]
    sim_env = {**os.environ, "BENCHBOT_SIM_STARTUP_S": "3", "BENCHBOT_SIM_STATE_DIR": str(tmp_path / "sim")}

    real_log, sim_log = tmp_path / "real.log", tmp_path / "sim.log"
    real, real_start = surface.spawn_and_wait(real_argv, real_env, real_log, real_port)
    try:
        sim, sim_start = surface.spawn_and_wait(sim_argv, sim_env, sim_log, sim_port)
        try:
            real_facts = real_start | surface.probe(
                f"http://127.0.0.1:{real_port}", model, real_log.read_text(errors="replace")
            )
            sim_facts = sim_start | surface.probe(
                f"http://127.0.0.1:{sim_port}", model, sim_log.read_text(errors="replace")
            )
        finally:
            stop(sim)
    finally:
        stop(real)
    diff = surface.differences(real_facts, sim_facts)
    out = Path(os.environ.get("BENCHBOT_REAL_REPORT", "real-report.json")).with_name("sim-vs-real.json")
    out.write_text(
        json.dumps({"real": real_facts, "sim": sim_facts, "differences": diff}, indent=1, default=str) + "\n"
    )

    rows = documented()
    unexplained = {k: v for k, v in diff.items() if k not in rows}
    assert not unexplained, (
        "the simulator differs from the real vLLM here and docs/sim.md does not say why "
        f"(fix the simulator or add a row): {json.dumps(unexplained, default=str, indent=1)}"
    )
    stale = sorted(set(rows) - set(diff))
    assert not stale, f"docs/sim.md lists differences that are gone (remove their rows): {stale}"
    # What benchbot itself depends on must never be among the differences.
    for fact in (
        "completion_stream_ends_with_done",
        "completion_stream_every_event_is_data",
        "completion_stream_usage_chunks",
        "route GET /health",
        "route GET /v1/models",
        "log_ready_line",
        "log_non_default_args",
    ):
        assert fact not in diff, fact
