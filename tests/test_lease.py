"""The host lease: exclusivity, fencing, heartbeat renewal, loss detection, the FIFO line, dead holders."""

from __future__ import annotations

import pickle
import threading
import time

import pytest
import redis

from tests.util import wait_until
from workers.errors import LeaseLostError
from workers.jobs import events, host_state, lease, reaper, waiting_line


def _take(r: redis.Redis, job: str, ttl_s: float = 5.0, **kw: object) -> lease.Lease:
    got = lease.try_acquire(r, "h1", job=job, user="alice", worker="w", ttl_s=ttl_s, **kw)  # type: ignore[arg-type]
    assert isinstance(got, lease.Lease), got
    return got


def test_two_threads_racing_only_one_wins_and_fence_increases(redis_client: redis.Redis, redis_url: str) -> None:
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def race(job: str) -> None:
        client = redis.Redis.from_url(redis_url)
        barrier.wait()
        results[job] = lease.try_acquire(client, "h1", job=job, user=job, worker="w", ttl_s=5)

    threads = [threading.Thread(target=race, args=(j,)) for j in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    winners = [v for v in results.values() if isinstance(v, lease.Lease)]
    assert len(results) == 2 and len(winners) == 1
    first = winners[0]
    holder, ttl_ms = lease.current_holder(redis_client, "h1")  # type: ignore[misc]
    assert holder.job == first.job and holder.fence == first.fence and 0 < ttl_ms <= 5000
    assert first.release()
    assert lease.current_holder(redis_client, "h1") is None
    second = _take(redis_client, "c")
    assert second.fence > first.fence


def test_release_and_renew_need_the_right_token(redis_client: redis.Redis) -> None:
    held = _take(redis_client, "1")
    impostor = lease.Lease(redis_client, "h1", lease.LeaseHolder("bob", "2", "w", 0.0, held.fence))
    assert not impostor.renew() and not impostor.release()
    stale = lease.Lease(redis_client, "h1", lease.LeaseHolder("alice", "1", "w", 0.0, held.fence - 1))
    assert not stale.release()
    assert lease.current_holder(redis_client, "h1") is not None
    assert held.renew() and held.release()


def test_heartbeat_keeps_the_lease_past_its_ttl(redis_client: redis.Redis) -> None:
    held = _take(redis_client, "1", ttl_s=0.4)
    held.start_heartbeat()
    try:
        t0 = time.monotonic()
        wait_until(lambda: time.monotonic() - t0 > 1.2, timeout=5, what="three TTLs to pass")
        current = lease.current_holder(redis_client, "h1")
        assert current is not None and current[0].fence == held.fence
        held.check()
    finally:
        held.release()
    # Without a heartbeat the same lease expires by itself.
    _take(redis_client, "2", ttl_s=0.3)
    wait_until(lambda: lease.current_holder(redis_client, "h1") is None, timeout=5, what="expiry")


def test_deleted_lease_is_detected_as_lost(redis_client: redis.Redis) -> None:
    called = threading.Event()
    held = _take(redis_client, "1", ttl_s=0.6)
    held.start_heartbeat(on_lost=called.set)
    held.check()
    redis_client.delete(lease.lease_key("h1"))
    wait_until(lambda: held.lost, timeout=5, what="the heartbeat to notice")
    # the heartbeat thread marks the lease lost, then calls on_lost: the call may come a moment later
    wait_until(called.is_set, timeout=5, what="on_lost to be called")
    with pytest.raises(LeaseLostError):
        held.check()
    held.release()


def test_fenced_set_refuses_a_stale_fence(redis_client: redis.Redis) -> None:
    old = _take(redis_client, "1", ttl_s=0.3)
    host_state.fenced_set(redis_client, "h1", "server", {"pid": 1}, old.fence)
    assert host_state.host_state(redis_client, "h1") == {"server": '{"pid": 1}'}
    wait_until(lambda: lease.current_holder(redis_client, "h1") is None, timeout=5, what="expiry")
    new = _take(redis_client, "2")
    with pytest.raises(LeaseLostError):
        host_state.fenced_set(redis_client, "h1", "server", "from the paused old holder", old.fence)
    host_state.fenced_set(redis_client, "h1", "server", "mine", new.fence)
    assert host_state.host_state(redis_client, "h1") == {"server": "mine"}
    host_state.fenced_set(redis_client, "h1", "server", None, new.fence)
    assert host_state.host_state(redis_client, "h1") == {}
    new.release()
    with pytest.raises(LeaseLostError):  # nobody holds the host: nobody may write its state
        host_state.fenced_set(redis_client, "h1", "server", "x", new.fence)


def test_line_is_fifo_by_sequence_number(redis_client: redis.Redis) -> None:
    waiting_line.add_waiter(redis_client, "h1", "1", 1)
    waiting_line.add_waiter(redis_client, "h1", "2", 2)
    blocked = lease.try_acquire(redis_client, "h1", job="2", user="bob", seq=2)
    assert blocked == ("waiter", "1")
    outsider = lease.try_acquire(redis_client, "h1", job="99", user="eve")
    assert outsider == ("waiter", "1")
    first = _take(redis_client, "1", seq=1)
    assert waiting_line.waiting_jobs(redis_client, "h1") == ["2"]
    assert lease.try_acquire(redis_client, "h1", job="2", user="bob", seq=2)[0] == "lease"  # type: ignore[index]
    first.release()
    assert _take(redis_client, "2", seq=2).fence == first.fence + 1


def test_dead_waiter_is_skipped_and_out_of_order_queued_job_does_not_block(redis_client: redis.Redis) -> None:
    waiting_line.add_waiter(redis_client, "h1", "1", 1)
    assert waiting_line.mark_dequeued(redis_client, "h1", "1", "w-dead", ttl_s=0.2)
    wait_until(lambda: redis_client.exists("benchbot:lease:h1:waiter:1") == 0, timeout=5, what="waiter expiry")
    # Job 3 is ahead by number but still sits in RQ's list (requeued behind us): do not wait for it.
    waiting_line.add_waiter(redis_client, "h1", "3", 3)
    redis_client.rpush(waiting_line.RQ_QUEUE_KEY_PREFIX + "h1", "3")
    redis_client.hset("rq:job:3", "status", "queued")  # what RQ keeps for a queued job
    held = _take(redis_client, "4", seq=4)
    held.release()
    # The reaper reports the dead waiter once and drops it from the line.
    assert reaper.reap_dead_jobs(redis_client) == ["1"]
    (failed,) = [e for e in events.job_events(redis_client, "1") if e.type == events.FAILED]
    assert "worker died" in failed.data["message"]
    assert waiting_line.waiting_jobs(redis_client, "h1") == ["3"]
    assert reaper.reap_dead_jobs(redis_client) == []
    # Once RQ drops the job outside benchbot (rq empty, ...), the reaper clears its place too.
    redis_client.delete("rq:job:3")
    assert reaper.reap_dead_jobs(redis_client) == ["3"]
    assert waiting_line.waiting_jobs(redis_client, "h1") == []


def test_blocking_acquire_serves_waiters_in_sequence_order(redis_client: redis.Redis, redis_url: str) -> None:
    holder = _take(redis_client, "0")
    order: list[str] = []

    def wait_turn(job: str, seq: int) -> None:
        client = redis.Redis.from_url(redis_url)
        got = lease.acquire(client, "h1", job=job, user="u", seq=seq, ttl_s=2, poll_s=0.02)
        order.append(job)
        got.release()
        client.close()

    late = threading.Thread(target=wait_turn, args=("12", 12))
    late.start()
    wait_until(lambda: waiting_line.waiting_jobs(redis_client, "h1") == ["12"], what="job 12 in line")
    early = threading.Thread(target=wait_turn, args=("11", 11))
    early.start()
    wait_until(lambda: waiting_line.waiting_jobs(redis_client, "h1") == ["11", "12"], what="job 11 in line")
    holder.release()
    late.join(timeout=10)
    early.join(timeout=10)
    assert order == ["11", "12"]
    assert waiting_line.waiting_jobs(redis_client, "h1") == []


def test_expired_holder_is_reported_failed_by_the_next_acquirer(redis_client: redis.Redis) -> None:
    _take(redis_client, "7", ttl_s=0.2)
    wait_until(lambda: lease.current_holder(redis_client, "h1") is None, timeout=5, what="expiry")
    _take(redis_client, "8").release()
    (failed,) = [e for e in events.job_events(redis_client, "7") if e.terminal]
    assert failed.type == "failed"
    assert failed.data["message"] == "worker died: lease expired after 0.2 s without renewal"
    assert reaper.reap_dead_jobs(redis_client) == []  # already reported, and a clean release leaves nothing


def test_reaper_reports_a_dead_holder_when_no_next_job_comes(redis_client: redis.Redis) -> None:
    _take(redis_client, "7", ttl_s=0.2)
    assert reaper.reap_dead_jobs(redis_client) == []  # still alive
    wait_until(lambda: lease.current_holder(redis_client, "h1") is None, timeout=5, what="expiry")
    assert reaper.reap_dead_jobs(redis_client) == ["7"]
    assert events.terminal_type(redis_client, "7") == "failed"
    assert reaper.reap_dead_jobs(redis_client) == []
    # A job that ended properly before its worker vanished is not reported twice.
    events.publish(redis_client, "9", events.SUCCEEDED, {"payload": {}})
    _take(redis_client, "9", ttl_s=0.2)
    wait_until(lambda: lease.current_holder(redis_client, "h1") is None, timeout=5, what="expiry")
    assert reaper.reap_dead_jobs(redis_client) == []


# ---- the fence check with a margin ----------------------------------------------------------------


def test_a_check_refuses_when_the_lease_has_less_than_the_margin_left(redis_client: redis.Redis) -> None:
    held = _take(redis_client, "1", ttl_s=5.0, margin_s=1.0)
    t_before = time.monotonic()
    left = held.checker.verify()
    t_after = time.monotonic()
    assert 4.5 < left <= 5.0
    # The local deadline is t0 + remaining - margin with t0 read before the call; it only moves later, so
    # the deadline from the acquisition itself (a whole TTL from just before it) may still stand.
    assert t_before + left - 1.0 <= held.checker.valid_until <= t_after + 5.0 - 1.0

    redis_client.pexpire(lease.lease_key("h1"), 600)  # still ours, but 0.6 s left is under the 1 s margin
    with pytest.raises(LeaseLostError, match=r"only \d+ ms left, less than the 1 s margin"):
        held.checker.verify()
    assert not held.lost  # not lost: a renewal can bring it back
    assert held.renew()
    assert held.checker.verify() > 4.5
    held.check()
    held.release()


def test_a_check_is_a_clock_comparison_while_its_proof_holds_then_asks_redis(redis_client: redis.Redis) -> None:
    held = _take(redis_client, "1", ttl_s=1.0, margin_s=0.2)
    deadline = held.checker.valid_until
    assert deadline - time.monotonic() <= 0.8
    redis_client.delete(lease.lease_key("h1"))  # only an expiry can end a lease, and none can before the deadline
    held.check()  # no Redis call: the last proof (the grant) still holds
    wait_until(lambda: time.monotonic() >= deadline, timeout=5, what="the proof to run out")
    with pytest.raises(LeaseLostError, match="it expired"):
        held.check()  # now it asks Redis, and the lease is gone
    assert held.lost
    with pytest.raises(LeaseLostError):
        held.check()


def test_a_check_after_someone_else_took_the_host_names_them_and_is_final(redis_client: redis.Redis) -> None:
    old = _take(redis_client, "1", ttl_s=0.3)
    wait_until(lambda: lease.current_holder(redis_client, "h1") is None, timeout=5, what="expiry")
    new = _take(redis_client, "2", ttl_s=5.0)
    with pytest.raises(LeaseLostError, match=r"job 2 \(alice\) holds it now"):
        old.check()
    assert old.lost and not new.lost
    new.check()
    new.release()


def test_each_heartbeat_renewal_moves_the_deadline(redis_client: redis.Redis) -> None:
    held = _take(redis_client, "1", ttl_s=0.6, margin_s=0.1)
    first = held.checker.valid_until
    held.start_heartbeat()
    try:
        wait_until(lambda: held.checker.valid_until > first + 0.1, timeout=5, what="a renewal to move the deadline")
        assert held.checker.valid_until <= time.monotonic() + 0.6 - 0.1
    finally:
        held.release()
    with pytest.raises(LeaseLostError):  # released: no side effect may follow
        held.check()


def test_a_copy_for_another_process_opens_its_own_client_and_keeps_its_proof(redis_client: redis.Redis) -> None:
    held = _take(redis_client, "1", ttl_s=5.0)
    copy = pickle.loads(pickle.dumps(held.checker))
    assert copy.valid_until == held.checker.valid_until and copy.job == "1" and copy.fence == held.fence
    assert copy.verify() > 4.0  # a Redis round trip through the copy's own connection
    held.release()
    with pytest.raises(LeaseLostError, match="it expired"):
        copy.verify()


def test_margin_must_be_below_the_ttl() -> None:
    assert lease.default_margin_s(30.0) == 5.0
    assert lease.check_margin(3.0, 0.5) == 0.5
    for bad in (-0.1, 3.0, 4.0):
        with pytest.raises(ValueError, match="lease margin"):
            lease.check_margin(3.0, bad)


def test_a_lease_takes_a_fence_above_the_hosts_only_when_nobody_was_granted_after_it(
    redis_client: redis.Redis,
) -> None:
    """Issue 25 item 7: a Redis restarted without persistence starts its fences at 1 again, below the
    host's fence file; the holder may move past the host's token, a stale holder may not."""
    redis_client.flushdb()
    held = _take(redis_client, "7")
    assert held.fence == 1
    assert held.refence_above(41) == 42
    assert held.fence == 42 and held.checker.fence == 42
    holder, _ = lease.current_holder(redis_client, "h1")  # type: ignore[misc]
    assert holder.fence == 42 and int(redis_client.get(lease.fence_key("h1"))) == 42
    assert held.checker.verify() > 0 and held.renew()
    host_state.fenced_set(redis_client, "h1", "launched", "x", 42)
    held.release()
    stale = _take(redis_client, "8", ttl_s=0.2)  # fence 43
    wait_until(lambda: not redis_client.exists(lease.lease_key("h1")), timeout=5, what="the lease to expire")
    newer = _take(redis_client, "9")  # fence 44: someone was granted after the stale holder
    assert stale.refence_above(100) is None and newer.fence == 44
    assert int(redis_client.get(lease.fence_key("h1"))) == 44
    redis_client.incr(lease.fence_key("h1"))  # a grant this holder has not seen
    assert newer.refence_above(100) is None
    newer.release()
