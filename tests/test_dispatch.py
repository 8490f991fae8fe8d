"""The dispatcher: access rules, refusals that change nothing, queued jobs, immediate answers."""

from __future__ import annotations

import io
import json

import pytest

from bot.console import run_console
from bot.dispatch import Dispatcher
from workers.config import SEED_PRESETS_TOML, parse_config
from workers.jobs import queue
from workers.presets import LaunchIntent, build_launch

CONFIG_TEXT = (
    """
default_host = "gpu-1"
[engine]
flags = { "--tp-size" = 8, "--disable-custom-all-reduce" = true }
[hosts.gpu-1]
[hosts.gpu-2]
port = 30001
[access]
users = ["alice", "bob", "root"]
channels = ["C-bench"]
admins = ["root"]
commands = { stop = ["alice"] }
[limits]
max_queued_per_user = 2
"""
    + SEED_PRESETS_TOML
)


@pytest.fixture
def dispatcher(redis_client, tmp_path):
    return Dispatcher(parse_config(CONFIG_TEXT), redis_client, plots_dir=tmp_path, observe_timeout_s=0.2)


def benchbot_keys(redis_client) -> set[bytes]:
    return set(redis_client.keys("*"))


def test_help_answers_every_command(dispatcher):
    reply = dispatcher.handle("alice", "C-bench", "/help")
    assert reply.ok and reply.kind == "help" and reply.ephemeral
    for name in ("launch", "bench", "status", "queue", "cancel", "stop", "runs", "compare", "sweep", "help"):
        assert f"/{name}" in reply.text


@pytest.mark.parametrize(
    ("user", "channel", "line", "why"),
    [
        ("mallory", "C-bench", "/launch cutlass", "not on this benchbot's access list"),
        ("alice", "C-random", "/launch cutlass", "does not take commands in this channel"),
        ("bob", "C-bench", "/stop", "only alice may stop"),
    ],
)
def test_access_refusals_change_nothing(dispatcher, redis_client, user, channel, line, why):
    before = benchbot_keys(redis_client)
    reply = dispatcher.handle(user, channel, line)
    assert not reply.ok and reply.kind == "denied" and why in reply.text
    assert benchbot_keys(redis_client) == before


def test_bad_input_changes_nothing(dispatcher, redis_client):
    before = benchbot_keys(redis_client)
    for line in ("/launch nextn cudnn; rm -rf /", "/bench 0,8", "/launch nextnn", "/sweep cutlass bench"):
        reply = dispatcher.handle("alice", "C-bench", line)
        assert not reply.ok and reply.text
    assert benchbot_keys(redis_client) == before


def test_launch_is_queued_with_a_header_and_the_intent_the_worker_compiles(dispatcher, redis_client):
    reply = dispatcher.handle("alice", "C-bench", "/launch nextn cudnn on gpu-2")
    assert reply.ok and reply.kind == "queued" and not reply.ephemeral
    # No worker serves gpu-2 here: the reply says so at once (issue 16.3).
    assert reply.text.splitlines() == [
        f"@alice: launch nextn cudnn on gpu-2, queued #{reply.job_id}, next in line",
        "no worker is serving gpu-2: its jobs wait until one starts (`benchbot worker --host gpu-2`)",
    ]
    payload = queue.job_payload(redis_client, reply.job_id)
    assert payload["kind"] == "launch" and payload["host"] == "gpu-2"
    # Intent only: the worker builds the argv with its config and the host's SGLang version.
    assert payload["launch"] == {"schema": 2, "presets": ["nextn", "cudnn"], "raw_flags": [], "label": "nextn cudnn"}
    second = dispatcher.handle("bob", "C-bench", "/launch cutlass cudnn on gpu-2")
    assert second.data["ahead"] == 1 and "1 ahead" in second.text
    listing = dispatcher.handle("bob", "C-bench", "/queue gpu-2")
    assert listing.ok and [j["job_id"] for j in listing.data["hosts"]["gpu-2"]] == [reply.job_id, second.job_id]


def test_per_user_queue_limit_refuses_and_enqueues_nothing(dispatcher, redis_client):
    for _ in range(2):
        assert dispatcher.handle("alice", "C-bench", "/launch cutlass").ok
    jobs_before = queue.list_jobs(redis_client, "gpu-1")
    reply = dispatcher.handle("alice", "C-bench", "/launch cudnn")
    assert not reply.ok and "2" in reply.text
    assert queue.list_jobs(redis_client, "gpu-1") == jobs_before


def test_cancel_own_job_yes_others_no_admin_yes(dispatcher, redis_client):
    mine = dispatcher.handle("alice", "C-bench", "/launch cutlass").job_id
    theirs = dispatcher.handle("alice", "C-bench", "/launch cudnn").job_id
    refused = dispatcher.handle("bob", "C-bench", f"/cancel {mine}")
    assert not refused.ok and "belongs to alice" in refused.text
    assert dispatcher.handle("alice", "C-bench", f"/cancel {mine}").ok
    assert dispatcher.handle("root", "C-bench", f"/cancel {theirs}").ok
    assert queue.list_jobs(redis_client, "gpu-1") == []


def test_bench_of_own_queued_launch_expects_that_launch(dispatcher, redis_client):
    launch = dispatcher.handle("alice", "C-bench", "/launch nextn cudnn").job_id
    bench = dispatcher.handle("alice", "C-bench", "/bench 1,8").job_id
    assert queue.job_payload(redis_client, bench)["expect"]["after_job"] == launch
    anyone = dispatcher.handle("bob", "C-bench", "/bench 1 any").job_id
    payload = queue.job_payload(redis_client, anyone)
    assert payload["any"] is True and payload["expect"] is None


def test_status_without_a_worker_says_so(dispatcher):
    reply = dispatcher.handle("alice", "C-bench", "/status gpu-1")
    assert reply.ok and "no worker is serving gpu-1: its jobs wait until one starts" in reply.text
    assert "`benchbot worker --host gpu-1`); never observed" in reply.text


def test_unknown_run_and_button_are_friendly(dispatcher):
    assert "no run r98; /runs lists them" in dispatcher.handle("alice", "C-bench", "/compare r98 r99").text
    assert not dispatcher.handle_action("alice", "C-bench", "explode", "1").ok
    assert "there is no job 4242" in dispatcher.handle_action("alice", "C-bench", "rerun_job", "4242").text


def test_console_reads_commands_until_quit(redis_client, tmp_path):
    out = io.StringIO()
    config = parse_config(CONFIG_TEXT)
    code = run_console(
        config,
        redis_client,
        user="alice",
        channel="C-bench",
        out_dir=tmp_path,
        stdin=io.StringIO("/help\n/bench 0\nquit\n/help\n"),
        stdout=out,
    )
    text = out.getvalue()
    assert code == 0
    assert text.count("benchbot commands:") == 1  # the line after quit was not read
    assert "concurrency levels start at 1" in text


def test_compare_with_baseline_button_draws_the_runs_against_the_hosts_baseline(dispatcher, redis_client):
    from tests.factories import make_run
    from workers.results import store

    baseline = store.save_run(redis_client, make_run(run_id="", host="gpu-1", label="cutlass cudnn"))
    later = store.save_run(redis_client, make_run(run_id="", host="gpu-1", label="nextn cudnn"))
    no_baseline = dispatcher.handle_action("alice", "C-bench", "compare_baseline", later)
    assert not no_baseline.ok and "has no baseline yet" in no_baseline.text
    assert dispatcher.handle("alice", "C-bench", f"/runs tag {baseline} baseline").ok
    reply = dispatcher.handle_action("alice", "C-bench", "compare_baseline", later)
    assert reply.ok and reply.kind == "compare" and reply.data["runs"] == [baseline, later]
    assert reply.files and all(path.endswith(".png") for path in reply.files)
    itself = dispatcher.handle_action("alice", "C-bench", "compare_baseline", baseline)
    assert not itself.ok and "is the baseline itself" in itself.text


@pytest.mark.parametrize(
    ("user", "line", "why"),
    [
        ("alice", "/launch cutlass --por 43103", "--por (--port in SGLang"),
        ("alice", "/launch cutlass --hos 0.0.0.0", "--hos (--host in SGLang"),
        ("alice", "/launch cutlass --config /tmp/args.yaml", "--config is set by benchbot"),
        ("alice", "/launch cutlass --api-ke sk-1", "--api-ke (--api-key in SGLang"),
        ("root", "/launch cutlass --port 43103", "--port is set by benchbot"),  # reserved even for an admin
        ("alice", "/launch cutlass --model-pat x --trust-remote-code", "only an admin may give it"),
        ("bob", "/launch cutlass --trust-remote-code", "only an admin may give it"),
        ("alice", "/sweep cutlass, cudnn --tokenizer-path t bench 1", "only an admin may give it"),
    ],
)
def test_reserved_and_admin_only_flags_are_refused_after_prefix_resolution(dispatcher, redis_client, user, line, why):
    before = benchbot_keys(redis_client)
    reply = dispatcher.handle(user, "C-bench", line)
    assert not reply.ok and why in reply.text, reply.text
    assert queue.list_jobs(redis_client, "gpu-1") == []
    assert benchbot_keys(redis_client) == before


def test_an_admin_may_change_the_model_and_trust_remote_code(dispatcher, redis_client):
    reply = dispatcher.handle("root", "C-bench", "/launch cutlass --model-pat x --trust-remote-code")
    assert reply.ok and reply.kind == "queued", reply.text
    intent = LaunchIntent.from_dict(queue.job_payload(redis_client, reply.job_id)["launch"])
    argv = build_launch(dispatcher.config, dispatcher.config.host("gpu-1"), intent.presets, intent.raw_flags).argv
    assert "--trust-remote-code" in argv and argv[argv.index("--model-pat") + 1] == "x"
    assert "--model-path" not in argv  # the admin's model replaces the configured one, not beside it


def test_rerunning_an_admins_launch_needs_an_admin(dispatcher, redis_client):
    job = dispatcher.handle("root", "C-bench", "/launch cutlass --trust-remote-code").job_id
    refused = dispatcher.handle_action("alice", "C-bench", "rerun_job", job)
    assert not refused.ok and "only an admin may give it" in refused.text
    assert [j.job_id for j in queue.list_jobs(redis_client, "gpu-1")] == [job]
    assert dispatcher.handle_action("root", "C-bench", "rerun_job", job).ok


def test_rerunning_a_launch_an_older_bot_queued_with_its_argv_queues_the_intent_only(dispatcher, redis_client):
    config = dispatcher.config
    old = build_launch(config, config.host("gpu-1"), ("cutlass", "cudnn"), (("--mem-fraction-static", "0.8"),))
    payload = {"schema": 1, "kind": "launch", "host": "gpu-1", "user": "alice", "channel": "C-bench"}
    queued = queue.enqueue(
        redis_client,
        "gpu-1",
        "launch",
        {**payload, "launch": old.to_dict()},
        user="alice",
        channel="C-bench",
        summary="launch cutlass cudnn --mem-fraction-static 0.8",
        job_timeout_s=600,
    )
    assert "argv" in queue.job_payload(redis_client, queued.job_id)["launch"]
    reply = dispatcher.handle_action("alice", "C-bench", "rerun_job", queued.job_id)
    assert reply.ok and reply.job_id != queued.job_id, reply.text
    launch = queue.job_payload(redis_client, reply.job_id)["launch"]
    assert launch == LaunchIntent(("cutlass", "cudnn"), (("--mem-fraction-static", "0.8"),)).to_dict()


def test_a_launch_that_benches_carries_its_shape_to_the_header_without_reading_the_summary(dispatcher, redis_client):
    """Slack's header (from the Reply) and a console job's header (from the events alone) both know the shape."""
    from bot import blocks
    from bot.job_threads import fold
    from workers.jobs import events

    benches = dispatcher.handle("alice", "C-bench", "/launch nextn cudnn on gpu-2 then bench 1,8")
    plain = dispatcher.handle("bob", "C-bench", "/launch cutlass cudnn on gpu-1")
    assert benches.ok and plain.ok, (benches.text, plain.text)
    assert benches.data["outcome_kind"] == "launch+bench" and plain.data["outcome_kind"] == "launch"
    for reply, offered in ((benches, False), (plain, True)):
        (queued,) = events.job_events(redis_client, reply.job_id)
        state = {**fold({}, queued), "phase": "ready"}
        assert ("bench_this" in {b["action_id"] for b in blocks.header_buttons(state)}) is offered


def test_every_queued_bench_says_which_server_it_measures_and_an_unknown_one_is_marked(dispatcher, redis_client):
    """Issue 25 item 6: no worker answers and nothing is stored, so nobody can tell which server is meant:
    the payload says so (the job will refuse) and so do the reply and the Slack header."""
    from bot import blocks

    unknown = dispatcher.handle("alice", "C-bench", "/bench 1 on gpu-2")
    expect = queue.job_payload(redis_client, unknown.job_id)["expect"]
    assert expect == {"unknown": "no worker for gpu-2 answered in time and there is no stored observation of it"}
    assert "measures: nothing: benchbot cannot tell which server you mean" in unknown.text
    assert "ask again with any" in unknown.text
    header = json.dumps(blocks.header_message({"phase": "queued", **unknown.data}))
    assert "measures: *nothing*" in header and "`any`" in header
    anyone = dispatcher.handle("bob", "C-bench", "/bench 1 any on gpu-2")
    assert anyone.text.splitlines()[1] == "measures: whatever runs when its turn comes (any)"
    launch = dispatcher.handle("root", "C-bench", "/launch cutlass on gpu-2").job_id
    after = dispatcher.handle("root", "C-bench", "/eval on gpu-2")
    assert f"measures: the server your job #{launch} starts" in after.text
    assert "measures" not in dispatcher.handle("bob", "C-bench", "/launch cudnn on gpu-2").data


def test_only_an_admin_may_make_a_flagged_run_the_baseline_and_the_reply_says_what_it_overrides(
    dispatcher, redis_client
):
    """Issue 25 item 5: an ACCURACY DROP or invalid run as the baseline would make the next eval of the same
    bad config read "within noise"."""
    import dataclasses

    from tests.factories import make_run
    from workers.results import store

    drop = {"task": "arith", "n": 60, "correct": 40, "accuracy": 40 / 60, "verdict": "drop", "summary": "-33 pts"}
    good = store.save_run(redis_client, make_run(run_id="", label="cutlass cudnn"))
    dropped = store.save_run(redis_client, dataclasses.replace(make_run(run_id="", label="fp4"), eval=drop))
    invalid = store.save_run(redis_client, make_run(run_id="", valid=False, invalid_reason="the server was replaced"))
    first = dispatcher.handle("alice", "C-bench", f"/runs tag {good} baseline")
    assert first.ok and "the baseline of gpu-1 from now on" in first.text
    for run_id, flag in ((dropped, "ACCURACY DROP (arith 66.7 %: -33 pts)"), (invalid, "INVALID: the server was")):
        before = benchbot_keys(redis_client)
        refused = dispatcher.handle("bob", "C-bench", f"/runs tag {run_id} baseline")
        assert not refused.ok and "only an admin may make it the baseline" in refused.text, refused.text
        assert flag in refused.text
        assert benchbot_keys(redis_client) == before and store.get_run(redis_client, run_id).tags == ()
    assert store.baseline_for(redis_client, "gpu-1").id == good
    assert dispatcher.handle("bob", "C-bench", f"/runs tag {dropped} fp4-bad").ok  # other tags: anyone
    admin = dispatcher.handle("root", "C-bench", f"/runs tag {dropped} baseline")
    assert admin.ok, admin.text
    assert f"replacing {good}" in admin.text and "An admin override of its flags: ACCURACY DROP" in admin.text
    assert store.baseline_for(redis_client, "gpu-1").id == dropped
    assert store.tag_info(redis_client, dropped)["baseline"]["overrides"][0].startswith("ACCURACY DROP")
