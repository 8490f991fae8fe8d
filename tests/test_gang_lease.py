"""The gang lease (issue 38 item 2): all members or none, one global order, no deadlock, no starvation, one fence story.

The race runs real processes on a real Redis: two gangs that share a host ({a,b} and {b,c}, and {c,a} closing the
circle) and one-host jobs on a, b and c, each taking its lease round after round; every critical section is
recorded as (start, end, host, fence) and checked afterwards: per host no two overlap and the fences only grow.
Taken in the order given instead of sorted, the three gangs deadlock in every run (checked by hand: the race then
fails with every racer still waiting). The ordering tests use threads (a waiter each) to pin down who goes first
when a gang waits behind a busy member.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import pickle
import random
import threading
import time
from collections.abc import Callable

import pytest
import redis

from tests.util import wait_until
from workers import keys
from workers.errors import BenchbotError, LeaseLostError
from workers.jobs import gang_lease, lease, waiting_line

SECTIONS_KEY = "test:gang:sections"
READY_KEY = "test:gang:ready"
RACE_ROUNDS = 4
RACE_DEADLINE_S = 40.0
SPAWN_DEADLINE_S = 60.0
TTL_S = 2.0


def _seq(r: redis.Redis) -> int:
    """The job's place in every line: the global sequence number, as enqueue gives it."""
    return int(r.incr(keys.JOB_SEQ))


def _record(r: redis.Redis, job: str, hosts: list[str], check: Callable[[str], None], fences: dict[str, int]) -> None:
    """The critical section: a fence check per member, then the side effect (an occupancy count per host:
    anything but 1 is two holders at once), recorded with its start, end and fence."""
    for host in hosts:
        check(host)
    start = time.time()
    occupancy = [int(r.incr(f"test:gang:busy:{host}")) for host in hosts]
    time.sleep(random.uniform(0.002, 0.015))  # the work itself, not synchronisation
    for host in hosts:
        check(host)
        r.decr(f"test:gang:busy:{host}")
    end = time.time()
    for host, busy in zip(hosts, occupancy, strict=True):
        r.rpush(
            SECTIONS_KEY,
            json.dumps({"job": job, "host": host, "start": start, "end": end, "fence": fences[host], "busy": busy}),
        )


def _racer(redis_url: str, name: str, hosts: list[str], rounds: int) -> None:
    """One process: ``rounds`` jobs in turn, each a gang of ``hosts`` (two or more) or a one-host job."""
    r = redis.Redis.from_url(redis_url)
    r.incr(READY_KEY)  # start together (spawning takes a while): the rounds then really overlap
    deadline = time.monotonic() + RACE_DEADLINE_S
    while int(r.get(READY_KEY) or 0) < len(RACERS) and time.monotonic() < deadline:
        time.sleep(0.005)
    for n in range(rounds):
        job, seq = f"{name}.{n}", _seq(r)
        if len(hosts) > 1:
            with gang_lease.acquire_gang(
                r, hosts, job=job, user=name, seq=seq, ttl_s=TTL_S, poll_s=0.005, timeout_s=RACE_DEADLINE_S
            ) as gang:
                _record(r, job, hosts, gang.check, gang.fences)
        else:
            held = lease.acquire(r, hosts[0], job=job, user=name, seq=seq, ttl_s=TTL_S, poll_s=0.005, timeout_s=30)
            with held:
                _record(r, job, hosts, lambda _host, one=held: one.check(), {hosts[0]: held.fence})


#: Two gangs sharing b, as the issue asks, and a third closing the circle a-b-c: taken in the order given (a then
#: b, b then c, c then a) these three deadlock at once, each holding one host the next waits for.
RACERS = {
    "gang-ab": ["a", "b"],
    "gang-bc": ["b", "c"],
    "gang-ca": ["c", "a"],
    "one-a": ["a"],
    "one-b": ["b"],
    "one-b2": ["b"],
    "one-c": ["c"],
}


def test_two_overlapping_gangs_and_one_host_jobs_all_finish_without_overlap(redis_client, redis_url) -> None:
    spawn = multiprocessing.get_context("spawn")
    procs = [spawn.Process(target=_racer, args=(redis_url, name, hosts, RACE_ROUNDS)) for name, hosts in RACERS.items()]
    for proc in procs:
        proc.start()
    try:
        # The race's bound starts once every racer is up: spawning seven interpreters on a loaded box is not the race.
        wait_until(
            lambda: int(redis_client.get(READY_KEY) or 0) >= len(RACERS) or any(not p.is_alive() for p in procs),
            timeout=SPAWN_DEADLINE_S,
            interval=0.05,
            what="every racer to start",
        )
        deadline = time.monotonic() + RACE_DEADLINE_S
        for proc in procs:
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
        stuck = [name for name, proc in zip(RACERS, procs, strict=True) if proc.is_alive()]
        assert not stuck, f"deadlock or starvation: {stuck} still waiting after {RACE_DEADLINE_S:g} s"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    assert [proc.exitcode for proc in procs] == [0] * len(procs)
    sections = [json.loads(raw) for raw in redis_client.lrange(SECTIONS_KEY, 0, -1)]
    # No starvation: every job of every racer ran (a gang's section once per member).
    assert len(sections) == RACE_ROUNDS * sum(len(hosts) for hosts in RACERS.values())
    assert {s["job"] for s in sections} == {f"{name}.{n}" for name in RACERS for n in range(RACE_ROUNDS)}
    for host in ("a", "b", "c"):
        mine = sorted((s for s in sections if s["host"] == host), key=lambda s: s["start"])
        assert all(s["busy"] == 1 for s in mine), f"two holders of {host} at once"
        for before, after in itertools.pairwise(mine):
            assert before["end"] <= after["start"], f"{host}: {before} overlaps {after}"
            assert before["fence"] < after["fence"], f"{host}: fence did not grow from {before} to {after}"
    # Each gang held its members together: one fence per member, the same start.
    for name, hosts in RACERS.items():
        if len(hosts) > 1:
            for n in range(RACE_ROUNDS):
                mine = [s for s in sections if s["job"] == f"{name}.{n}"]
                assert sorted(s["host"] for s in mine) == sorted(hosts) and len({s["start"] for s in mine}) == 1


# ---- who goes first when a gang waits (threads on one Redis) ---------------------------------------------------


class Waiter:
    """A job waiting for its lease(s) on a thread: ``got`` is set once it holds everything it asked for."""

    def __init__(self, r: redis.Redis, redis_url: str, job: str, hosts: list[str], **kw: object) -> None:
        self.job, self.hosts, self.seq = job, hosts, _seq(r)
        self.held: gang_lease.GangLease | lease.Lease | None = None
        self.error: BaseException | None = None
        self.got = threading.Event()
        self.stop = threading.Event()
        self._client = redis.Redis.from_url(redis_url)
        self._kw = kw
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _abort(self) -> None:
        if self.stop.is_set():
            raise BenchbotError("cancelled")

    def _run(self) -> None:
        try:
            common = {"job": self.job, "user": self.job, "worker": f"w-{self.job}", "seq": self.seq}
            if len(self.hosts) > 1:
                self.held = gang_lease.acquire_gang(
                    self._client, self.hosts, ttl_s=TTL_S, poll_s=0.01, abort=self._abort, **common, **self._kw
                )
            else:
                self.held = lease.acquire(
                    self._client, self.hosts[0], ttl_s=TTL_S, poll_s=0.01, abort=self._abort, **common
                )
                self.held.start_heartbeat()
            self.got.set()
        except BaseException as exc:
            self.error = exc

    def in_line(self, r: redis.Redis, host: str) -> bool:
        return self.job in waiting_line.waiting_jobs(r, host)

    def release(self) -> None:
        assert self.held is not None
        self.held.release()

    def join(self) -> None:
        self._thread.join(10)


def _holder(r: redis.Redis, host: str) -> str | None:
    held = lease.current_holder(r, host)
    return held[0].job if held is not None else None


@pytest.fixture
def waiters(redis_client, redis_url):
    made: list[Waiter] = []

    def make(job: str, hosts: list[str], **kw: object) -> Waiter:
        made.append(Waiter(redis_client, redis_url, job, hosts, **kw))
        return made[-1]

    yield make
    for waiter in made:
        waiter.stop.set()
        waiter.join()
        if waiter.held is not None:
            waiter.held.release()


def test_a_gang_waiting_for_its_first_member_leaves_the_second_members_line_alone(redis_client, waiters) -> None:
    busy_a = waiters("busy-a", ["a"])
    wait_until(busy_a.got.is_set, what="busy-a holds a")
    gang = waiters("gang", ["a", "b"])
    wait_until(lambda: gang.in_line(redis_client, "a"), what="the gang waits in a's line")
    assert not gang.in_line(redis_client, "b"), "a gang joins a later member's line only once it holds the earlier"
    later_b = waiters("later-b", ["b"])  # enqueued after the gang, and b is free: it must not wait for a
    wait_until(later_b.got.is_set, timeout=5, what="a one-host job on b runs while the gang waits for a")
    assert _holder(redis_client, "a") == "busy-a" and not gang.got.is_set()
    later_b.release()
    busy_a.release()
    wait_until(gang.got.is_set, what="the gang, once a is free")
    assert _holder(redis_client, "a") == _holder(redis_client, "b") == "gang"


def test_a_gang_holding_its_first_member_keeps_its_turn_on_the_next(redis_client, waiters) -> None:
    busy_b = waiters("busy-b", ["b"])
    wait_until(busy_b.got.is_set, what="busy-b holds b")
    earlier_b = waiters("earlier-b", ["b"])  # ahead of the gang in b's line
    wait_until(lambda: earlier_b.in_line(redis_client, "b"), what="earlier-b waits for b")
    gang = waiters("gang", ["b", "a"])
    wait_until(lambda: _holder(redis_client, "a") == "gang", what="the gang takes a, its first member")
    wait_until(lambda: gang.in_line(redis_client, "b"), what="and waits in b's line")
    later_b, later_a = waiters("later-b", ["b"]), waiters("later-a", ["a"])
    wait_until(lambda: later_b.in_line(redis_client, "b") and later_a.in_line(redis_client, "a"), what="both wait")
    assert waiting_line.waiting_jobs(redis_client, "b") == ["earlier-b", "gang", "later-b"]

    busy_b.release()
    wait_until(earlier_b.got.is_set, what="the job ahead of the gang on b goes first")
    assert not gang.got.is_set()
    earlier_b.release()
    wait_until(gang.got.is_set, what="then the gang, before anything enqueued after it")
    assert not later_b.got.is_set() and not later_a.got.is_set()
    assert _holder(redis_client, "b") == "gang"
    gang.release()
    wait_until(lambda: later_a.got.is_set() and later_b.got.is_set(), what="after the gang's own turn, the rest")
    assert gang.held.release() == {"a": False, "b": False}  # type: ignore[union-attr]  # released once only


def test_a_cancelled_gang_gives_back_what_it_held_and_leaves_every_line(redis_client, waiters) -> None:
    busy_b = waiters("busy-b", ["b"])
    wait_until(busy_b.got.is_set, what="busy-b holds b")
    gang = waiters("gang", ["a", "b"])
    wait_until(lambda: gang.in_line(redis_client, "b") and _holder(redis_client, "a") == "gang", what="gang half held")
    gang.stop.set()
    gang.join()
    assert isinstance(gang.error, BenchbotError) and gang.held is None
    assert _holder(redis_client, "a") is None and not gang.in_line(redis_client, "b")
    assert _holder(redis_client, "b") == "busy-b"


def test_a_gang_gives_up_after_its_timeout_holding_nothing(redis_client, waiters) -> None:
    busy_b = waiters("busy-b", ["b"])
    wait_until(busy_b.got.is_set, what="busy-b holds b")
    gang = waiters("gang", ["a", "b"], timeout_s=0.5)
    gang.join()
    assert isinstance(gang.error, BenchbotError) and "gave up waiting for host b" in str(gang.error)
    assert _holder(redis_client, "a") is None and not gang.in_line(redis_client, "b")


def _gang(r: redis.Redis, ttl_s: float = TTL_S) -> gang_lease.GangLease:
    return gang_lease.acquire_gang(r, ["b", "a"], job="17", user="alice", worker="w", seq=_seq(r), ttl_s=ttl_s)


def test_the_members_leases_name_the_gang_and_its_checks_pass_while_all_are_held(redis_client) -> None:
    with _gang(redis_client) as gang:
        assert gang.hosts == ("a", "b") and gang.complete
        for host in gang.hosts:
            holder = lease.current_holder(redis_client, host)
            assert holder is not None and holder[0].job == "17" and holder[0].gang == ("a", "b")
        assert gang.fences == {h: lease.current_holder(redis_client, h)[0].fence for h in gang.hosts}  # type: ignore[index]
        gang.check("a")
        gang.check("b")
        gang.check_all()
        copy = pickle.loads(pickle.dumps(gang.checker("b")))  # as a bench shard in another process gets it
        copy.check()
        assert copy.fence == gang.fences["b"] and copy.deadline() > time.monotonic()
    assert all(lease.current_holder(redis_client, h) is None for h in ("a", "b"))


def test_an_error_inside_the_gang_releases_every_member(redis_client) -> None:
    with pytest.raises(RuntimeError, match="rank died"), _gang(redis_client) as gang:
        assert gang.complete
        raise RuntimeError("rank died")
    assert all(lease.current_holder(redis_client, h) is None for h in ("a", "b"))
    assert gang.lost  # its checks refuse from now on: each member's check was marked released
    with pytest.raises(LeaseLostError, match="released"):
        gang.check("b")


def test_a_member_taken_over_fails_the_next_check_on_every_member(redis_client) -> None:
    gang = _gang(redis_client, ttl_s=1.0)
    try:
        gang.leases["b"].stop_heartbeat()  # b's worker stalls; its lease expires and another job takes b
        thief = lease.acquire(redis_client, "b", job="18", user="bob", worker="w2", ttl_s=5, timeout_s=5)
        with pytest.raises(LeaseLostError, match=r"lost the lease on b, a member of this gang \(a, b\).*job 18"):
            gang.check("a")  # a itself is still ours: the gang stops anyway
        with pytest.raises(LeaseLostError):
            gang.check_all()
        thief.release()
    finally:
        gang.release()


def test_a_member_lost_to_its_heartbeat_marks_the_whole_gang_lost(redis_client) -> None:
    gang = _gang(redis_client, ttl_s=0.6)
    try:
        lost: list[str] = []
        gang.on_lost(lost.append)
        assert lease.release_job(redis_client, "b", "17")  # a hard stop took b from under the gang
        wait_until(lambda: gang.lost and lost, timeout=5, what="b's heartbeat notices")
        assert lost == ["b"]
        with pytest.raises(LeaseLostError, match="the gang's lease on b was lost"):
            gang.check("a")  # no Redis round trip needed: a's own check was marked
    finally:
        gang.release()


@pytest.mark.parametrize(("hosts", "problem"), [(["a"], "at least two hosts"), (["a", "b", "a"], "each host once")])
def test_a_gang_is_two_or_more_distinct_hosts(redis_client, hosts: list[str], problem: str) -> None:
    with pytest.raises(BenchbotError, match=problem):
        gang_lease.acquire_gang(redis_client, hosts, job="1", user="alice")
    assert redis_client.keys("benchbot:lease:*") == []
