"""The fleet's /queue read (two round trips) lists exactly what the per-host reader and the lease see."""

from __future__ import annotations

import dataclasses

import redis

from workers import keys
from workers.jobs import events, lease, presence, queue, queue_view, waiting_line


def _enqueue(r: redis.Redis, host: str, user: str) -> queue.QueuedJob:
    return queue.enqueue(
        r, host, "bench", {"p": 1}, user=user, channel="C1", summary=f"{user} on {host}", job_timeout_s=60
    )


def test_batched_listing_equals_the_per_host_one_in_every_state(redis_client: redis.Redis) -> None:
    hosts = ["h1", "h2", "h3", "empty"]
    for i in range(12):
        _enqueue(redis_client, hosts[i % 3], f"u{i % 4}")
    # h1: its first job holds the host (running), its second was dequeued by a worker (waiting).
    waiting_line.remove_waiter(redis_client, "h1", "1")
    assert isinstance(lease.try_acquire(redis_client, "h1", job="1", user="u0", seq=1), lease.Lease)
    assert waiting_line.mark_dequeued(redis_client, "h1", "4", "w1", ttl_s=30)
    # h2: a waiter whose worker died (liveness gone) and one that ended while still in line.
    redis_client.delete(waiting_line.waiter_prefix("h2") + "2")
    events.publish(redis_client, "5", events.FAILED, {"message": "boom"})
    # h3: the holder's job already ended but its lease has not been released yet.
    waiting_line.remove_waiter(redis_client, "h3", "3")
    assert isinstance(lease.try_acquire(redis_client, "h3", job="3", user="u2", seq=3), lease.Lease)
    events.publish(redis_client, "3", events.SUCCEEDED, {})

    batched = queue_view.list_jobs_many(redis_client, hosts)
    assert batched == {host: queue.list_jobs(redis_client, host) for host in hosts}
    assert [(j.job_id, j.state, j.position) for j in batched["h1"]] == [
        ("1", "running", 1),
        ("4", "waiting", 2),
        ("7", "queued", 3),
        ("10", "queued", 4),
    ]
    assert [j.job_id for j in batched["h2"]] == ["8", "11"]
    assert [j.job_id for j in batched["h3"]] == ["6", "9", "12"]
    assert batched["empty"] == [] and batched["h2"][0].user == "u3" and batched["h2"][0].summary == "u3 on h2"
    assert all(j.to_dict() == dataclasses.asdict(j) for jobs in batched.values() for j in jobs)  # /queue's JSON


def test_the_next_job_listed_is_the_one_the_lease_grants(redis_client: redis.Redis) -> None:
    for i in range(4):
        _enqueue(redis_client, "h1", f"u{i}")
    redis_client.delete(waiting_line.waiter_prefix("h1") + "1")  # dead: the lease skips it, the listing hides it
    for job_id in ("2", "3"):  # two workers took jobs 2 and 3 off RQ's list and wait for the host
        redis_client.lrem(queue.host_queue(redis_client, "h1").key, 0, job_id)
        assert waiting_line.mark_dequeued(redis_client, "h1", job_id, f"w{job_id}", ttl_s=30)
    listed = queue_view.list_jobs_many(redis_client, ["h1"])["h1"]
    assert [(j.job_id, j.state, j.position) for j in listed] == [
        ("2", "waiting", 1),
        ("3", "waiting", 2),
        ("4", "queued", 3),
    ]
    # Anyone but the first listed is refused the free host; the first listed is granted it.
    assert not isinstance(lease.try_acquire(redis_client, "h1", job="3", user="u2", seq=3), lease.Lease)
    assert isinstance(lease.try_acquire(redis_client, "h1", job="2", user="u1", seq=2), lease.Lease)


def test_host_services_batched_equal_one_by_one(redis_client: redis.Redis) -> None:
    presence.record_connect_error(redis_client, "h2", "ssh: host key unknown")
    redis_client.set(keys.observer_alive("h1"), "1", ex=30)
    redis_client.set(keys.observer_alive("h2"), "1", ex=30)
    hosts = ["h1", "h2", "h3"]
    assert presence.host_services(redis_client, hosts) == {h: presence.host_service(redis_client, h) for h in hosts}
    assert presence.host_services(redis_client, hosts)["h2"].connect_error == "ssh: host key unknown"
    assert not presence.host_services(redis_client, hosts)["h3"].served
