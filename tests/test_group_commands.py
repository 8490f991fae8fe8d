"""Groups in commands (issue 38): /status and /queue take a group's name; /launch, /stop, /bench and /eval on one queue
one gang job on its first member only; a sweep on one is refused as not built yet, changing nothing; a member's
/status names its group and the gang job holding it."""

from __future__ import annotations

import pytest

from bot.dispatch import Dispatcher
from workers import keys
from workers.config import SEED_PRESETS_TOML, parse_config
from workers.jobs import gang_lease, queue
from workers.jobs.payloads import parse_payload

CONFIG_TEXT = (
    """
default_host = "gpu-1"
[engine]
flags = { "--tp-size" = 8 }
[hosts.gpu-1]
[hosts.gpu-a]
port = 30001
[hosts.gpu-b]
port = 30002
[groups.big]
hosts = ["gpu-b", "gpu-a"]
port = 5000
description = "two boxes, one model"
[groups.big.engine]
flags = { "--tp-size" = 16 }
"""
    + SEED_PRESETS_TOML
)


@pytest.fixture
def dispatcher(redis_client, tmp_path):
    return Dispatcher(parse_config(CONFIG_TEXT), redis_client, plots_dir=tmp_path, observe_timeout_s=0.2)


def test_status_of_a_group_lists_its_members_and_no_gang(dispatcher) -> None:
    reply = dispatcher.handle("alice", "C1", "/status big")
    assert reply.ok, reply.text
    assert reply.text.startswith("group big: gpu-b, gpu-a (head gpu-b, rendezvous port 5000): two boxes, one model")
    assert "no gang job holds it" in reply.text
    assert [h["host"] for h in reply.data["hosts"]] == ["gpu-a", "gpu-b"]
    assert all(h["group"] == "member of group big (gpu-b, gpu-a)" for h in reply.data["hosts"])
    assert reply.text.count("member of group big (gpu-b, gpu-a)") == 2


def test_a_members_status_names_the_gang_job_holding_it(dispatcher, redis_client) -> None:
    seq = int(redis_client.incr(keys.JOB_SEQ))
    with gang_lease.acquire_gang(redis_client, ["gpu-a", "gpu-b"], job=str(seq), user="carol", seq=seq):
        member = dispatcher.handle("alice", "C1", "/status gpu-a")
        assert (
            f"member of group big (gpu-b, gpu-a); held by gang job #{seq} (@carol) across gpu-a, gpu-b" in member.text
        )
        group = dispatcher.handle("alice", "C1", "/status big")
        assert f"gang job #{seq} (@carol) holds gpu-a, gpu-b" in group.text
    plain = dispatcher.handle("alice", "C1", "/status gpu-1")
    assert "member of group" not in plain.text and plain.data["hosts"][0]["group"] is None


def test_queue_of_a_group_lists_each_member(dispatcher) -> None:
    queued = dispatcher.handle("alice", "C1", "/launch cutlass on gpu-b")
    assert queued.ok, queued.text
    reply = dispatcher.handle("alice", "C1", "/queue big")
    assert reply.ok and list(reply.data["hosts"]) == ["gpu-a", "gpu-b"]
    assert reply.text.startswith("gpu-a: idle, nothing queued") and f"#{queued.job_id}" in reply.text


@pytest.mark.parametrize(
    "line", ["/launch cutlass on big then bench 1,8", "/stop big", "/bench 1,8 on big", "/eval n=10 on big any"]
)
def test_a_job_on_a_group_queues_one_gang_job_on_its_first_member(dispatcher, redis_client, line):
    reply = dispatcher.handle("alice", "C1", line)
    assert reply.ok, reply.text
    assert reply.data["host"] == "big"
    assert [j.job_id for j in queue.list_jobs(redis_client, "gpu-a")] == [reply.job_id]  # sorted first member
    assert not queue.list_jobs(redis_client, "gpu-b") and not queue.list_jobs(redis_client, "gpu-1")
    assert parse_payload(queue.job_payload(redis_client, str(reply.job_id))).host == "big"


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("/sweep cutlass, cudnn bench 1,8 on big", "not built yet (issue 38)"),
        ("/bench 1,8 on", '"on" needs a host name'),
        ("/bench on big", "give the concurrency levels"),
        ("/bench 1,8 on big on gpu-1", '"on HOST" is given twice'),
        ("/eval on big on big", '"on HOST" is given twice'),
    ],
)
def test_bad_group_words_are_refused_changing_nothing(dispatcher, redis_client, line, said) -> None:
    before = set(redis_client.keys("*"))
    reply = dispatcher.handle("alice", "C1", line)
    assert not reply.ok and said in reply.text, reply.text
    assert set(redis_client.keys("*")) == before
    assert all(not queue.list_jobs(redis_client, h) for h in ("gpu-1", "gpu-a", "gpu-b"))


def test_an_unknown_name_where_a_group_is_taken_suggests_the_groups_too(dispatcher) -> None:
    reply = dispatcher.handle("alice", "C1", "/status bigg")
    assert not reply.ok and 'unknown host "bigg"' in reply.text and "big" in reply.text
    assert reply.text.endswith("Hosts: gpu-1, gpu-a, gpu-b; groups: big")
    assert dispatcher.handle("alice", "C1", "/launch cutlass on bigg").text.endswith("gpu-a, gpu-b; groups: big")
    assert dispatcher.handle("alice", "C1", "/bench 1 on bigg").text.endswith("gpu-a, gpu-b; groups: big")
    sweep = dispatcher.handle("alice", "C1", "/sweep cutlass, cudnn bench 1 on bigg")
    assert sweep.text.endswith("Hosts: gpu-1, gpu-a, gpu-b")  # a sweep takes no group yet


@pytest.mark.parametrize("command", ["bench", "eval", "launch"])
def test_help_says_the_command_takes_a_group(dispatcher, command) -> None:
    text = dispatcher.handle("alice", "C1", f"/help {command}").text
    assert "GROUP" in text and f"/{command}" in text and "through its head" in text, text
