"""``/tune``'s grammar and the bot's side: refusals in one sentence that queue nothing, ``dry-run``, pruning,
``/help tune``, the ``[tune.knobs]`` table, and the study's journal on Redis (ask-and-tell, resumed)."""

from __future__ import annotations

import pytest

from bot.dispatch import Dispatcher
from workers.config import SEED_PRESETS_TOML, ConfigError, parse_config
from workers.jobs import queue

CONFIG_TEXT = (
    """
default_host = "gpu-1"
[engine]
flags = { "--tp-size" = 8, "--disable-custom-all-reduce" = true }
[hosts.gpu-1]
[access]
admins = ["root"]
[tune]
max_configs = 64
[tune.knobs.max-running]
flag = "--max-running-requests"
range = [8, 512]
step = 8
[tune.knobs.wide]
flag = "--chunked-prefill-size"
range = [1, 20000]
[presets.spec-a]
description = "needs nextn"
flags = { "--enable-a" = true }
requires = ["nextn"]
[presets.spec-b]
description = "not with mscclpp"
flags = { "--enable-b" = true }
conflicts = ["mscclpp"]
"""
    + SEED_PRESETS_TOML
)
SLO = "slo ttft=2s itl=40ms"


@pytest.fixture
def dispatcher(redis_client, tmp_path):
    redis_client.flushdb()
    return Dispatcher(parse_config(CONFIG_TEXT), redis_client, plots_dir=tmp_path, observe_timeout_s=0.2)


@pytest.mark.parametrize(
    ("line", "names"),
    [
        (f"/tune moe=cutlass,triton wat {SLO}", '"wat" is not a dimension'),
        (f"/tune moe=cutlass,triton {SLO} wat", 'unexpected "wat" in the /tune'),
        (f"/tune {SLO}", "name what to search before slo"),
        (f"/tune max-num-seqs=8..64 {SLO}", "knob an admin declared in [tune.knobs]"),
        (f"/tune wide=1..10000 {SLO}", "10,000 configs, more than this team's limit of 64"),
        ("/tune moe=cutlass,triton slo", '"slo" names p99 limits'),
        ("/tune moe=cutlass,triton", "needs its latency limits"),
        (f"/tune moe=cutlass,nope {SLO}", '"nope" is not a moe preset'),
        (f"/tune max-running=4..64 {SLO}", "outside the range an admin declared for it: 8..512"),
        (f"/tune nextn=on,maybe {SLO}", "a preset is switched, nextn=on,off"),
        (f"/tune moe=cutlass {SLO}", "holds one config"),
        (f"/tune moe=cutlass,triton {SLO} budget=3 time=2h", "not both"),
        (f"/tune moe=cutlass,triton {SLO} objective=speed", "objective=speed: use one of goodput"),
    ],
)
def test_bad_input_is_one_sentence_naming_the_fix_and_queues_nothing(dispatcher, redis_client, line, names):
    reply = dispatcher.handle("alice", "C", line)
    assert not reply.ok and names in reply.text, reply.text
    assert reply.text.count(". ") == 0 or reply.text.count("\n") == 0  # one sentence, one line
    assert queue.list_jobs(redis_client, "gpu-1") == []


def test_dry_run_prints_space_size_pruned_with_why_and_estimate_and_queues_nothing(dispatcher, redis_client):
    reply = dispatcher.handle(
        "alice", "C", f"/tune spec-a=on,off nextn=on,off spec-b=on,off mscclpp=on,off {SLO} budget=4 dry-run"
    )
    assert reply.ok and reply.kind == "tune-dry-run", reply.text
    assert reply.data["size"] == 16
    pruned = reply.data["pruned"]
    # spec-a without nextn (4 of them) and spec-b with mscclpp (4, one overlapping): 7 pruned, 9 kept
    assert len(pruned) == 7 and reply.data["kept"] == 9
    assert any("needs" in p["reason"] and "nextn" in p["reason"] for p in pruned)
    assert any("cannot be combined" in p["reason"] for p in pruned)
    assert "estimated time: about" in reply.text and "pruned spec-a=on" in reply.text
    assert queue.list_jobs(redis_client, "gpu-1") == []


def test_a_knob_range_is_on_the_admins_step_grid(dispatcher):
    reply = dispatcher.handle("alice", "C", f"/tune max-running=64..128 nextn=on,off {SLO} dry-run")
    assert reply.ok, reply.text
    values = reply.data["space"]["dimensions"][0]["values"]
    assert values == list(range(64, 129, 8))
    refused = dispatcher.handle("alice", "C", f"/tune max-running=60,64 {SLO} dry-run")
    assert not refused.ok and "off its step of 8" in refused.text


def test_a_tune_is_queued_with_its_budget_and_help_documents_it(dispatcher, redis_client):
    reply = dispatcher.handle("alice", "C", f"/tune moe=cutlass,triton fp4=cudnn,cutlass {SLO} budget=3 eval n=40")
    assert reply.ok and reply.job_id, reply.text
    [job] = queue.list_jobs(redis_client, "gpu-1")
    assert job.kind == "tune" and "3 trials" in job.summary
    payload = queue.job_payload(redis_client, reply.job_id)
    assert payload["budget"] == 3 and payload["eval"]["n"] == 40
    text = dispatcher.handle("alice", "C", "/help tune").text
    assert "[tune.knobs]" in text and "dry-run" in text and "/tune resume" in text
    assert "/tune" in dispatcher.handle("alice", "C", "/help").text


def test_tune_resume_and_pause_refuse_what_is_not_a_tune(dispatcher):
    assert "there is no tune 99" in dispatcher.handle("alice", "C", "/tune resume 99").text
    assert "takes the tune's id" in dispatcher.handle("alice", "C", "/tune pause x").text


@pytest.mark.parametrize(
    ("table", "why"),
    [
        ('[tune.knobs.x]\nflag = "max"\nrange = [1, 2]', "tune.knobs.x.flag"),
        ('[tune.knobs.x]\nflag = "--max"\nrange = [5]', "give the range as [LOW, HIGH]"),
        ('[tune.knobs.x]\nflag = "--max"\nrange = [1, 2]\ntype = "float"', "not a knob type"),
        ('[tune.knobs.x]\nflag = "--max"\nrange = [1, 2]\ncolour = 1', "unknown key"),
    ],
)
def test_tune_knobs_are_checked_at_load(table, why):
    with pytest.raises(ConfigError, match=why.replace("[", r"\[").replace("]", r"\]")):
        parse_config("[hosts.a]\n" + table)


def test_the_study_journal_on_redis_survives_a_new_process_and_resumes_a_dead_trial(redis_client):
    from workers.tune import study as tune_study
    from workers.tune.space import GROUP, SWITCH, Dimension, TuneSpace, label_of

    redis_client.flushdb()
    space = TuneSpace((Dimension("moe", GROUP, ("cutlass", "triton")), Dimension("nextn", SWITCH, ("on", "off"))))
    first = tune_study.open_study(redis_client, "7", space, 4, "goodput")
    number, params = tune_study.ask(first, space, skip={}, measured={})  # type: ignore[misc]
    tune_study.tell_done(first, number, [1.0])
    _, dead = tune_study.ask(first, space, skip={}, measured={})  # type: ignore[misc]  # its step "dies" here
    again = tune_study.open_study(redis_client, "7", space, 4, "goodput")  # another worker, from Redis only
    assert len(again.trials) == 2
    assert tune_study.fail_stale(again) == [dead]
    _, resumed = tune_study.ask(again, space, skip={}, measured={label_of(params): [1.0]})  # type: ignore[misc]
    assert resumed == dead, "the dead trial's config is asked again"


def test_time_is_a_deadline_every_kept_config_a_candidate_and_dry_run_says_what_fits(dispatcher, redis_client):
    line = f"/tune max-running=64..256 nextn=on,off {SLO} time=2h"
    dry = dispatcher.handle("alice", "C", f"{line} dry-run")
    assert dry.ok and dry.data["kept"] == 50 and dry.data["budget"] == 50, dry.text  # not 2 h / 10 min = 12
    assert "or until time=2.0 h is up" in dry.text and "time=2.0 h fits about" in dry.text
    assert "12 trials at ~10 min each" in dry.data["estimate"]
    reply = dispatcher.handle("alice", "C", line)
    payload = queue.job_payload(redis_client, reply.job_id)
    assert payload["budget"] == 50 and payload["time_s"] == 7200


def test_re_run_of_a_tunes_step_starts_a_new_tune_not_a_second_chain_of_the_old_one(dispatcher, redis_client):
    from dataclasses import replace

    from workers.jobs.payloads import TunePayload, parse_payload

    first = dispatcher.handle("alice", "C", f"/tune moe=cutlass,triton nextn=on,off {SLO} budget=3")
    step = replace(parse_payload(queue.job_payload(redis_client, first.job_id)), tune_id=first.job_id, step=2)
    assert isinstance(step, TunePayload)
    queued = queue.enqueue(
        redis_client, "gpu-1", step.kind, step.to_dict(), user="alice", channel="C", summary="t", job_timeout_s=60
    )
    again = dispatcher.handle_action("bob", "C", "rerun_job", queued.job_id)
    assert again.ok and again.job_id, again.text
    rerun = queue.job_payload(redis_client, again.job_id)
    assert rerun["tune_id"] is None and rerun["step"] == 1 and rerun["user"] == "bob"
    assert queue.job_info(redis_client, again.job_id).summary == "tune moe=cutlass,triton nextn=on,off (3 trials)"


def test_a_cancel_of_a_paused_tune_ends_it_at_once_and_a_resume_is_then_refused(dispatcher, redis_client):
    from workers.tune import state

    record = state.TuneRecord(
        id="41", host="gpu-1", user="alice", channel="C", summary="tune", budget=4, objective="goodput",
        created_at=1.0, status=state.PAUSED,
    )  # fmt: skip
    state.save(redis_client, record)
    reply = dispatcher.handle("alice", "C", "/cancel 41")
    assert reply.ok and "cancelled tune 41 (it was paused)" in reply.text, reply.text  # not "after its trial"
    assert state.require(redis_client, "41").status == state.CANCELLED
    assert "tune 41 is cancelled: start a new /tune" in dispatcher.handle("alice", "C", "/tune resume 41").text
