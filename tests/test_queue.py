"""Per-host queues: enqueue, positions, listing, per-user limits and cancelling queued jobs."""

from __future__ import annotations

import pytest
import redis
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from workers.errors import BenchbotError
from workers.jobs import events, lease, queue, waiting_line


def _enqueue(r: redis.Redis, user: str = "alice", host: str = "h1", **kw: object) -> queue.QueuedJob:
    args: dict[str, object] = {"user": user, "channel": "C1", "summary": f"bench for {user}", "job_timeout_s": 900}
    args.update(kw)
    return queue.enqueue(r, host, "bench", {"preset": "baseline"}, **args)  # type: ignore[arg-type]


def test_enqueue_gives_short_ids_positions_and_a_queued_event(redis_client: redis.Redis) -> None:
    first = _enqueue(redis_client)
    second = _enqueue(redis_client, user="bob")
    assert (first.job_id, first.seq, first.position, first.ahead) == ("1", 1, 1, 0)
    assert (second.job_id, second.position, second.ahead) == ("2", 2, 1)
    (queued,) = events.job_events(redis_client, "2")
    assert queued.type == "queued" and queued.data["position"] == 2 and queued.data["ahead"] == 1
    assert queued.data["user"] == "bob" and queued.data["host"] == "h1"

    job = Job.fetch("1", connection=redis_client, serializer=JSONSerializer)
    assert job.func_name == "workers.jobs.runner.execute" and list(job.args) == [{"preset": "baseline"}]
    assert job.timeout == 900  # never RQ's 180 s default
    assert job.origin == "benchbot-h1"
    assert {k: job.meta[k] for k in ("user", "channel", "kind", "summary", "host", "seq")} == {
        "user": "alice",
        "channel": "C1",
        "kind": "bench",
        "summary": "bench for alice",
        "host": "h1",
        "seq": 1,
    }
    assert isinstance(job.meta["enqueued_at"], float)


def test_queue_name_matches_the_key_the_lease_line_checks(redis_client: redis.Redis) -> None:
    assert queue.host_queue(redis_client, "h1").key == waiting_line.RQ_QUEUE_KEY_PREFIX + "h1"


def test_list_jobs_shows_owner_summary_state_and_position(redis_client: redis.Redis) -> None:
    _enqueue(redis_client, user="alice")
    _enqueue(redis_client, user="bob")
    _enqueue(redis_client, user="carol", host="h2")
    listed = queue.list_jobs(redis_client, "h1")
    assert [(j.job_id, j.user, j.summary, j.state, j.position) for j in listed] == [
        ("1", "alice", "bench for alice", "queued", 1),
        ("2", "bob", "bench for bob", "queued", 2),
    ]
    # Once job 1 holds the host it is listed as running, first.
    waiting_line.remove_waiter(redis_client, "h1", "1")
    held = lease.try_acquire(redis_client, "h1", job="1", user="alice", seq=1)
    assert isinstance(held, lease.Lease)
    assert [(j.job_id, j.state) for j in queue.list_jobs(redis_client, "h1")] == [("1", "running"), ("2", "queued")]
    info = queue.job_info(redis_client, "2")
    assert info is not None and info.state == "queued" and info.position == 2 and info.host == "h1"
    held.release()


def test_bad_requests_are_refused_and_change_nothing(redis_client: redis.Redis) -> None:
    with pytest.raises(BenchbotError, match="not a valid host"):
        _enqueue(redis_client, host="h1; rm -rf /")
    with pytest.raises(BenchbotError, match="timeout"):
        _enqueue(redis_client, job_timeout_s=0)
    assert redis_client.get(queue.SEQ_KEY) is None
    assert queue.job_info(redis_client, "1") is None
    assert queue.job_info(redis_client, "not-a-number") is None


def test_per_user_limit_counts_queued_jobs_across_hosts(redis_client: redis.Redis) -> None:
    _enqueue(redis_client, host="h1", max_queued_per_user=2)
    _enqueue(redis_client, host="h2", max_queued_per_user=2)
    _enqueue(redis_client, user="bob", max_queued_per_user=2)
    before = {key: redis_client.llen(key) for key in ("rq:queue:benchbot-h1", "rq:queue:benchbot-h2")}
    with pytest.raises(BenchbotError, match="already have 2 job"):
        _enqueue(redis_client, host="h1", max_queued_per_user=2)
    assert {key: redis_client.llen(key) for key in before} == before
    assert int(redis_client.get(queue.SEQ_KEY)) == 3
    assert events.job_events(redis_client, "4") == []
    # Someone else is not affected, and a job that starts frees a slot.
    _enqueue(redis_client, user="bob", max_queued_per_user=2)
    waiting_line.mark_dequeued(redis_client, "h1", "1", "w", ttl_s=30)
    assert _enqueue(redis_client, host="h1", max_queued_per_user=2).job_id == "5"


def test_cancel_queued_job_owner_other_and_admin(redis_client: redis.Redis) -> None:
    _enqueue(redis_client, user="alice")
    _enqueue(redis_client, user="alice")
    with pytest.raises(BenchbotError, match="belongs to alice"):
        queue.cancel(redis_client, "1", by="bob", is_admin=False)
    assert queue.host_queue(redis_client, "h1").job_ids == ["1", "2"]
    assert not events.is_terminal(redis_client, "1")

    message = queue.cancel(redis_client, "1", by="alice")
    assert "cancelled job 1" in message
    assert queue.host_queue(redis_client, "h1").job_ids == ["2"]
    assert Job.fetch("1", connection=redis_client, serializer=JSONSerializer).get_status() == JobStatus.CANCELED
    last = events.job_events(redis_client, "1")[-1]
    assert last.type == "cancelled" and last.data["by"] == "alice"
    assert [j.job_id for j in queue.list_jobs(redis_client, "h1")] == ["2"]
    assert "already ended" in queue.cancel(redis_client, "1", by="alice")

    assert "cancelled job 2" in queue.cancel(redis_client, "2", by="root", is_admin=True)
    assert events.job_events(redis_client, "2")[-1].data["by"] == "root"
    assert queue.list_jobs(redis_client, "h1") == []
    with pytest.raises(BenchbotError, match="no job 42"):
        queue.cancel(redis_client, "42", by="alice")


def test_cancel_started_job_sets_the_cooperative_flag(redis_client: redis.Redis) -> None:
    _enqueue(redis_client, user="alice")
    # What a worker does when it takes the job: out of RQ's list, place in line kept alive.
    redis_client.lpop("rq:queue:benchbot-h1")
    waiting_line.mark_dequeued(redis_client, "h1", "1", "w", ttl_s=30)
    assert queue.job_info(redis_client, "1").state == "waiting"  # type: ignore[union-attr]
    with pytest.raises(BenchbotError):
        queue.cancel(redis_client, "1", by="bob")
    assert queue.cancel_requested_by(redis_client, "1") is None
    assert "asked job 1 to stop" in queue.cancel(redis_client, "1", by="alice")
    assert queue.cancel_requested_by(redis_client, "1") == "alice"
    assert not events.is_terminal(redis_client, "1")  # the job itself reports how it ended


def test_per_user_limit_frees_a_slot_when_a_job_starts_or_is_cancelled(redis_client: redis.Redis) -> None:
    first = _enqueue(redis_client, max_queued_per_user=2)
    second = _enqueue(redis_client, host="h2", max_queued_per_user=2)
    with pytest.raises(BenchbotError, match="limit 2"):
        _enqueue(redis_client, max_queued_per_user=2)
    assert waiting_line.mark_dequeued(redis_client, "h1", first.job_id, "w1", ttl_s=30)  # a worker took it
    third = _enqueue(redis_client, max_queued_per_user=2)
    with pytest.raises(BenchbotError, match="limit 2"):
        _enqueue(redis_client, max_queued_per_user=2)
    queue.cancel(redis_client, second.job_id, by="alice")
    assert _enqueue(redis_client, max_queued_per_user=2).seq == third.seq + 1


def test_cancel_of_an_ended_job_says_it_ended_whoever_asks_and_sets_no_flag(redis_client: redis.Redis) -> None:
    _enqueue(redis_client, user="alice")
    redis_client.lpop("rq:queue:benchbot-h1")  # a worker took it ...
    events.publish(redis_client, "1", events.SUCCEEDED, {})  # ... and it finished long ago
    for who, admin in (("bob", False), ("alice", False), ("root", True)):
        message = queue.cancel(redis_client, "1", by=who, is_admin=admin)
        assert message == "job 1 already ended (succeeded); nothing to cancel"
    assert queue.cancel_requested_by(redis_client, "1") is None


def test_a_decoding_client_enqueues_lists_cancels_and_rq_still_gets_bytes(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """The bot holds a decoding client; RQ, which stores compressed job data, is handed a bytes one."""
    text = redis.Redis.from_url(redis_url, decode_responses=True)
    first = _enqueue(text, user="alice")
    _enqueue(text, user="bob")
    assert queue.host_queue(text, "h1").connection.get_encoder().decode_responses is False
    assert [(j.job_id, j.user, j.state) for j in queue.list_jobs(text, "h1")] == [
        ("1", "alice", "queued"),
        ("2", "bob", "queued"),
    ]
    assert queue.job_payload(text, first.job_id) == {"preset": "baseline"}
    assert "cancelled job 1" in queue.cancel(text, "1", by="alice")
    assert queue.job_info(text, "1").state == "cancelled"  # type: ignore[union-attr]
    assert Job.fetch("1", connection=redis_client, serializer=JSONSerializer).get_status() == JobStatus.CANCELED
    text.lpop("rq:queue:benchbot-h1")  # a worker took job 2
    assert "asked job 2 to stop" in queue.cancel(text, "2", by="bob")
    assert queue.cancel_requested_by(text, "2") == "bob"
    assert "already ended (cancelled)" in queue.cancel(text, "1", by="alice")
