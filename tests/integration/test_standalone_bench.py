"""``benchbot bench URL ...`` against the real simulator, as a subprocess: no Redis, no worker.

It must print the same per-level table /bench posts, write JSON/CSV/PNG that read like a stored run,
say it did not observe the server, refuse bad input with /bench's own words (exit 2, nothing written),
and never need Redis (REDIS_URL points nowhere).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.util import free_port
from workers.sim.launcher import start_sim

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.slow


def _benchbot(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0", "BENCHBOT_STATE_DIR": str(tmp / "state")}
    env.pop("BENCHBOT_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", "bench", *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_standalone_bench_prints_the_table_and_writes_json_csv_png(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with start_sim(free_port(), "--sim-timing", "fixed", "--sim-ttft-ms", "40", "--sim-itl-ms", "8") as sim:
        done = _benchbot(sim.base_url, "1,4", "in=32", "out=8", "n=8", "--out", str(out), tmp=tmp_path)
        chat = _benchbot(sim.base_url, "rate=20", "n=10", "out=4", "api=chat", "--json", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].split()[:3] == ["conc", "ok/err", "out"]
    assert lines[2].split()[:2] == ["1", "8/0"] and lines[3].split()[:2] == ["4", "8/0"]
    assert "c=4: 8/8 ok" in done.stderr  # progress goes to stderr, the table to stdout
    record = json.loads((out / "bench.json").read_text())
    assert record["config"]["observed"] is False and record["kind"] == "standalone"
    assert [lv["concurrency"] for lv in record["levels"]] == [1, 4]
    assert all(lv["output_tokens"] == 8 * 8 for lv in record["levels"])
    rows = list(csv.DictReader((out / "bench.csv").open()))
    assert [row["concurrency"] for row in rows] == ["1", "4"]
    pngs = sorted(out.glob("*.png"))
    assert pngs and all(p.read_bytes()[:8] == PNG_MAGIC for p in pngs)

    assert chat.returncode == 0, chat.stderr
    result = json.loads(chat.stdout)
    level = result["levels"][0]
    assert level["rate"] == 20 and level["completed"] == 10 and level["arrivals"]["lag"]["requests"] == 10
    assert result["params"]["api"] == "chat" and result["files"] == []


def test_standalone_bench_refuses_bad_input_with_the_bench_grammar(tmp_path: Path) -> None:
    bad = _benchbot("http://127.0.0.1:9", "1,8", "rate=2", "--out", str(tmp_path / "out"), tmp=tmp_path)
    assert bad.returncode == 2
    assert "not both" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "out").exists()
