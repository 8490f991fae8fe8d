"""The typed job contracts: payloads, expectations, results, ready data and the enums.

Each variant survives the JSON edge (``to_dict`` -> JSON -> ``from_dict``/``parse_*``) unchanged, the
shapes older benchbots wrote still read, and the enums' values are the strings Redis and Slack always saw.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bot import blocks
from tests.factories import make_config
from workers.benchmark.spec import BenchSpec
from workers.engines.args import ArgDiff
from workers.errors import BenchbotError
from workers.jobs import events
from workers.jobs.events import (
    CancelledData,
    EventType,
    FailedData,
    JobState,
    ProgressData,
    ProgressPhase,
    QueuedData,
    StartedData,
)
from workers.jobs.outcomes import (
    BenchOutcome,
    LaunchOutcome,
    ReadyData,
    StopOutcome,
    Stopped,
    SweepCell,
    SweepOutcome,
    parse_outcome,
    run_ids_of,
)
from workers.jobs.payloads import (
    BenchPayload,
    Expectation,
    JobKind,
    LaunchPayload,
    OutcomeKind,
    StopPayload,
    SweepPayload,
    parse_payload,
)
from workers.observation import LaunchedBy, ObservedState, RunningConfig
from workers.observer import LaunchRecord
from workers.presets import LaunchIntent


def _wire(data: object) -> object:
    """Through JSON and back, as Redis and RQ carry it."""
    return json.loads(json.dumps(data))


def _observation(**changes: object) -> RunningConfig:
    return replace(RunningConfig.from_dict(make_config(host="gpu-1")), **changes)


INTENT = LaunchIntent(("nextn", "cudnn"), (("--mem-fraction-static", "0.8"), ("--enable-metrics", True)))
SPEC = BenchSpec(levels=(1, 8), input_len=128, output_len=32, num_requests=16, warmup=2)

PAYLOADS = [
    LaunchPayload("gpu-1", "alice", "C1", launch=INTENT),
    LaunchPayload("gpu-1", "alice", "C1", launch=INTENT, bench=SPEC),
    BenchPayload("gpu-1", "bob", "C1", bench=SPEC, any_config=True),
    BenchPayload("gpu-1", "bob", "C1", bench=SPEC, expect=Expectation(after_job="17", label="launch nextn")),
    BenchPayload(
        "gpu-1",
        "bob",
        "C1",
        bench=SPEC,
        expect=Expectation(fingerprint="fp1", instance_id="gpu-1:1:2", label="nextn", fresh=True),
    ),
    BenchPayload(
        "gpu-1", "bob", "C1", bench=SPEC, expect=Expectation(nothing_running=True, label="nothing", fresh=True)
    ),
    StopPayload("gpu-2", "carol", "C2"),
    SweepPayload("gpu-1", "dave", "C1", configs=(INTENT, LaunchIntent(("cutlass",))), bench=SPEC),
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: f"{p.kind}")
def test_every_payload_variant_round_trips_through_json(payload) -> None:
    data = _wire(payload.to_dict())
    assert data["schema"] == 1 and data["kind"] == payload.kind.value
    assert parse_payload(data) == payload


def test_payload_outcome_kinds_say_whether_a_launch_benches() -> None:
    assert PAYLOADS[0].outcome_kind == OutcomeKind.LAUNCH
    assert PAYLOADS[1].outcome_kind == OutcomeKind.LAUNCH_BENCH
    assert PAYLOADS[2].outcome_kind == OutcomeKind.BENCH
    assert PAYLOADS[-1].outcome_kind == OutcomeKind.SWEEP


def test_the_expectation_writes_the_keys_the_dispatcher_always_wrote() -> None:
    assert Expectation(after_job="17", label="launch x").to_dict() == {"after_job": "17", "label": "launch x"}
    assert Expectation(nothing_running=True, label="nothing", fresh=True).to_dict() == {
        "nothing_running": True,
        "label": "nothing",
        "fresh": True,
    }
    assert Expectation(fingerprint="f", instance_id="i", label="l", fresh=False).to_dict() == {
        "fingerprint": "f",
        "instance_id": "i",
        "label": "l",
        "fresh": False,
    }
    assert Expectation.from_dict(None) is None and Expectation.from_dict({}) is None


def test_a_schema_1_payload_an_older_bot_queued_still_reads() -> None:
    """Older bots wrote the launch as a whole LaunchSpec (argv, port, model) and a bench's expect as a dict."""
    old_launch = {
        "schema": 1,
        "kind": "launch",
        "host": "gpu-1",
        "user": "alice",
        "channel": "C1",
        "launch": {
            "label": "nextn",
            "presets": ["nextn"],
            "raw_flags": [["--mem-fraction-static", "0.8"]],
            "flags": [["--port", "30000"]],
            "argv": ["python3", "-m", "sglang.launch_server", "--port", "30000"],
        },
        "bench": {"levels": [1, 8]},
    }
    payload = parse_payload(old_launch)
    assert isinstance(payload, LaunchPayload) and payload.launch.presets == ("nextn",)
    assert payload.launch.raw_flags == (("--mem-fraction-static", "0.8"),) and payload.bench is not None
    old_bench = {
        "schema": 1,
        "kind": "bench",
        "host": "gpu-1",
        "user": "bob",
        "channel": "C1",
        "bench": {"levels": [4]},
        "any": False,
        "expect": {"fingerprint": "abc", "instance_id": None, "label": "x", "fresh": True},
    }
    bench = parse_payload(old_bench)
    assert isinstance(bench, BenchPayload) and bench.expect == Expectation(fingerprint="abc", label="x", fresh=True)


def test_an_unreadable_payload_is_a_friendly_error() -> None:
    with pytest.raises(BenchbotError, match="unknown kind"):
        parse_payload({"schema": 1, "kind": "reboot", "host": "gpu-1"})
    with pytest.raises(BenchbotError, match="schema 9"):
        parse_payload({"schema": 9, "kind": "stop", "host": "gpu-1"})
    with pytest.raises(BenchbotError, match="malformed"):
        parse_payload({"schema": 1, "kind": "bench", "host": "gpu-1"})


OUTCOMES = [
    LaunchOutcome(config=_observation(), diff=(ArgDiff("--mem-fraction-static", "0.9", 0.88, "n"),)),
    LaunchOutcome(config=_observation(), bench=BenchOutcome(run_id="r1", valid=False, invalid_reason="x", table="t")),
    BenchOutcome(run_id="r2", table="| a |"),
    StopOutcome(stopped=Stopped(config=_observation(), how="SIGTERM"), message="stopped it (SIGTERM)"),
    StopOutcome(stopped=None, message="nothing on port 30000 of gpu-1"),
    SweepOutcome(
        sweep_id="s5",
        cells=(
            SweepCell(label="nextn", status="ok", run_id="r3", table="t"),
            SweepCell(label="bad", status="failed", run_id="r4", diagnosis={"category": "oom"}, message="OOM"),
        ),
        run_ids=("r3", "r4"),
        table="cmp",
    ),
]


@pytest.mark.parametrize("outcome", OUTCOMES, ids=lambda o: f"{o.kind}")
def test_every_result_variant_round_trips_through_json(outcome) -> None:
    data = _wire(outcome.to_dict())
    assert data["kind"] == outcome.kind.value
    assert parse_outcome(data) == outcome


def test_results_keep_the_json_shape_readers_always_saw() -> None:
    launch_bench = OUTCOMES[1].to_dict()
    assert launch_bench["kind"] == "launch+bench" and launch_bench["run_id"] == "r1"
    assert launch_bench["bench"] == {"run_id": "r1", "valid": False, "invalid_reason": "x", "table": "t"}
    assert OUTCOMES[2].to_dict() == {
        "kind": "bench",
        "run_id": "r2",
        "valid": True,
        "invalid_reason": None,
        "table": "| a |",
    }
    assert [run_ids_of(o) for o in OUTCOMES] == [(), ("r1",), ("r2",), (), (), ("r3", "r4")]


def test_a_result_of_no_known_kind_is_none_not_an_error() -> None:
    assert parse_outcome({"url": "http://x"}) is None
    assert parse_outcome(None) is None
    assert parse_outcome({"kind": "launch"}) is None  # a launch result without its observation says nothing


def test_ready_data_round_trips_and_reads_an_event_without_extras() -> None:
    ready = ReadyData(
        config=_observation(),
        diff=(ArgDiff("--x", "1", "2"),),
        replaced=Stopped(config=_observation(instance_id="gpu-1:9:9"), how="SIGKILL"),
        launch={"label": "nextn", "flags": [["--port", "30000"]]},
        smoke_text="Paris",
        smoke_completion_tokens=3,
        engine_version="0.5.9",
        checked_against="recorded",
    )
    assert ReadyData.from_dict(_wire(ready.to_dict())) == ready
    minimal = ReadyData.from_dict({"config": make_config(), "diff": [{"arg": "--y", "requested": 1, "observed": 2}]})
    assert minimal is not None and minimal.diff == (ArgDiff("--y", 1, 2),) and minimal.replaced is None
    assert ReadyData.from_dict({"config": {"not": "an observation"}}) is None


def test_an_observation_round_trips_with_who_launched_it_and_reads_older_ones() -> None:
    observed = _observation(
        managed=True, launched_by=LaunchedBy(user="alice", job="7", at=1.5, label="nextn"), engine_version="0.5.9"
    )
    assert RunningConfig.from_dict(_wire(observed.to_dict())) == observed
    old = make_config()
    for key in ("engine_kind", "owner_user", "owner_gpu_mib", "gpu_processes", "launch_args", "engine_version"):
        old.pop(key, None)
    old["launched_by"] = {"user": "bob", "job": "3"}  # written before "at"/"label" were kept
    read = RunningConfig.from_dict(old)
    assert read.launched_by == LaunchedBy(user="bob", job="3") and read.engine_version is None
    assert read.state is ObservedState.RUNNING


def test_a_launch_record_round_trips_and_reads_a_partial_one() -> None:
    record = LaunchRecord("gpu-1:5:6", 5, "alice", "7", 1.0, "nextn", "/tmp/x.log", (("--port", "1"), ("--y", True)))
    assert LaunchRecord.from_dict(_wire(record.to_dict())) == record
    assert LaunchRecord.from_dict({"instance_id": "gpu-1:5:6", "job": 7}).job == "7"


def test_enum_values_are_the_strings_redis_and_slack_always_saw() -> None:
    assert [e.value for e in EventType] == [
        "queued",
        "started",
        "progress",
        "ready",
        "succeeded",
        "failed",
        "cancelled",
    ]
    assert (events.QUEUED, events.SUCCEEDED, events.CANCELLED) == ("queued", "succeeded", "cancelled")
    assert {s.value for s in JobState} == {"queued", "waiting", "running", "succeeded", "failed", "cancelled"}
    assert {p.value for p in ProgressPhase} >= {"observe", "bench", "spawn", "watch", "smoke", "sweep", "waiting"}
    assert [k.value for k in JobKind] == ["launch", "bench", "stop", "sweep", "eval", "tune"]  # eval: 17, tune: 37
    assert OutcomeKind.LAUNCH_BENCH == "launch+bench"
    assert {s.value for s in ObservedState} == {"running", "starting", "loading", "none", "unresponsive", "not_sglang"}
    assert json.dumps({"type": EventType.READY}) == '{"type": "ready"}' and f"{JobState.RUNNING}" == "running"


# --------------------------------------------------------------------------- the header's shape comes from the type


def _header_state(**state: object) -> dict[str, object]:
    return {"job_id": "7", "user": "alice", "host": "gpu-1", "kind": "bench", **state}


def test_bench_this_is_offered_for_a_plain_launch_by_its_outcome_kind() -> None:
    state = _header_state(kind="launch", outcome_kind="launch", summary="launch nextn", phase="ready")
    assert "bench_this" in {b["action_id"] for b in blocks.header_buttons(state)}


def test_a_launch_that_benches_is_told_by_its_outcome_kind_not_its_summary() -> None:
    """The summary says nothing about the shape: a launch+bench without the words still offers no "Bench this"."""
    state = _header_state(kind="launch", outcome_kind="launch+bench", summary="launch nextn", phase="ready")
    assert "bench_this" not in {b["action_id"] for b in blocks.header_buttons(state)}


def test_a_summary_saying_then_bench_does_not_change_a_plain_launch() -> None:
    """A user's words can contain "then bench" (a label, a flag value): the type decides, not the text."""
    state = _header_state(kind="launch", outcome_kind="launch", summary="launch my-then bench-preset", phase="ready")
    assert "bench_this" in {b["action_id"] for b in blocks.header_buttons(state)}
    plain_bench = _header_state(kind="bench", outcome_kind="bench", summary="bench then bench", phase="done")
    assert "bench_this" not in {b["action_id"] for b in blocks.header_buttons(plain_bench)}


def test_the_finished_result_kind_wins_over_the_queued_shape() -> None:
    state = _header_state(kind="launch", outcome_kind="launch", result_kind="launch", phase="done", summary="x")
    assert "bench_this" in {b["action_id"] for b in blocks.header_buttons(state)}
    state = _header_state(kind="launch", outcome_kind="launch+bench", result_kind="launch+bench", phase="done")
    assert "bench_this" not in {b["action_id"] for b in blocks.header_buttons(state)}


# --------------------------------------------------------------------------- event data

EVENT_DATA = [
    (events.QUEUED, QueuedData("7", "alice", "C1", "gpu-1", "launch", "launch nextn", position=2, ahead=1)),
    (events.STARTED, StartedData(worker="w1", fence=3, host="gpu-1")),
    (events.PROGRESS, ProgressData(phase=ProgressPhase.OBSERVE, message="observing")),
    (events.FAILED, FailedData(message="OOM", diagnosis={"category": "oom", "log_tail": ["a", "b"]})),
    (events.CANCELLED, CancelledData(by="bob", message="cancelled by bob")),
]


@pytest.mark.parametrize(("type_", "data"), EVENT_DATA, ids=[str(t) for t, _ in EVENT_DATA])
def test_every_event_data_variant_round_trips_through_a_redis_stream(redis_client, type_, data) -> None:
    events.publish(redis_client, "7", type_, data.to_dict())
    (event,) = events.job_events(redis_client, "7")
    assert event.type is type_ and type(data).from_dict(event.data) == data


def test_event_data_older_writers_left_short_still_reads() -> None:
    assert QueuedData.from_dict({"summary": "bench x"}) == QueuedData("", "", "", "", "", "bench x")
    assert FailedData.from_dict({"message": "worker died"}) == FailedData("worker died")
    assert FailedData.from_dict({"message": "x", "diagnosis": None}).log_tail == []
    assert CancelledData.from_dict({}).by is None and StartedData.from_dict({"worker": "w"}).fence is None


def test_a_ready_and_a_result_round_trip_through_a_redis_stream(redis_client) -> None:
    ready = ReadyData(config=_observation(), diff=(ArgDiff("--x", "1", "2"),))
    events.publish(redis_client, "8", events.READY, ready.to_dict())
    events.publish(redis_client, "8", events.SUCCEEDED, OUTCOMES[1].to_dict())
    first, last = events.job_events(redis_client, "8")
    assert ReadyData.from_dict(first.data) == ready and parse_outcome(last.data) == OUTCOMES[1]
    assert events.terminal_type(redis_client, "8") is EventType.SUCCEEDED
