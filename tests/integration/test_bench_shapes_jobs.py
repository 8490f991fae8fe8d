"""The new load shapes through the real path: /bench rate=..., api=chat, length ranges, data=NAME.

Enqueue -> RQ worker -> lease -> observe -> bench -> store -> the text table, against a simulated host.
What each test checks is what a person reading the result needs: an open-loop run says it was one
(rate, schedule, lag) and its table is keyed by rate; a dataset named in the config is what was sent;
a dataset the worker cannot read fails the job with a clear message and stores no run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import BenchbotHost
from workers.results import store

pytestmark = pytest.mark.slow


@pytest.fixture
def host(redis_url: str, tmp_path: Path) -> Iterator[BenchbotHost]:
    data = tmp_path / "chats.jsonl"
    rows = [
        {
            "conversations": [
                {"from": "human", "value": f"q{i} " + "word " * (20 + i)},
                {"from": "gpt", "value": "ok " * 8},
            ]
        }
        for i in range(10)
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    extra = f'[datasets]\nchats = "{data}"\nmissing = "{tmp_path / "gone.jsonl"}"\n'
    with BenchbotHost(redis_url, tmp_path, extra_toml=extra) as h:
        ok, _ = h.launch_ok("alice", "/launch cutlass cudnn")
        assert ok.type == "succeeded", ok.data
        yield h


def _run(h: BenchbotHost, line: str):
    reply = h.run("alice", line)
    assert reply.ok and reply.job_id, reply.text
    terminal, seen = h.wait(reply.job_id, timeout=90)
    return terminal, seen


def test_open_loop_bench_stores_rates_schedule_and_a_rate_keyed_table(host: BenchbotHost) -> None:
    terminal, seen = _run(host, "/bench rate=5,10 arrivals=constant in=32-64 out=8 n=10 warmup=0")
    assert terminal.type == "succeeded", (terminal.data, host.worker_logs())
    progress = [e.data.get("message", "") for e in seen if e.type == "progress" and e.data.get("phase") == "bench"]
    assert any(m.startswith("rate=5/s: running 10 requests") and "32-64 in" in m for m in progress), progress
    run = store.get_run(host.r, terminal.data["run_id"])
    assert run.open_loop and run.loads == [5.0, 10.0]
    for level in run.levels:
        assert level["completed"] == 10 and level["errors"] == 0
        assert level["arrivals"]["pattern"] == "constant" and level["arrivals"]["lag"]["requests"] == 10
        assert level["arrivals"]["span_s"] == pytest.approx(9 / level["rate"])
    assert run.params["rates"] == [5.0, 10.0] and run.params["input"] == "32-64"
    table = terminal.data["table"]
    assert table.splitlines()[1].split()[0] == "rate" and "lag p99" in table
    assert "5/s" in table and "10/s" in table


def test_chat_bench_on_a_configured_dataset(host: BenchbotHost) -> None:
    terminal, _ = _run(host, "/bench 2 api=chat data=chats out=dataset n=6 warmup=0")
    assert terminal.type == "succeeded", (terminal.data, host.worker_logs())
    run = store.get_run(host.r, terminal.data["run_id"])
    level = run.levels[0]
    assert level["completed"] == 6 and level["errors"] == 0
    # out=dataset: each reply's reference length ("ok " x 8 = 24 bytes = 6 tokens by the approximation)
    assert level["output_tokens"] == 6 * 6
    assert run.params["dataset"] == "chats" and run.params["api"] == "chat"


def test_a_dataset_the_worker_cannot_read_fails_clearly_and_stores_nothing(host: BenchbotHost) -> None:
    before = len(store.list_runs(host.r, 100))
    terminal, _ = _run(host, "/bench 2 data=missing n=4")
    assert terminal.type == "failed"
    assert "gone.jsonl does not exist" in terminal.data["message"]
    assert len(store.list_runs(host.r, 100)) == before


def test_repeat_runs_each_level_n_times_and_compare_gives_a_verdict(host: BenchbotHost) -> None:
    terminal, seen = _run(host, "/bench 1,2 in=32 out=8 n=4 warmup=0 repeat=3")
    assert terminal.type == "succeeded", (terminal.data, host.worker_logs())
    progress = [e.data.get("message", "") for e in seen if e.type == "progress"]
    assert [m for m in progress if m.startswith("repeat ")] == ["repeat 1 of 3", "repeat 2 of 3", "repeat 3 of 3"]
    first = store.get_run(host.r, terminal.data["run_id"])
    for level in first.levels:
        assert len(level["repeats"]) == 3 and all(r["completed"] == 4 for r in level["repeats"])
        assert level["estimates"]["output_tok_s"]["n"] == 3
    assert "tok/s mean ± 95%" in terminal.data["table"]
    second, _ = _run(host, "/bench 1,2 in=32 out=8 n=4 warmup=0 repeat=3")
    reply = host.run("alice", f"/compare {first.id} {second.data['run_id']}")
    assert reply.ok, reply.text
    assert f"verdict (output tok/s vs {first.id}" in reply.text
    # the same server measured twice: any verdict is a verdict over 3 runs a side, never a single-run one
    assert "1 run each" not in reply.text and "c=1 " in reply.text and "c=2 " in reply.text
