"""The soak's history checker can fail: each planted violation is reported, naming the job, the host and the fence.

A clean history (two jobs one after the other on one host: a launch that spawns and makes its engine ready,
then a stop that signals it) passes every property; each test plants one violation in a copy of it.
"""

from __future__ import annotations

import copy

import pytest

from bench import history_check

HOST = "gpu-1"


def _event(job: str, type_: str, ts: float, **data: object) -> dict[str, object]:
    return {"src": "event", "job": job, "type": type_, "ts": ts, "data": data}


def _effect(job: str, op: str, fence: int | None, t: float, **more: object) -> dict[str, object]:
    outcome = "ok" if op in ("spawn", "claim") else "sent"
    return {"src": "effect", "job": job, "host": HOST, "op": op, "fence": fence, "outcome": outcome,
            "began": t, "ended": t + 0.05, "window": [t + 0.01, t + 0.04], **more}  # fmt: skip


def clean_history() -> list[dict[str, object]]:
    ready_config = {"process": {"pid": 500}, "instance_id": f"{HOST}:500:7"}
    return [
        {"src": "reply", "ts": 0.5, "user": "alice", "line": "/launch", "ok": True, "job": "1"},
        _event("1", "queued", 1.0, host=HOST, kind="launch"),
        {"src": "reply", "ts": 1.5, "user": "bob", "line": "/stop", "ok": True, "job": "2"},
        _event("2", "queued", 1.5, host=HOST, kind="stop"),
        _event("1", "started", 2.0, host=HOST, fence=1, worker="w1"),
        _effect("1", "claim", 1, 2.1),
        _effect("1", "spawn", 1, 2.2, pid=500),
        {"src": "sim", "host": HOST, "ev": "engine_start", "pid": 500, "ts": 2.3, "fence": 1},
        {"src": "sim", "host": HOST, "ev": "request", "pid": 500, "ts": 2.6, "method": "POST", "path": "/generate"},
        _event("1", "ready", 2.7, config=ready_config),
        _event("1", "succeeded", 2.8, message="ready"),
        _event("2", "started", 3.0, host=HOST, fence=2, worker="w2"),
        _effect("2", "claim", 2, 3.1),
        _effect("2", "signal", 2, 3.2, pid=500, signal="TERM"),
        {"src": "sim", "host": HOST, "ev": "engine_exit", "pid": 500, "ts": 3.3},
        _event("2", "succeeded", 3.5, message="stopped"),
        {"src": "final", "host": HOST, "engines": [], "launched": None},
    ]


def _results(history: list[dict[str, object]]) -> dict[str, history_check.Property]:
    return {p.name: p for p in history_check.check(history)}


def test_a_clean_history_passes_every_property() -> None:
    results = _results(clean_history())
    assert set(results) == {prop.__name__ for prop in history_check.PROPERTIES}
    assert {name: p.counter_examples for name, p in results.items() if not p.ok} == {}
    assert results["effects_fenced"].checked >= 4  # two actions, one engine start, one request


def _only(history: list[dict[str, object]], name: str) -> dict[str, object]:
    results = _results(history)
    assert not results[name].ok, f"{name} did not notice"
    return results[name].counter_examples[0]


def test_an_unfenced_spawn_is_named_with_its_job_host_and_fence() -> None:
    # An engine the host saw start that no fenced spawn started (job 2's lease, its fence 2, was held then)
    history = clean_history()
    history.append({"src": "sim", "host": HOST, "ev": "engine_start", "pid": 777, "ts": 3.25, "fence": 2})
    example = _only(history, "effects_fenced")
    assert (example["job"], example["host"], example["fence"]) == ("2", HOST, 2)
    assert "777" in str(example["why"]) and "no fenced spawn" in str(example["why"])
    # and a spawn the journal shows without a fence
    history = clean_history()
    history[6] = _effect("1", "spawn", None, 2.2, pid=500)
    example = _only(history, "effects_fenced")
    assert (example["job"], example["host"], example["fence"]) == ("1", HOST, None)
    assert "unfenced spawn" in str(example["why"])


def test_a_spawn_whose_job_died_before_the_answer_is_accounted_by_its_ask_and_only_for_its_own_fence() -> None:
    # Job 1's horse was killed while the actuator ran: the journal holds the ask, never the answer.
    history = clean_history()
    history[6] = _effect("1", "spawn", 1, 2.2, outcome="asked")
    results = _results(history)
    assert results["effects_fenced"].ok, results["effects_fenced"].counter_examples
    # An engine under another fence, or one that started before the ask, is still nobody's spawn.
    for fence, ts in ((2, 2.3), (1, 2.1)):
        history = clean_history()
        history[6] = _effect("1", "spawn", 1, 2.2, outcome="asked")
        history[7] = {"src": "sim", "host": HOST, "ev": "engine_start", "pid": 500, "ts": ts, "fence": fence}
        assert "no fenced spawn" in str(_only(history, "effects_fenced")["why"])
    # An ask that was answered covers its own engine, not a second one under the same fence.
    history = clean_history()
    history.insert(6, _effect("1", "spawn", 1, 2.2, outcome="asked"))
    history.append({"src": "sim", "host": HOST, "ev": "engine_start", "pid": 778, "ts": 2.4, "fence": 1})
    assert "778" in str(_only(history, "effects_fenced")["why"])


def test_a_stale_fenced_signal_is_named() -> None:
    history = clean_history()
    history.insert(-2, _effect("1", "signal", 1, 3.4, pid=500, signal="KILL"))  # job 1's, after job 2 claimed
    example = _only(history, "effects_fenced")
    assert (example["job"], example["host"], example["fence"]) == ("1", HOST, 1)
    assert "stale" in str(example["why"]) and "fence 2" in str(example["why"])


def test_a_job_run_twice_is_named() -> None:
    history = clean_history()
    history.append(_event("1", "started", 4.0, host=HOST, fence=3, worker="w3"))
    example = _only(history, "none_ran_twice")
    assert (example["job"], example["host"], example["fence"]) == ("1", HOST, 1)
    assert "started 2 times" in str(example["why"])


def test_two_overlapping_side_effects_are_named() -> None:
    history = clean_history()
    overlapping = _effect("2", "signal", 2, 2.2, pid=500, signal="TERM")  # inside job 1's spawn window
    history.insert(7, overlapping)
    example = _only(history, "effects_never_overlap")
    assert (example["job"], example["host"], example["fence"]) == ("2", HOST, 2)
    assert example["other_job"] == "1" and "overlaps" in str(example["why"])


def test_a_lost_job_is_named() -> None:
    history = [r for r in clean_history() if not (r.get("job") == "2" and r.get("type") == "succeeded")]
    example = _only(history, "no_job_lost")
    assert (example["job"], example["host"], example["fence"]) == ("2", HOST, 2)
    assert example["why"] == "never ended"
    accepted_only = [r for r in clean_history() if not (r.get("job") == "2" and r.get("src") == "event")]
    assert _only(accepted_only, "no_job_lost")["why"] == "accepted (the reply named it) but never queued"


@pytest.mark.parametrize(
    ("name", "plant"),
    [
        ("fences_increase", lambda h: h.append(_event("3", "started", 5.0, host=HOST, fence=2))),
        ("no_unowned_engine", lambda h: h.__setitem__(-1, {"src": "final", "host": HOST, "engines": [900]})),
        (
            "status_told_the_truth",
            lambda h: h.append(
                {
                    "src": "status",
                    "host": HOST,
                    "view": {"fresh": {"process": {"pid": 500}}},
                    "truth_before": [],
                    "truth_after": [],
                }
            ),
        ),
        (
            "runs_measured_what_they_said",
            lambda h: h.append(
                {"src": "run", "id": "r1", "job_id": "9", "host": HOST, "config": {"process": {"pid": 500}}}
            ),
        ),
    ],
)
def test_the_other_properties_fail_on_their_planted_violation(name: str, plant: object) -> None:
    history = copy.deepcopy(clean_history())
    plant(history)  # type: ignore[operator]
    example = _only(history, name)
    assert example["host"] == HOST


def _none_answer(before: list[int], after: list[int]) -> dict[str, object]:
    """A fresh ``/status`` answer that said nothing runs, with the engines the host ran before and after it."""
    fresh = {"state": "none", "process": None}
    return {"src": "status", "host": HOST, "view": {"fresh": fresh}, "truth_before": before, "truth_after": after}


def test_nothing_running_is_a_lie_only_while_one_engine_lived_throughout() -> None:
    """The long soak's two answers: a job stopped engine 500 and spawned 501 during the call, so a moment with
    no engine lay between the two reads, and "nothing on port" may have been seen then; the same engine alive
    before and after the call is one that ran throughout it."""
    assert _only([*clean_history(), _none_answer([500], [500])], "status_told_the_truth")["host"] == HOST
    told = _results([*clean_history(), _none_answer([500], [501])])["status_told_the_truth"]
    assert told.checked == 1 and told.ok


def test_a_run_stamped_outside_its_jobs_life_and_an_impossible_mean_hold_are_named() -> None:
    run = {"src": "run", "id": "r1", "job_id": "1", "host": HOST, "config": {"process": {"pid": 500}}}
    kept = [*clean_history(), {**run, "created_at": 2.75}, {"src": "durations", "mean_held_s": {"launch": 0.8}}]
    assert _results(kept)["times_are_true"].ok and _results(kept)["times_are_true"].checked == 2
    stepped = [*clean_history(), {**run, "created_at": 2.75 + 3600}]  # a stamp taken on a stepped clock
    example = _only(stepped, "times_are_true")
    assert (example["job"], example["host"], example["fence"]) == ("1", HOST, 1)
    assert "outside its job's life" in str(example["why"])
    mean = [*clean_history(), {"src": "durations", "mean_held_s": {"launch": -3599.2}}]
    assert "held their host -3599.2 s on average" in str(_only(mean, "times_are_true")["why"])


def test_lock_windows_are_mapped_with_the_box_clock_offset_of_their_time() -> None:
    # The box's VM paused and resumed between the two jobs: its wall clock stood 23.6 s further from its boot
    # clock after (what the long soak of 2026-12-07 met). Each window reported on the boot clock only.
    before, after, step_at = 1000.0, 1023.6, 2.9

    def offset(t: float) -> float:
        return before if t < step_at else after

    def on_boot_clock(history: list[dict[str, object]]) -> list[dict[str, object]]:
        out = []
        for r in copy.deepcopy(history):
            if r["src"] == "effect":
                t0, t1 = r.pop("window")  # type: ignore[misc]
                r["window_boot"] = [t0 - offset(t0), t1 - offset(t1)]
            out.append(r)
        return out

    history = on_boot_clock(clean_history())
    clock = [
        {"src": "clock", "boot": 0.0, "boot_to_wall": before},
        {"src": "clock", "boot": step_at - after, "boot_to_wall": after},
    ]
    results = _results([*clock, *history])
    assert {name: p.counter_examples for name, p in results.items() if not p.ok} == {}
    # One offset for the whole history (the header's, read at the end) puts job 1's windows 23.6 s late.
    one_offset = _results([{"src": "soak", "boot_to_wall": after}, *history])["effects_fenced"].counter_examples
    assert any(e["job"] == "1" and "after its job ended" in str(e["why"]) for e in one_offset), one_offset
    # A window just past the step, before the sampling saw it, still maps inside its own span.
    late = on_boot_clock(clean_history())
    late_clock = [clock[0], {"src": "clock", "boot": step_at - after + 0.25, "boot_to_wall": after}]
    assert all(p.ok for p in _results([*late_clock, *late]).values())
