"""``benchbot bench URL ...`` against the real simulator, as a subprocess: no Redis, no worker.

It must print the same per-level table /bench posts, write JSON/CSV/PNG that read like a stored run,
say it did not observe the server, refuse bad input with /bench's own words (exit 2, nothing written),
and never need Redis (REDIS_URL points nowhere).
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
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


def _endless_server() -> tuple[str, Callable[[], None]]:
    """A server on 127.0.0.1 (in a thread) that answers every request with an SSE stream without end."""
    loop = asyncio.new_event_loop()
    port = free_port()
    event = b'data: {"text":"x","meta_info":{"completion_tokens":1}}\n\n' * 800
    block = b"%x\r\n%s\r\n" % (len(event), event)

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")), 0
            )
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            while True:
                writer.write(block)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            writer.close()

    server = loop.run_until_complete(asyncio.start_server(on_connect, "127.0.0.1", port))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def stop() -> None:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)

    return f"http://127.0.0.1:{port}", stop


def test_standalone_bench_against_an_endless_stream_ends_with_bounded_memory(tmp_path: Path) -> None:
    """Issue 25, item 3: this grew ~600 MB/s until killed. Now each response stops at its byte budget
    (the default for out=16: 64 MiB), the requests are errors that name max-bytes=, the level says so."""
    url, stop = _endless_server()
    env = {**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0", "BENCHBOT_STATE_DIR": str(tmp_path / "state")}
    env.pop("BENCHBOT_CONFIG", None)
    script = (
        "import resource, runpy, sys\n"
        f"sys.argv = ['benchbot', 'bench', {url!r}, '1', 'out=16', 'n=2', 'warmup=0', '--out', 'out']\n"
        "try:\n    runpy.run_module('bot.cli', run_name='__main__')\n"
        "finally:\n    print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
    finally:
        stop()
    assert done.returncode == 0, done.stderr
    assert "c=1: 2 request(s) CUT OFF by response limits (2 by max-bytes)" in done.stdout, done.stdout
    record = json.loads((tmp_path / "out" / "bench.json").read_text())
    [level] = record["levels"]
    assert (level["num_requests"], level["errors"], level["cut"]) == (2, 2, {"max-bytes": 2}), level
    assert "max-bytes=" in level["error_samples"][0]
    maxrss_mb = int(done.stderr.rsplit("MAXRSS_KB", 1)[1].split()[0]) / 1024
    assert maxrss_mb < 800, maxrss_mb  # two 64 MiB responses kept until the level ends, and the interpreter
