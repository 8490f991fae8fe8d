"""Fast and right, end to end (issue 17): ``/eval``, ``then eval`` and a sweep's ``eval`` through real workers.

The simulated engine answers the built-in questions right on good backends and gets a fixed ~5 % wrong on
the degraded FP4 path (``cutlass fp4-cutlass``; workers/sim/answers.py). With seed 0 the degraded path
misses 7 of the first 60 questions: exactly enough for McNemar's exact test to flag at alpha 0.01
(0.5^7 = 0.0078), so n=60 keeps these tests cheap and still proves the gate. One host for the file; fixed
sim timing keeps every eval under a second.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot import render
from tests.integration.harness import BenchbotHost
from workers.jobs.outcomes import EvalOutcome, LaunchOutcome, SweepOutcome, parse_outcome
from workers.results import export, store, tables

pytestmark = pytest.mark.slow

N = 60
FAST_SIM = {"BENCHBOT_SIM_TIMING": "fixed", "BENCHBOT_SIM_TTFT_MS": "2", "BENCHBOT_SIM_ITL_MS": "0.5"}
BENCH = "1 in=64 out=16 n=4"


@pytest.fixture(scope="module")
def host(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BenchbotHost]:
    with BenchbotHost(redis_url, tmp_path_factory.mktemp("eval-host"), workers=1, sim_env=FAST_SIM) as h:
        yield h


def _succeeded(h: BenchbotHost, line: str) -> tuple[object, dict]:
    terminal, _ = h.launch_ok("alice", line)
    return parse_outcome(terminal.data), terminal.data


def test_the_degraded_config_is_flagged_and_the_good_ones_are_not(host: BenchbotHost) -> None:
    # Nothing runs yet: the eval refuses (a job that fails with the reason), and stores nothing.
    reply = host.run("alice", f"/eval n={N} any")
    assert reply.ok and reply.job_id, reply.text
    terminal, _ = host.wait(reply.job_id)
    assert terminal.type == "failed" and "nothing is serving" in terminal.data["message"]
    assert store.list_runs(host.r) == []

    # The good config first: 100 %, no baseline yet, so it becomes the host's first known-good eval.
    good, _ = _succeeded(host, f"/launch cutlass cudnn then eval n={N}")
    assert isinstance(good, LaunchOutcome) and good.eval is not None
    assert not good.eval.flagged and good.eval.baseline_run is None and "no baseline" in good.eval.summary
    first = store.get_run(host.r, good.eval.run_id)
    assert first.kind == "eval" and first.eval is not None and first.eval["correct"] == N
    assert first.config["fingerprint"] and first.config["instance_id"]  # stored with what was observed
    assert store.get_eval_run(host.r, first.id) is not None  # the items, beside the record

    # The degraded FP4 path: faster or not, it answers 7 of 60 wrong and is flagged against the first eval.
    bad, bad_data = _succeeded(host, f"/launch cutlass fp4-cutlass then bench {BENCH} then eval n={N}")
    assert isinstance(bad, LaunchOutcome) and bad.eval is not None and bad.bench is not None
    assert bad.eval.flagged and bad.eval.summary.startswith("ACCURACY DROP: 88.3 % (baseline 100.0 %")
    assert bad.eval.baseline_run == first.id and len(bad.eval.wrong) == 3
    assert bad.eval.run_id == bad.bench.run_id  # one run: tok/s and accuracy side by side
    degraded = store.get_run(host.r, bad.bench.run_id)
    assert degraded.levels and degraded.accuracy is not None and degraded.accuracy.verdict == "drop"
    assert "! ACCURACY DROP" in render.succeeded_text(bad_data)

    # A bare /eval of a second good config (the server that runs now): within noise, not flagged.
    host.launch_ok("alice", "/launch cutlass cudnn customar")
    terminal, _ = host.launch_ok("alice", f"/eval n={N}")
    again = parse_outcome(terminal.data)
    assert isinstance(again, EvalOutcome) and not again.flagged and again.baseline_run == first.id
    assert again.summary.startswith("accuracy 100.0 % (baseline 100.0 %, difference within noise)")

    # Export and /compare carry the accuracy next to the throughput.
    table = tables.compare_table([first, degraded])
    assert "acc 100.0 %" in table and "acc 88.3 % DROP" in table
    out = io.StringIO()
    export.export_runs(host.r, "csv", out)
    rows = {row["run_id"]: row for row in csv.DictReader(io.StringIO(out.getvalue()))}
    assert rows[degraded.id]["eval_verdict"] == "drop" and rows[degraded.id]["eval_accuracy"] == "0.883333"
    assert rows[degraded.id]["output_tok_s"] and rows[degraded.id]["eval_baseline_run"] == first.id
    assert rows[again.run_id]["eval_verdict"] == "within_noise"


def test_a_sweep_with_eval_flags_only_the_degraded_cell(host: BenchbotHost, tmp_path: Path) -> None:
    terminal, _ = host.launch_ok(
        "bob", f"/sweep cutlass cudnn, cutlass fp4-cutlass bench {BENCH} eval n={N}", timeout=120
    )
    outcome = parse_outcome(terminal.data)
    assert isinstance(outcome, SweepOutcome) and [c.ok for c in outcome.cells] == [True, True]
    good, bad = outcome.cells
    assert good.eval is not None and not good.eval.flagged
    assert bad.eval is not None and bad.eval.flagged and bad.eval.run_id == bad.run_id
    assert "DROP" in outcome.table and "acc 100.0 %" in outcome.table
    from bot.plots import draw_sweep

    peak = next(i for i in draw_sweep(store.get_runs(host.r, list(outcome.run_ids)), tmp_path) if i.kind == "peak")
    assert "acc 88.3 % DROP" in peak.alt_text  # the plot carries the accuracy beside the peak tok/s
