"""``/bench ... on GROUP`` and ``/eval ... on GROUP`` on a running gang (issue 38 item 1), end to end: real RQ workers,
real Redis, two simulated hosts that rendezvous. One gang is launched for the module (its workers start once); the
tests run in file order: nothing running first, the rank killed last.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterator

import pytest

from bot.dispatch import Dispatcher
from tests.integration.harness import BenchbotHost
from tests.integration.test_gang_jobs import PAIR_TOML
from tests.util import free_port, wait_until
from workers.jobs import events, lease, queue
from workers.results import store

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def gang(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BenchbotHost]:
    with BenchbotHost(
        redis_url,
        tmp_path_factory.mktemp("gangbench"),
        workers=1,
        more_hosts={"pair-a": "", "pair-b": ""},
        extra_toml=PAIR_TOML.format(port=free_port()),
        sim_startup_s=0.5,
        launch_timeout_s=40,
        lease_ttl_s=10,
    ) as h:
        yield h


@pytest.fixture(scope="module")
def launched(gang: BenchbotHost) -> str:
    """The gang launched once (no bench): its job id."""
    terminal, _ = gang.launch_ok("alice", "/launch nextn on pair", timeout=150)
    return str(terminal.job)


def _hold(h: BenchbotHost, host: str) -> lease.Lease:
    """``host``'s lease for the test (once the job before has given it back)."""
    held: list[lease.Lease] = []

    def took() -> bool:
        got = lease.try_acquire(h.r, host, job="0", user="carol", ttl_s=120)
        if isinstance(got, lease.Lease):
            held.append(got)
        return bool(held)

    wait_until(took, timeout=30, what=f"{host}'s lease for the test")
    return held[0]


def _bench_phases(h: BenchbotHost, job_id: str) -> list[str]:
    return [str(e.data.get("phase")) for e in events.job_events(h.r, job_id) if e.type == events.PROGRESS]


def test_a_bench_on_a_group_with_no_gang_running_is_refused_and_touches_nothing(gang: BenchbotHost) -> None:
    h = gang
    terminal, _ = h.wait(h.run("alice", "/bench 1,8 on pair any").job_id or "", timeout=60)
    assert terminal.type == events.FAILED, terminal.data
    assert "no gang runs on pair: its head pair-a runs nothing" in terminal.data["message"], terminal.data
    assert "bench" not in _bench_phases(h, str(terminal.job)) and not store.list_runs(h.r, 100)
    assert h.engine_pids("pair-a") == [] and h.engine_pids("pair-b") == []


def test_a_bench_on_a_running_gang_waits_for_every_member_and_measures_through_the_head(
    gang: BenchbotHost, launched: str
) -> None:
    h = gang
    blocker = _hold(h, "pair-b")  # a member is busy
    try:
        reply = h.run("alice", "/bench 1,8 n=16 out=32 on pair")
        assert reply.ok and reply.job_id and reply.data["host"] == "pair", reply.text
        assert [j.job_id for j in queue.list_jobs(h.r, "pair-a")] == [reply.job_id]  # one job, the first member's line
        wait_until(
            lambda: any(
                "waiting for pair-b (member of pair)" in str(e.data.get("message"))
                for e in events.job_events(h.r, reply.job_id)
            ),
            timeout=60,
            what="the gang bench to wait for pair-b's lease",
        )
        assert "bench" not in _bench_phases(h, reply.job_id)  # nothing measured while one member is not held
    finally:
        blocker.release()
    terminal, _ = h.wait(reply.job_id, timeout=120)
    assert terminal.type == events.SUCCEEDED, (terminal.data, h.worker_logs())
    assert terminal.data["valid"] is True, terminal.data
    run = store.get_run(h.r, terminal.data["run_id"])
    assert run.host == "pair-a" and [level["concurrency"] for level in run.levels] == [1, 8]  # through the head
    assert run.config["launched_by"]["job"] == launched and run.config["server"]["args"]["tp_size"] == 16
    members = run.extra["gang"]["members"]
    assert run.extra["gang"]["group"] == "pair" and [(m["rank"], m["host"]) for m in members] == [
        (0, "pair-a"),
        (1, "pair-b"),
    ]
    assert all(m["fingerprint"]["gpu_count"] == 8 for m in members), members
    for level in run.levels:  # power and J/token summed over both members, as for a gang launch's bench
        tel = level["telemetry"]
        assert [m["host"] for m in tel["members"]] == ["pair-a", "pair-b"], tel
        summed = sum(m["total"]["power_w"]["mean"] for m in tel["members"])
        assert tel["total"]["power_w"]["mean"] == pytest.approx(summed, abs=0.01), tel["total"]
        assert tel["j_per_tok"] == pytest.approx(tel["energy_j"] / level["output_tokens"], rel=1e-3)
    assert terminal.data["table"].strip(), terminal.data  # the result table, as any bench's


def test_an_eval_on_a_running_gang_asks_the_head(gang: BenchbotHost, launched: str) -> None:
    terminal, _ = gang.launch_ok("alice", "/eval n=20 on pair", timeout=120)
    run = store.get_run(gang.r, terminal.data["run_id"])
    assert run.host == "pair-a" and run.config["launched_by"]["job"] == launched
    assert "accuracy" in terminal.data["summary"], terminal.data
    assert [m["host"] for m in run.extra["gang"]["members"]] == ["pair-a", "pair-b"]


@pytest.mark.parametrize("line", ["/bench 1,8", "/eval", "/bench 1 on pair-a"])
def test_benching_one_member_of_a_running_gang_is_refused_naming_the_gang(
    gang: BenchbotHost, launched: str, line: str
) -> None:
    on_member = Dispatcher(dataclasses.replace(gang.config, default_host="pair-b"), gang.r, plots_dir=gang.work)
    before = {h: queue.list_jobs(gang.r, h) for h in ("pair-a", "pair-b")}
    reply = on_member.handle("alice", "C1", line)
    assert not reply.ok
    member, rank = ("pair-a", 0) if "pair-a" in line else ("pair-b", 1)
    assert f"{member} is rank {rank} of the gang job #{launched} runs on pair" in reply.text, reply.text
    assert "... on pair" in reply.text
    assert {h: queue.list_jobs(gang.r, h) for h in ("pair-a", "pair-b")} == before


def test_a_bench_on_a_gang_whose_rank_died_is_refused_naming_the_rank(gang: BenchbotHost, launched: str) -> None:
    h = gang
    runs = len(store.list_runs(h.r, 100))
    (victim,) = h.engine_pids("pair-b")
    os.kill(victim, signal.SIGKILL)  # the fault: rank 1 dies (the test's own simulated engine)
    wait_until(lambda: h.engine_pids("pair-b") == [], timeout=30, what="rank 1 to be gone")
    terminal, _ = h.wait(h.run("alice", "/bench 1,8 on pair any").job_id or "", timeout=90)
    assert terminal.type == events.FAILED, terminal.data
    message = terminal.data["message"]
    assert "the gang on pair" in message and "rank 1 on pair-b is not running" in message, message
    assert "bench" not in _bench_phases(h, str(terminal.job)) and len(store.list_runs(h.r, 100)) == runs
    assert len(h.engine_pids("pair-a")) == 1  # this job started nothing, so it stopped nothing
