"""``benchbot demo --real`` plays its story to the end on the real vLLM CPU build and leaves nothing running."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bot.demo_real import run_real_demo

pytestmark = pytest.mark.timeout(900)


def test_the_real_demo_runs_its_story_and_cleans_up(venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("BENCHBOT_REAL_VENV", str(venv))
    for name in ("REDIS_URL", "BENCHBOT_CONFIG"):  # the demo sets them in os.environ: undone after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("BENCHBOT_STATE_DIR", str(tmp_path / "state"))
    out = tmp_path / "out"
    lines: list[str] = []
    code = run_real_demo(out, emit=lines.append)
    text = "\n".join(lines)
    assert code == 0, text[-4000:]
    transcript = (out / "transcript.txt").read_text()
    assert "LOADING" in transcript  # /status while the real engine loads
    assert "queued #2" in transcript  # bob's launch waited in line
    assert "accuracy" in transcript.lower()
    assert "/compare" in transcript
    assert list((out / "plots").glob("*.png")), "the demo's plots"
    assert (out / "results.csv").read_text().count("\n") >= 3  # header + two bench runs
    assert "no process left running" in text
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _is_demo_vllm(int(p))]


def _is_demo_vllm(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(b"benchbot-demo-" in a for a in argv) and b"serve" in argv  # its model lies in the demo's folder
