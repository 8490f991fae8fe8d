"""Job events: both streams, order, one terminal event, follow, and the notifier's consumer group."""

from __future__ import annotations

import json
import threading

import pytest
import redis

from workers.jobs import events


def test_event_goes_to_global_and_job_stream_as_versioned_json(redis_client: redis.Redis) -> None:
    ev = events.publish(redis_client, "5", events.QUEUED, {"position": 1, "ahead": 0})
    assert ev is not None and ev.id
    ((_, fields),) = redis_client.xrange(events.GLOBAL_STREAM)
    body = json.loads(fields[b"event"])
    assert body["schema"] == 1 and body["job"] == "5" and body["type"] == "queued"
    assert body["data"] == {"position": 1, "ahead": 0} and isinstance(body["ts"], float)
    assert redis_client.xlen(events.job_stream("5")) == 1


def test_job_events_keep_order_and_exactly_one_terminal(redis_client: redis.Redis) -> None:
    events.publish(redis_client, "1", events.QUEUED, {"position": 1, "ahead": 0})
    events.publish(redis_client, "1", events.STARTED, {"worker": "w", "fence": 3})
    events.publish(redis_client, "1", events.PROGRESS, {"phase": "launch", "message": "go"})
    assert not events.is_terminal(redis_client, "1")
    assert events.publish(redis_client, "1", events.SUCCEEDED, {"payload": {"ok": 1}}) is not None
    # A late report (e.g. the reaper) and a late progress line are both refused.
    assert events.publish(redis_client, "1", events.FAILED, {"message": "worker died"}) is None
    assert events.publish(redis_client, "1", events.PROGRESS, {"phase": "x", "message": "late"}) is None
    types = [e.type for e in events.job_events(redis_client, "1")]
    assert types == ["queued", "started", "progress", "succeeded"]
    assert events.is_terminal(redis_client, "1")
    assert events.terminal_type(redis_client, "1") == "succeeded"
    assert redis_client.xlen(events.GLOBAL_STREAM) == 4


def test_unknown_event_type_is_rejected(redis_client: redis.Redis) -> None:
    with pytest.raises(ValueError):
        events.publish(redis_client, "1", "exploded", {})


def test_follow_yields_live_events_and_ends_after_terminal(redis_client: redis.Redis, redis_url: str) -> None:
    first = events.publish(redis_client, "2", events.QUEUED, {"position": 1, "ahead": 0})
    assert first is not None
    seen: list[str] = []
    follower = redis.Redis.from_url(redis_url)

    def read() -> None:
        seen.extend(e.type for e in events.follow(follower, "2", after_id="0", block_ms=200, timeout_s=10))

    reader = threading.Thread(target=read)
    reader.start()
    events.publish(redis_client, "2", events.STARTED, {"worker": "w", "fence": 1})
    events.publish(redis_client, "2", events.CANCELLED, {"by": "alice"})
    events.publish(redis_client, "2", events.PROGRESS, {"phase": "never", "message": "dropped"})
    reader.join(timeout=10)
    assert not reader.is_alive()
    follower.close()
    assert seen == ["queued", "started", "cancelled"]


def test_follow_after_the_end_returns_instead_of_hanging(redis_client: redis.Redis) -> None:
    events.publish(redis_client, "3", events.QUEUED, {})
    last = events.publish(redis_client, "3", events.FAILED, {"message": "boom"})
    assert last is not None
    assert list(events.follow(redis_client, "3", after_id=last.id, block_ms=100)) == []
    assert [e.type for e in events.follow(redis_client, "3")] == ["queued", "failed"]


def test_follow_times_out_on_a_quiet_job(redis_client: redis.Redis) -> None:
    events.publish(redis_client, "4", events.QUEUED, {})
    assert [e.type for e in events.follow(redis_client, "4", block_ms=50, timeout_s=0.2)] == ["queued"]


def test_job_stream_is_capped(redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "JOB_MAXLEN", 10)
    for i in range(400):
        events.publish(redis_client, "9", events.PROGRESS, {"phase": "p", "message": str(i)})
    # "~" trims whole stream nodes (100 entries by default), so the cap is approximate.
    assert redis_client.xlen(events.job_stream("9")) < 250
    assert events.job_events(redis_client, "9")[-1].data["message"] == "399"


def test_consumer_group_delivers_each_event_once_across_a_restart(redis_client: redis.Redis, redis_url: str) -> None:
    assert events.ensure_group(redis_client, "g", start_id="$") is True
    assert events.ensure_group(redis_client, "g") is False
    for i in range(3):
        events.publish(redis_client, str(i), events.QUEUED, {"position": 1, "ahead": 0})
    got = events.read_group(redis_client, "bot-1", group="g", block_ms=100)
    assert [e.job for e in got] == ["0", "1", "2"]
    assert events.ack(redis_client, [e.id for e in got], group="g") == 3

    # The notifier restarts under the same consumer name: nothing pending, nothing new.
    restarted = redis.Redis.from_url(redis_url)
    assert events.read_pending(restarted, "bot-1", group="g") == []
    assert events.read_group(restarted, "bot-1", group="g", block_ms=50) == []

    events.publish(redis_client, "7", events.STARTED, {"worker": "w", "fence": 1})
    assert [e.job for e in events.read_group(restarted, "bot-1", group="g", block_ms=100)] == ["7"]
    restarted.close()


def test_unacked_event_is_redelivered_and_claimable(redis_client: redis.Redis) -> None:
    events.ensure_group(redis_client, "g", start_id="0")
    events.publish(redis_client, "1", events.QUEUED, {})
    events.publish(redis_client, "2", events.QUEUED, {})
    got = events.read_group(redis_client, "bot-a", group="g", block_ms=100)
    events.ack(redis_client, [got[0].id], group="g")  # crashed before delivering the second one

    # Same consumer after a restart: its pending entry comes back first.
    assert [e.job for e in events.read_pending(redis_client, "bot-a", group="g")] == ["2"]
    # Or another consumer takes over what the dead one left.
    claimed = events.claim_stale(redis_client, "bot-b", group="g", min_idle_ms=0)
    assert [e.job for e in claimed] == ["2"]
    assert events.read_pending(redis_client, "bot-a", group="g") == []
    events.ack(redis_client, [claimed[0].id], group="g")
    assert redis_client.xpending(events.GLOBAL_STREAM, "g")["pending"] == 0
    assert events.claim_stale(redis_client, "bot-b", group="g", min_idle_ms=0) == []


def test_follow_yields_an_ending_published_right_after_an_empty_read(redis_url):
    """The race: a blocking read comes back empty, the job ends, then follow checks the marker."""
    publisher = redis.Redis.from_url(redis_url)
    publisher.flushdb()
    events.publish(publisher, "77", events.QUEUED, {"summary": "x"})

    class EndsAfterEmptyRead(redis.Redis):
        """A real client whose first empty blocking read is followed, at once, by the job's ending."""

        ended = False

        def xread(self, streams, count=None, block=None, noack=False):  # type: ignore[override]
            reply = super().xread(streams, count=count, block=block)
            if block and not reply and not self.ended:
                self.ended = True
                events.publish(publisher, "77", events.SUCCEEDED, {"ok": 1})
            return reply

    client = EndsAfterEmptyRead.from_url(redis_url)
    first = next(iter(events.job_events(client, "77")))
    seen = list(events.follow(client, "77", after_id=first.id, block_ms=50, timeout_s=5))
    assert [e.type for e in seen] == [events.SUCCEEDED]


def test_publish_unless_is_blocked_by_the_key_then_publishes_then_reports_the_end(redis_client: redis.Redis) -> None:
    flag = "benchbot:job:1:cancel"
    redis_client.set(flag, "{}")
    assert events.publish_unless(redis_client, "1", events.SUCCEEDED, {"x": 1}, blocker_key=flag) == (
        events.BLOCKED,
        None,
    )
    assert events.job_events(redis_client, "1") == [] and not events.is_terminal(redis_client, "1")
    redis_client.delete(flag)
    outcome, event = events.publish_unless(redis_client, "1", events.SUCCEEDED, {"x": 1}, blocker_key=flag)
    assert outcome == events.PUBLISHED and event is not None and event.data == {"x": 1}
    assert events.terminal_type(redis_client, "1") == "succeeded"
    redis_client.set(flag, "{}")  # a cancel after the end changes nothing
    assert events.publish_unless(redis_client, "1", events.SUCCEEDED, {}, blocker_key=flag) == (events.ENDED, None)
    assert [e.type for e in events.job_events(redis_client, "1")] == ["succeeded"]
