"""``/tune`` end to end on the simulator with real workers: the issue's command, fairness, a worker crash.

The space is the issue's (``moe=cutlass,triton fp4=cudnn,cutlass nextn=on,off``: 8 configs, 6 trials)
with small requests so a trial takes seconds. ``seed=7`` makes the grid's order include the simulator's
fast-but-wrong config (flashinfer_cutlass MoE + cutlass FP4 GEMM, which misses 5 % of the questions)
early; the quick eval's n=40 is too few to flag it, the confirmation's full eval ([eval] n=60 here) is
not, so it must be confirmed and refused, never named the winner.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import BenchbotHost
from tests.util import wait_until
from workers.jobs import events, queue
from workers.results import store
from workers.tune import state

pytestmark = pytest.mark.slow

SMALL = "in=32 out=8 max=8"
DONE_WHEN = "/tune moe=cutlass,triton fp4=cudnn,cutlass nextn=on,off slo ttft=2s itl=60ms budget=6 eval n=40"
WRONG = "moe=cutlass fp4=fp4-cutlass nextn=off"


def _started_at(h: BenchbotHost, job_id: str) -> float:
    return next(e.ts for e in events.follow(h.r, job_id, timeout_s=1, block_ms=100) if e.type == events.STARTED)


@pytest.mark.timeout(480)  # the say's own wait is 400 s: on the loaded 2-core box it ran 192 s, past the 120 s default
def test_the_issue_command_names_a_confirmed_winner_that_is_not_the_wrong_config_and_teammates_go_first(
    redis_url: str, tmp_path: Path
) -> None:
    with BenchbotHost(redis_url, tmp_path, workers=1, extra_toml="[eval]\nn = 60\n") as h:
        say = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bot.cli",
                "say",
                "--as",
                "alice",
                DONE_WHEN.replace(" eval ", f" {SMALL} seed=7 eval "),
                "--wait",
                "--json",
                "--out",
                str(tmp_path / "plots"),
            ],
            env=h.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        # While trial 1 runs, a teammate queues a bench: it must run before the tune's trial 2.
        def first_trial_running() -> bool:
            if say.poll() is not None:
                raise AssertionError(f"say ended early: {say.communicate()}")
            record = state.load(h.r, "1")
            return record is not None and record.status == state.RUNNING

        wait_until(first_trial_running, timeout=60, what="the tune's first trial to start")
        bench = h.run("bob", "/bench 1 n=4 in=32 out=8 any")
        assert bench.ok and bench.job_id, bench.text
        out, err = say.communicate(timeout=400)
        assert say.returncode == 0, (out[-3000:], err[-3000:])
        result = json.loads(out)
        final = result["events"][-1]
        assert final["type"] == "succeeded", (final, h.worker_logs())
        data = final["data"]
        trials = data["trials"]
        assert len(trials) == 6 and all(t["status"] and "reason" in t for t in trials)
        assert len({t["config"] for t in trials}) == 6, "no config is tried twice"
        assert WRONG in {t["config"] for t in trials}, "seed=7's grid order includes the wrong config"
        winner = data["winner"]
        why = (
            [(t["config"], t["status"], t["reason"]) for t in trials],
            [(c["config"], c["problem"]) for c in data["confirmed"]],
        )
        assert winner is not None and winner["config"] != WRONG, why
        assert winner["launch"].startswith("/launch ") and "fp4-cutlass" not in winner["launch"]
        assert winner["running_config"], "the winner's config as the server reported it"
        confirmed = {c["config"]: c for c in data["confirmed"]}
        assert all(len(c["tok_s"]) == 3 for c in confirmed.values() if c["run_id"]), "repeat=3"
        if WRONG in confirmed:  # it was fast enough to be a finalist: the full eval refused it
            assert "ACCURACY DROP" in confirmed[WRONG]["problem"], confirmed[WRONG]
        # every measured trial has its J/token: the knee search samples the GPUs as a plain bench does
        measured = [t for t in trials if t["status"] == "done"]
        assert measured and all((t["tokens_per_joule"] or 0) > 0 for t in measured), measured
        # every trial is a stored run, /compare works on two of them
        run_ids = [t["run_id"] for t in trials]
        assert all(store.get_run(h.r, rid) for rid in run_ids)
        compared = h.run("alice", f"/compare {run_ids[0]} {run_ids[1]}")
        assert compared.ok, compared.text
        # the teammate's bench ran between trial 1 and trial 2
        step_jobs = [e["job"] for e in result["events"] if e["type"] == events.STARTED]
        assert len(step_jobs) == 6
        assert _started_at(h, step_jobs[0]) < _started_at(h, bench.job_id) < _started_at(h, step_jobs[1])
        assert state.load(h.r, "1").status == state.FINISHED  # type: ignore[union-attr]
        assert any(p.endswith("tune-1-goodput.png") for p in result["plots"]), result["plots"]
        from bot.render import succeeded_text

        assert f"reproduce it: {winner['launch']}" in succeeded_text(data)


def test_a_worker_killed_mid_trial_is_resumed_by_another_with_no_trial_lost_or_repeated(
    redis_url: str, tmp_path: Path
) -> None:
    with BenchbotHost(redis_url, tmp_path, workers=1, lease_ttl_s=6) as h:
        reply = h.run("alice", f"/tune moe=cutlass,triton nextn=on,off slo ttft=2s itl=60ms budget=3 {SMALL}")
        assert reply.ok and reply.job_id, reply.text
        # Kill the worker while the second trial's first measured level runs.
        record = wait_until(
            lambda: (
                (rec := state.load(h.r, reply.job_id)) is not None
                and len(rec.trials) == 1
                and rec.status == state.RUNNING
                and rec.current_job != reply.job_id
                and rec
            ),
            timeout=240,
            what="the tune's second trial to start",
        )
        dead_step = str(record.current_job)
        wait_until(
            lambda: any(
                e.type == "progress" and e.data.get("phase") in ("bench", "slo")
                for e in events.follow(h.r, dead_step, timeout_s=0.2, block_ms=50)
            ),
            timeout=120,
            what="the second trial's first measured level (the early-stop probe or the knee search)",
        )
        h.kill_worker(h.workers[0])
        h.start_worker()
        terminal, _ = h.wait(dead_step, timeout=60)  # the reaper reports the dead step
        assert terminal.type == "failed"
        resumed = h.run("alice", f"/tune resume {reply.job_id}")
        assert resumed.ok and resumed.job_id, resumed.text
        job: str | None = resumed.job_id
        while job:
            end, _ = h.wait(job, timeout=200)
            assert end.type == "succeeded", (end.data, h.worker_logs())
            job = end.data.get("next_job")
        final = state.load(h.r, reply.job_id)
        assert final is not None and final.status == state.FINISHED
        assert [t.number for t in final.trials] == [1, 2, 3], "no trial lost"
        assert len({t.config for t in final.trials}) == 3, "none repeated"
        # The study failed the dead step's trial and asked its config again: trial 2 is that config.
        import optuna

        from workers import keys
        from workers.tune.journal import RedisListJournal

        study = optuna.load_study(
            study_name=f"benchbot-tune-{reply.job_id}",
            storage=optuna.storages.JournalStorage(RedisListJournal(h.r, keys.tune_journal(reply.job_id))),
        )
        failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
        assert len(failed) == 1 and "worker died" in failed[0].user_attrs["benchbot_reason"]
        dead_config = " ".join(f"{k}={v}" for k, v in failed[0].params.items())
        assert final.trials[1].config == dead_config
        assert not queue.list_jobs(h.r, "gpu-1") or all(
            j.state in events.TERMINAL for j in queue.list_jobs(h.r, "gpu-1")
        )
