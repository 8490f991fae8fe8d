"""The tune's confirmation compares its winner with the host's baseline like with like (issue: a baseline of
other request sizes gave a verdict at the same concurrency that meant nothing)."""

from __future__ import annotations

from dataclasses import replace

from tests.factories import make_run
from workers.results.record import RunRecord
from workers.tune.confirm import Confirmed, compare_with_baseline, request_shape
from workers.tune.state import DONE, TrialRecord

WINNER = Confirmed(
    TrialRecord(number=2, config="moe=triton", params={"moe": "triton"}, status=DONE, knee=8),
    run_id="r9",
    tok_s=(2600.0, 2610.0, 2590.0),
    eval_run=None,
)


def _confirm_run(**params: object) -> RunRecord:
    run = make_run("r9", levels=(8,), input_len=32, output_len=8)
    return replace(run, params={**run.params, "levels": [8], "repeat": 3, **params})


def test_a_baseline_of_the_same_requests_gets_a_verdict_at_the_winners_knee() -> None:
    baseline = make_run("r3", levels=(1, 8, 32), input_len=32, output_len=8, tags=("baseline",))
    compared = compare_with_baseline("gpu-1", baseline, WINNER, _confirm_run())
    assert compared["baseline"] == "r3" and "verdict" in compared, compared
    assert str(compared["text"]).startswith("against the baseline r3: "), compared


def test_a_baseline_of_other_request_sizes_is_not_compared_and_says_so() -> None:
    baseline = make_run("r3", levels=(1, 8, 32), input_len=1024, output_len=256, tags=("baseline",))
    compared = compare_with_baseline("gpu-1", baseline, WINNER, _confirm_run())
    assert "verdict" not in compared, compared
    assert compared["text"] == (
        "the baseline r3 measured other request sizes (in=1024 out=256; this tune in=32 out=8): not compared"
    )


def test_the_same_lengths_in_another_load_shape_are_not_compared_either() -> None:
    baseline = make_run("r3", levels=(8,), input_len=32, output_len=8, tags=("baseline",))
    open_loop = replace(baseline, params={**baseline.params, "levels": [], "rates": [8.0], "arrivals": "poisson"})
    compared = compare_with_baseline("gpu-1", open_loop, WINNER, _confirm_run())
    assert "verdict" not in compared, compared
    assert "(load=open loop (poisson); this tune load=closed loop): not compared" in str(compared["text"]), compared
    prefixed = compare_with_baseline(
        "gpu-1", replace(baseline, params={**baseline.params, "prefix_tokens": 512}), WINNER, _confirm_run()
    )
    assert "verdict" not in prefixed and "prefix=512" in str(prefixed["text"]), prefixed


def test_a_baseline_that_does_not_record_its_requests_is_not_compared() -> None:
    failed = replace(make_run("r3", tags=("baseline",)), params={})
    compared = compare_with_baseline("gpu-1", failed, WINNER, _confirm_run())
    assert "verdict" not in compared
    assert compared["text"] == "the baseline r3 does not record its request sizes: not compared"
    assert request_shape({}) is None and request_shape({"input_len": "many"}) is None
