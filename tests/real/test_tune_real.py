"""Issue 37 item 7: a two-trial ``/tune`` of vLLM's ``--max-num-seqs`` on the CPU build, each trial's stored
runs checked against the server's own ``/metrics``.

Every trial launches its own server, so a server's counters are one trial's while that server still runs.
The test pauses the tune after trial 1 (``/tune pause``, read between trials), reads the server, resumes
the tune and cancels it during trial 2 (``/cancel``: after the current trial, every result kept), then reads
trial 2's server. Cancelling skips the confirmation's two more vLLM starts (minutes on this box); the
confirmation is tested on the simulator (tests/integration/test_tune.py).

What a trial's server counted is exactly what benchbot sent it: the launch's smoke generation (its usage
is in the ready event) and every request of the trial's stored runs, i.e. each point of the knee search (a
knee is measured twice, and both count) and, for trial 2, the early-stop probe at the incumbent's knee.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.integration.harness import first
from tests.real.realhost import MAIN, RealHost
from tests.real.test_vllm_real import metric, report, status_of
from tests.util import wait_until
from workers.benchmark import stats
from workers.jobs import events
from workers.results import store
from workers.tune import state

pytestmark = pytest.mark.timeout(900)

OUT = 8
#: Two values, two trials; tiny levels (4 requests of 16 in / 8 out, no warmup) up to concurrency 2; limits
#: no CPU box misses (the test checks counting, not speed).
TUNE = f"/tune max-num-seqs=2,4 slo ttft=60s itl=10s budget=2 in=16 out={OUT} n=4 warmup=0 max=2 on {MAIN}"
COUNTERS = ("vllm:request_success_total", "vllm:generation_tokens_total")


def sent_by(h: RealHost, step_job: str) -> tuple[int, int, list[str]]:
    """``(requests, output tokens, run ids)`` that one step job's stored runs say were sent to the server."""
    requests = tokens = 0
    run_ids = []
    for run in store.list_runs(h.r, 100):
        if run.job_id != step_job or run.kind == "eval":
            continue
        run_ids.append(run.id)
        search = run.extra.get("slo")
        if isinstance(search, dict):  # the knee search: every point it measured (the stored levels keep the last)
            for point in search["points"]:
                requests += point["num_requests"]
                tokens += (point["num_requests"] - point["errors"]) * OUT
            for level in run.levels:  # each completed request generated exactly out= tokens (ignore_eos)
                assert level["output_tokens"] == level["completed"] * OUT, level
        else:  # the early-stop probe: its repeats
            for level in run.levels:
                for one in stats.runs_of(level):
                    requests += one["completed"] + one["errors"]
                    tokens += one["output_tokens"]
    return requests, tokens, run_ids


def check_against_metrics(h: RealHost, step_job: str, trial: state.TrialRecord) -> dict[str, Any]:
    """The running server (this trial's) counted the smoke plus every request of the trial's stored runs."""
    _, seen = h.wait(step_job, timeout=10)
    ready = first(seen, "ready").data
    smoke_tokens = ready["smoke"]["completion_tokens"]
    assert isinstance(smoke_tokens, int) and smoke_tokens > 0, ready["smoke"]
    seqs = trial.params["max-num-seqs"]
    view = status_of(h)  # the server that runs is this trial's, as the process and the server say
    assert view["server"]["args"]["max_num_seqs"] == seqs and ready["config"]["fingerprint"] == view["fingerprint"]
    argv = view["process"]["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == str(seqs), argv
    base = h.config.hosts[MAIN].base_url
    served = {name: metric(base, name) for name in COUNTERS}
    requests, tokens, run_ids = sent_by(h, step_job)
    assert trial.run_id in run_ids, (trial, run_ids)
    assert requests > 0 and served["vllm:request_success_total"] == 1 + requests, (served, requests, run_ids)
    assert served["vllm:generation_tokens_total"] == smoke_tokens + tokens, (served, smoke_tokens, tokens)
    return {"requests": requests, "tokens": tokens, "runs": run_ids, "knee": trial.knee}


def test_a_two_trial_tune_of_max_num_seqs_stores_what_the_server_counted(real_host: RealHost) -> None:
    h = real_host
    started = time.monotonic()
    reply = h.run("alice", TUNE)
    assert reply.ok and reply.job_id, reply.text
    tune_id = reply.job_id

    def trial_started(job: str, k: int) -> bool:
        """The step's trial k is under way (the step reads pause and cancel before a trial, and after it)."""
        said = (str(e.data.get("message")) for e in events.job_events(h.r, job) if e.type == "progress")
        return any(m.startswith(f"trial {k} of 2: ") for m in said)

    wait_until(lambda: trial_started(tune_id, 1), timeout=180, what="the tune's first trial to start")
    paused = h.run("alice", f"/tune pause {tune_id}")
    assert paused.ok, paused.text
    end, _ = h.wait(tune_id, timeout=600)
    assert end.type == "succeeded" and end.data["status"] == state.PAUSED, (end.data, h.worker_logs())
    (one,) = state.load(h.r, tune_id).trials  # type: ignore[union-attr]
    assert one.status == state.DONE and one.knee is not None, one
    first_trial = check_against_metrics(h, tune_id, one)

    resumed = h.run("alice", f"/tune resume {tune_id}")
    assert resumed.ok and resumed.job_id, resumed.text
    step = resumed.job_id
    wait_until(lambda: trial_started(step, 2), timeout=180, what="the tune's second trial to start")
    cancelled = h.run("alice", f"/cancel {tune_id}")
    assert cancelled.ok and "after its current trial" in cancelled.text, cancelled.text
    end, _ = h.wait(step, timeout=600)
    assert end.type == "succeeded" and end.data["status"] == state.CANCELLED, (end.data, h.worker_logs())
    record = state.load(h.r, tune_id)
    assert record is not None and [t.number for t in record.trials] == [1, 2]
    two = record.trials[1]
    assert {one.params["max-num-seqs"], two.params["max-num-seqs"]} == {2, 4}, record.trials
    assert two.status in (state.DONE, state.PRUNED), two
    second_trial = check_against_metrics(h, step, two)
    assert [t["run_id"] for t in end.data["trials"]] == [one.run_id, two.run_id], "every result kept"
    report("tune", {"trial_1": first_trial, "trial_2": second_trial, "wall_s": round(time.monotonic() - started, 1)})
