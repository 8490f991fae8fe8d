"""The accuracy check wired in (issue 17): grammar, config, the eval baseline, and every reader of a run.

The job itself runs end to end in tests/integration/test_eval_jobs.py; here the pieces around it, each
against the real thing where one exists (a real Redis for the store and the dispatcher).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import redis

from bot import blocks, render
from bot.cli import main as cli_main
from bot.commands import EvalRequest, LaunchRequest, ParseError, SweepRequest, help_text, parse
from bot.dispatch import Dispatcher
from tests.factories import make_run
from workers.config import load_config, parse_config
from workers.errors import ConfigError
from workers.evaluation.runner import EvalRun
from workers.evaluation.scoring import score_item
from workers.evaluation.spec import EvalSpec
from workers.evaluation.tasks import builtin_task, load_task
from workers.jobs import queue
from workers.jobs.eval_run import eval_data
from workers.jobs.outcomes import EvalOutcome, LaunchOutcome, SweepCell, WrongAnswer, parse_outcome
from workers.jobs.payloads import EvalPayload, JobKind, LaunchPayload, SweepPayload, parse_payload
from workers.presets import LaunchIntent
from workers.results import export, store, tables
from workers.results.record import RunRecord

CONFIG = load_config()  # the embedded simulated host "sim"
TEAM_TOML = """
[hosts.gpu-1]
[eval]
task = "gsm8k"
n = 200
[eval.tasks]
gsm8k = "evals/gsm8k_test.jsonl"
mine = { path = "/srv/evals/mine.jsonl", max_tokens = 64 }
"""


# ------------------------------------------------------------------ grammar


@pytest.mark.parametrize(
    ("line", "spec", "any_config"),
    [
        ("/eval", EvalSpec(), False),
        ("/eval builtin n=60", EvalSpec("builtin", 60), False),
        ("/eval n=5 seed=3 any", EvalSpec("builtin", 5, 3), True),
        ("/eval BUILTIN on sim", EvalSpec("builtin"), False),
    ],
)
def test_eval_commands_parse(line: str, spec: EvalSpec, any_config: bool) -> None:
    request = parse(line, CONFIG)
    assert request == EvalRequest(host="sim", spec=spec, any_config=any_config)


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("/eval gsm8k", 'unknown eval task "gsm8k"'),
        ("/eval buildin", 'did you mean "builtin"'),
        ("/eval n=0", "n= must be from 1 to 5000, not 0"),
        ("/eval n=5001", "n= must be from 1 to 5000"),
        ("/eval n=many", "n= must be a whole number"),
        ("/eval limit=3", 'unknown eval option "limit="'),
        ("/eval n=3 n=4", '"n=" is given twice'),
        ("/eval builtin extra", 'unexpected "extra"'),
        ("/launch cutlass cudnn then eval then eval", 'after "then" comes "bench LEVELS" or "eval'),
        ("/launch cutlass cudnn then eval n=0", "n= must be from 1 to 5000"),
        ("/sweep cutlass cudnn, cutlass fp4-cutlass bench 1 eval nosuch", 'unknown eval task "nosuch"'),
    ],
)
def test_bad_eval_input_gets_a_friendly_refusal(line: str, words: str) -> None:
    result = parse(line, CONFIG)
    assert isinstance(result, ParseError) and words in result.message, result


def test_then_eval_and_a_sweeps_eval_parse_in_either_order() -> None:
    both = parse("/launch cutlass cudnn then bench 1,8 n=8 then eval n=60", CONFIG)
    assert isinstance(both, LaunchRequest) and both.then_eval == EvalSpec("builtin", 60)
    assert both.then_bench is not None and both.then_bench.levels == (1, 8) and both.then_bench.num_requests == 8
    flipped = parse("/launch cutlass cudnn then eval then bench 1", CONFIG)
    assert isinstance(flipped, LaunchRequest) and flipped.then_eval == EvalSpec() and flipped.then_bench is not None
    alone = parse("/launch cutlass cudnn then eval", CONFIG)
    assert isinstance(alone, LaunchRequest) and alone.then_bench is None and alone.then_eval == EvalSpec()
    sweep = parse("/sweep cutlass cudnn, cutlass fp4-cutlass bench 1,8 n=8 eval n=60 on sim", CONFIG)
    assert isinstance(sweep, SweepRequest) and sweep.eval == EvalSpec("builtin", 60) and sweep.host == "sim"
    assert sweep.spec.num_requests == 8
    plain = parse("/sweep cutlass cudnn, cutlass fp4-cutlass bench 1,8", CONFIG)
    assert isinstance(plain, SweepRequest) and plain.eval is None


def test_help_lists_eval_and_says_what_the_baseline_is() -> None:
    assert "/eval" in help_text(None, CONFIG)
    detail = help_text("eval", CONFIG)
    assert "[TASK]" in detail and "baseline" in detail and "[eval.tasks]" in detail
    assert "then eval" in help_text("launch", CONFIG) and "eval [TASK]" in help_text("sweep", CONFIG)


def test_a_refused_eval_queues_nothing_and_a_good_one_carries_its_spec(redis_client: redis.Redis) -> None:
    dispatcher = Dispatcher(CONFIG, redis_client, observe_timeout_s=0.1)
    for bad in ("/eval nosuch", "/eval n=0", "/eval builtin n=3 bogus"):
        assert not dispatcher.handle("alice", "C1", bad).ok
    assert queue.list_jobs(redis_client, "sim") == []
    reply = dispatcher.handle("alice", "C1", "/eval n=60 any")
    assert reply.ok and reply.job_id and "eval builtin n=60 (any config)" in reply.text
    payload = parse_payload(queue.job_payload(redis_client, reply.job_id))
    assert isinstance(payload, EvalPayload) and payload.eval == EvalSpec("builtin", 60) and payload.any_config
    assert queue.job_info(redis_client, reply.job_id).kind == JobKind.EVAL


def test_payloads_carry_the_eval_through_json() -> None:
    intent = LaunchIntent(presets=("cutlass", "cudnn"))
    launch = LaunchPayload("sim", "alice", "C1", launch=intent, eval=EvalSpec("builtin", 60, 2))
    assert parse_payload(json.loads(json.dumps(launch.to_dict()))) == launch
    sweep = SweepPayload("sim", "alice", "C1", configs=(intent,), bench=parse_bench(), eval=EvalSpec())
    assert parse_payload(json.loads(json.dumps(sweep.to_dict()))) == sweep
    old = {k: v for k, v in sweep.to_dict().items() if k != "eval"}  # a payload from before evals
    assert parse_payload(old).eval is None  # type: ignore[union-attr]


def parse_bench():
    from bot.commands import parse_bench_spec

    return parse_bench_spec(["1,8"], CONFIG)


# ------------------------------------------------------------------ config


def test_eval_config_points_at_the_teams_own_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "benchbot.toml"
    path.write_text(TEAM_TOML)
    config = load_config(str(path))
    assert config.eval.task == "gsm8k" and config.eval.n == 200 and config.eval.api == "chat"
    assert config.eval.files["gsm8k"].path == tmp_path / "evals/gsm8k_test.jsonl"  # relative to the config
    assert config.eval.files["mine"].max_tokens == 64
    assert config.eval.task_names == ["builtin", "gsm8k", "mine"]
    request = parse("/eval n=5", config)
    assert isinstance(request, EvalRequest) and request.spec.task == "gsm8k"  # the team's default task
    # the worker reads the file when the eval runs
    (tmp_path / "evals").mkdir()
    lines = [{"question": f"What is {i} + 1?", "answer": i + 1} for i in range(10)]
    (tmp_path / "evals/gsm8k_test.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    task = load_task("gsm8k", n=5, files=config.eval.files)
    assert len(task) == 5 and task.name == "gsm8k"


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ("[eval.tasks]\nbuiltin = '/x.jsonl'", "reserved"),
        ("[eval.tasks]\n'GSM 8k' = '/x.jsonl'", "short lowercase word"),
        ("[eval]\ntask = 'gsm8k'", "'gsm8k' is not a task"),
        ("[eval]\napi = 'grpc'", "use one of chat, completions, generate"),
        ("[eval]\nn = 0", "out of range"),
        ("[eval]\nmodel = 'x'", "eval.model: unknown key"),
        ("[eval.tasks]\nx = { path = '/x', tokens = 3 }", "eval.tasks.x.tokens: unknown key"),
    ],
)
def test_bad_eval_config_is_refused_naming_the_key(toml: str, words: str) -> None:
    with pytest.raises(ConfigError, match="eval") as info:
        parse_config("[hosts.a]\n" + toml, "team.toml")
    assert words in str(info.value)


def test_config_check_lists_the_eval_tasks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "benchbot.toml"
    path.write_text(TEAM_TOML)
    assert cli_main(["--config", str(path), "config", "check"]) == 0
    out = capsys.readouterr().out
    assert "eval: default gsm8k n=200 api=chat; tasks builtin, gsm8k (" in out and "mine (/srv/evals/mine.jsonl)" in out


# ------------------------------------------------------------------ the eval baseline (real Redis)


def scored(n: int, wrong: set[int] = frozenset(), model: str = "m") -> EvalRun:  # type: ignore[assignment]
    """A run of the built-in task answered by hand: right except the items in ``wrong``."""
    task = builtin_task(n)
    items = tuple(score_item(it, "0" if i in wrong else it.expected) for i, it in enumerate(task.items))
    return EvalRun("builtin", task.fingerprint, task.source, "chat", model, 512, items, 0.0, 1.0)


def stored(r: redis.Redis, run_id: str, run: EvalRun, *, verdict: str = "no_baseline", **kw: object) -> RunRecord:
    record = make_run(run_id, created_at=1764680000.0 + int(run_id[1:]), **kw)  # type: ignore[arg-type]
    data = eval_data(run, EvalSpec(), None, None, f"accuracy {run.accuracy}", verdict)
    record = RunRecord.from_dict({**record.to_dict(), "eval": data})
    store.save_run(r, record)
    store.save_eval_items(r, run_id, run)
    return record


def test_the_first_good_eval_is_the_baseline_never_the_run_itself(redis_client: redis.Redis) -> None:
    r = redis_client
    assert store.baseline_eval_for(r, "gpu-1", "builtin") is None
    stored(r, "r1", scored(60, {1, 2, 3, 4, 5, 6, 7, 8}), verdict="drop")  # a flagged eval is no answer sheet
    stored(r, "r2", scored(60))
    stored(r, "r3", scored(60, {1}))
    record, run, why = store.baseline_eval_for(r, "gpu-1", "builtin", "m") or (None, None, "")
    assert record is not None and record.id == "r2" and why == "the first eval of builtin on gpu-1"
    assert run is not None and run.accuracy.correct == 60
    assert store.baseline_eval_for(r, "gpu-1", "builtin", "m", exclude="r2")[0].id == "r3"  # type: ignore[index]
    assert store.baseline_eval_for(r, "gpu-1", "builtin", "other-model") is None
    assert store.baseline_eval_for(r, "gpu-1", "gsm8k") is None
    assert store.baseline_eval_for(r, "gpu-2", "builtin") is None


def test_a_run_the_team_tags_baseline_wins_over_the_first(redis_client: redis.Redis) -> None:
    r = redis_client
    stored(r, "r1", scored(60))
    stored(r, "r2", scored(60, {4}))
    store.tag_run(r, "r2", "baseline", by="alice")
    record, _, why = store.baseline_eval_for(r, "gpu-1", "builtin", "m") or (None, None, "")
    assert record is not None and record.id == "r2" and why == "the host's baseline"
    assert store.baseline_eval_for(r, "gpu-1", "builtin", "m", exclude="r2")[0].id == "r1"  # type: ignore[index]


# ------------------------------------------------------------------ every reader of a run carries the accuracy


def _with_eval(run_id: str, correct: int, verdict: str, baseline: str | None = None) -> RunRecord:
    record = make_run(run_id)
    data = {
        "task": "builtin",
        "n": 60,
        "correct": correct,
        "accuracy": correct / 60,
        "ci95": [0.8, 0.95],
        "verdict": verdict,
        "summary": "ACCURACY DROP: ..." if verdict == "drop" else "accuracy ...",
        "baseline_run": baseline,
    }
    return RunRecord.from_dict({**record.to_dict(), "eval": data})


def test_export_compare_and_runs_carry_the_accuracy_beside_the_throughput(redis_client: redis.Redis) -> None:
    good, bad, plain = _with_eval("r1", 60, "no_baseline"), _with_eval("r2", 53, "drop", "r1"), make_run("r3")
    rows = export.csv_rows(bad)
    assert {row["eval_accuracy"] for row in rows} == {"0.883333"} and rows[0]["output_tok_s"]
    assert rows[0]["eval_verdict"] == "drop" and rows[0]["eval_baseline_run"] == "r1" and rows[0]["eval_n"] == "60"
    assert rows[0]["eval_ci_low"] == "0.8" and rows[0]["eval_task"] == "builtin"
    assert all(row["eval_accuracy"] == "" for row in export.csv_rows(plain))
    for record in (good, bad, plain):
        store.save_run(redis_client, record)
    out = io.StringIO()
    export.export_runs(redis_client, "csv", out)
    assert [row["eval_verdict"] for row in csv.DictReader(io.StringIO(out.getvalue()))][-1] == ""
    out = io.StringIO()
    export.export_runs(redis_client, "jsonl", out)
    by_id = {d["id"]: d for d in map(json.loads, out.getvalue().splitlines())}
    assert by_id["r2"]["eval"]["verdict"] == "drop" and "eval" not in by_id["r3"]
    table = tables.compare_table([good, bad, plain])
    assert "r1  cutlass cudnn" in table and "acc 100.0 %" in table and "acc 88.3 % DROP" in table
    runs = tables.format_runs_table([good, bad, plain])
    assert "accuracy" in runs.splitlines()[0] and "88.3 % DROP" in runs


def test_the_red_flag_shows_in_plain_text_the_header_and_the_thread(redis_client: redis.Redis) -> None:
    flagged = EvalOutcome(
        run_id="r2",
        summary="ACCURACY DROP: 88.3 % (baseline 100.0 %, 11.7 points lower, beyond noise: p = 0.0078)",
        flagged=True,
        detail="baseline r1 (the host's baseline): McNemar ...",
        baseline_run="r1",
        wrong=(WrongAnswer("builtin-1", "expected 12, got 13", "The answer is 13."),),
    )
    assert parse_outcome(json.loads(json.dumps(flagged.to_dict()))) == flagged
    text = render.succeeded_text(flagged.to_dict())
    assert text.startswith("run r2\n! ACCURACY DROP: 88.3 %") and "wrong builtin-1: expected 12, got 13" in text
    from bot.job_threads import fold  # the header state a Slack thread keeps
    from workers.jobs import events

    event = events.Event(id="1-0", job="7", type=events.SUCCEEDED, data=flagged.to_dict(), ts=0.0)
    state = fold({"job_id": "7", "user": "alice", "host": "gpu-1", "kind": "eval"}, event)
    header = json.dumps(blocks.header_message(state))
    assert ":red_circle: ACCURACY DROP: 88.3 %" in header
    # The thread's results: the verdict, red, for an eval stored alone.
    from bot import job_threads

    store.save_run(redis_client, _with_eval("r2", 53, "drop", "r1"))  # a bench with its eval
    message = json.dumps(job_threads.bench_results_message(store.result_runs(redis_client, ["r2"])))
    assert "Bench r2" in message and "acc 88.3 % DROP" in message and ":red_circle: *ACCURACY DROP" in message
    alone = RunRecord.from_dict({**_with_eval("r5", 53, "drop", "r1").to_dict(), "levels": [], "kind": "eval"})
    store.save_run(redis_client, alone)  # an eval stored alone: its verdict is the result
    message = json.dumps(job_threads.bench_results_message(store.result_runs(redis_client, ["r5"])))
    assert "Eval r5" in message and ":red_circle: *ACCURACY DROP" in message and "conc" not in message


def test_launch_and_sweep_outcomes_carry_their_eval() -> None:
    from tests.factories import make_config
    from workers.observation import RunningConfig

    evaluated = EvalOutcome(run_id="r4", summary="accuracy 100.0 % (...)")
    launch = LaunchOutcome(config=RunningConfig.from_dict(make_config()), eval=evaluated)
    back = parse_outcome(json.loads(json.dumps(launch.to_dict())))
    assert isinstance(back, LaunchOutcome) and back.eval == evaluated and back.run_id == "r4"
    cell = SweepCell(label="x", status="ok", run_id="r4", eval=evaluated, eval_error="")
    assert SweepCell.from_dict(json.loads(json.dumps(cell.to_dict()))) == cell
