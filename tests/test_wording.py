"""Small wording slips a newcomer met (issue 16.8): each answer says what is true, once."""

from __future__ import annotations

import dataclasses

import redis
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from bot import render
from tests.factories import make_run
from workers.jobs import events, queue, waiting_line
from workers.jobs.bodies.stop import stop_message
from workers.jobs.outcomes import Stopped
from workers.observation import RunningConfig


def _enqueue(r: redis.Redis, user: str = "alice") -> queue.QueuedJob:
    return queue.enqueue(r, "gpu-1", "stop", {}, user=user, channel="c", summary="stop the engine", job_timeout_s=60)


def test_queue_and_enqueue_count_the_same_jobs_ahead(redis_client: redis.Redis) -> None:
    queued = [_enqueue(redis_client) for _ in range(3)]
    assert [q.ahead for q in queued] == [0, 1, 2]
    listing = {"gpu-1": queue.list_jobs(redis_client, "gpu-1")}
    lines = render.queue_text(listing).splitlines()[1:]
    said = [
        render.queued_text({"user": "alice", "summary": "s", "host": "gpu-1", "job_id": q.job_id, "ahead": q.ahead})
        for q in queued
    ]
    assert said[0].endswith("next in line") and lines[0].startswith(f"  #{queued[0].job_id} queued, next in line")
    assert said[2].endswith("2 ahead") and lines[2].startswith(f"  #{queued[2].job_id} queued, 2 ahead")


def test_cancel_of_a_long_finished_job_says_it_ended_not_whose_it_was(redis_client: redis.Redis) -> None:
    done = _enqueue(redis_client, user="alice")
    job = Job.fetch(done.job_id, connection=redis_client, serializer=JSONSerializer)
    job.set_status(JobStatus.FINISHED)
    redis_client.lrem(queue.host_queue(redis_client, "gpu-1").key, 0, done.job_id)  # a worker took it...
    waiting_line.remove_waiter(redis_client, "gpu-1", done.job_id)  # ...and ran it
    redis_client.delete(events.job_stream(done.job_id), events.terminal_key(done.job_id))  # expired long ago
    assert events.terminal_type(redis_client, done.job_id) is None
    told = queue.cancel(redis_client, done.job_id, by="bob")
    assert told == f"job {done.job_id} already ended (finished); nothing to cancel"


def test_a_stopped_engine_is_said_stopped_once() -> None:
    base = RunningConfig.from_dict(make_run("r1").config)
    config = dataclasses.replace(base, summary="flashinfer_cutlass MoE, TP8")
    assert stop_message(Stopped(config, "stopped")) == "stopped flashinfer_cutlass MoE, TP8"
    assert stop_message(Stopped(config, "stopped; 1 child process outlived it and was stopped too")) == (
        "stopped flashinfer_cutlass MoE, TP8 (1 child process outlived it and was stopped too)"
    )
    assert stop_message(Stopped(dataclasses.replace(base, summary=""), "killed after the grace period")) == (
        "stopped the server (killed after the grace period)"
    )
