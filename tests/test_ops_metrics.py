"""The operators' ``/metrics``: real endpoints on 127.0.0.1 over a real Redis, scraped over HTTP and read
with prometheus_client's own parser; a real worker process (the CLI's) runs real jobs in forked horses."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from redis.backoff import NoBackoff
from redis.retry import Retry

from bot import metrics as bot_metrics
from bot.slack_standin import APP_TOKEN, BOT_TOKEN, SlackHarness, SlackStandIn, SocketModeStandIn
from tests.util import free_port, wait_until
from workers import keys, ops_metrics
from workers.config import EMBEDDED_TOML, parse_config
from workers.errors import BenchbotError
from workers.jobs import events, job_metrics, lease, queue, waiting_line

ROOT = Path(__file__).resolve().parent.parent
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample of the endpoint, by (sample name, labels), parsed as Prometheus would."""
    reply = httpx.get(url, timeout=10)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def _enqueue(r: redis.Redis, host: str, kind: str = "bench", func: str = "tests.jobfuncs.hold", **payload: object):
    return queue.enqueue(
        r,
        host,
        kind,
        dict(payload),
        user="alice",
        channel="C1",
        summary=f"{kind} on {host}",
        job_timeout_s=60,
        func=func,
    )


@pytest.fixture
def endpoint(redis_client: redis.Redis) -> Iterator[str]:
    """The fleet collector over hosts h1 and h2, served on an ephemeral port of 127.0.0.1."""
    server = ops_metrics.serve(ops_metrics.fleet_registry(redis_client, ["h1", "h2"], all_series=False), 0)
    try:
        yield server.url
    finally:
        server.stop()


def test_queue_depth_jobs_lease_and_observation_age_follow_redis(endpoint: str, redis_client: redis.Redis) -> None:
    before = scrape(endpoint)
    assert value(before, "benchbot_queue_depth", host="h1") == 0
    assert value(before, "benchbot_lease_held_seconds", host="h1") == 0
    assert value(before, "benchbot_redis_up") == 1
    assert value(before, "benchbot_observation_age_seconds", host="h1") is None  # never observed: no series

    for _ in range(3):
        _enqueue(redis_client, "h1")
    _enqueue(redis_client, "h2", kind="launch")
    after = scrape(endpoint)
    assert value(after, "benchbot_queue_depth", host="h1") == 3
    assert value(after, "benchbot_queue_depth", host="h2") == 1
    assert value(after, "benchbot_jobs", host="h1", kind="bench", state="queued") == 3
    assert value(after, "benchbot_jobs", host="h2", kind="launch", state="queued") == 1

    # Job 1 takes the host (as a worker's JobContext would): running, one fewer waiting, the lease ages.
    waiting_line.remove_waiter(redis_client, "h1", "1")
    assert isinstance(lease.try_acquire(redis_client, "h1", job="1", user="alice", seq=1), lease.Lease)
    held = wait_until(
        lambda: (s := scrape(endpoint)) and (value(s, "benchbot_lease_held_seconds", host="h1") or 0) > 0.05 and s,
        what="the lease to show its age",
    )
    assert value(held, "benchbot_jobs", host="h1", kind="bench", state="running") == 1
    assert value(held, "benchbot_queue_depth", host="h1") == 2
    assert value(held, "benchbot_lease_held_seconds", host="h2") == 0

    # An observation stored 30 s ago (what an observer writes: the RunningConfig JSON with observed_at).
    redis_client.set(keys.host_observed("h2"), json.dumps({"observed_at": time.time() - 30, "running": False}))
    aged = value(scrape(endpoint), "benchbot_observation_age_seconds", host="h2")
    assert aged is not None and 29 <= aged < 60


def test_endings_failures_and_durations_are_counted_once_from_redis(endpoint: str, redis_client: redis.Redis) -> None:
    job = _enqueue(redis_client, "h1")
    waiting_line.remove_waiter(redis_client, "h1", job.job_id)
    granted = lease.try_acquire(redis_client, "h1", job=job.job_id, user="alice", seq=job.seq)
    assert isinstance(granted, lease.Lease)
    # The reaper and the worker may race to end a job: the terminal event is written once, counted once.
    assert events.publish(redis_client, job.job_id, events.FAILED, {"message": "x", "diagnosis": {"category": "oom"}})
    assert events.publish(redis_client, job.job_id, events.FAILED, {"message": "again"}) is None
    lost = _enqueue(redis_client, "h2", kind="launch")
    events.publish(redis_client, lost.job_id, events.FAILED, {"diagnosis": {"category": "lease_lost"}})
    job_metrics.record_launch(redis_client, "h1", "sglang")
    job_metrics.record_launch_failure(redis_client, "h1", "sglang", "cuda_oom")

    s = scrape(endpoint)
    assert value(s, "benchbot_jobs_ended_total", host="h1", kind="bench", state="failed") == 1
    assert value(s, "benchbot_job_failures_total", host="h1", kind="bench", category="oom") == 1
    assert value(s, "benchbot_lease_losses_total", host="h2") == 1
    assert value(s, "benchbot_lease_losses_total", host="h1") is None
    assert value(s, "benchbot_engine_launches_total", host="h1", engine="sglang") == 1
    assert value(s, "benchbot_engine_launch_failures_total", host="h1", engine="sglang", category="cuda_oom") == 1
    # Job 1 held the lease when it ended: one duration; job 2 never held it: none.
    assert value(s, "benchbot_job_duration_seconds_count", kind="bench") == 1
    assert value(s, "benchbot_job_duration_seconds_bucket", kind="bench", le="+Inf") == 1
    assert value(s, "benchbot_job_duration_seconds_count", kind="launch") is None


def test_an_ending_whose_queued_event_was_trimmed_is_counted_from_rqs_record(
    endpoint: str, redis_client: redis.Redis
) -> None:
    job = _enqueue(redis_client, "h2", kind="sweep")
    redis_client.delete(keys.job_events(job.job_id))  # what MAXLEN trimming does to a long sweep's first entries
    events.publish(redis_client, job.job_id, events.SUCCEEDED, {})
    unknown = _enqueue(redis_client, "h1")
    redis_client.delete(keys.job_events(unknown.job_id), keys.rq_job(unknown.job_id))  # nothing says where it ran
    events.publish(redis_client, unknown.job_id, events.CANCELLED, {"by": "bob"})
    s = scrape(endpoint)
    assert value(s, "benchbot_jobs_ended_total", host="h2", kind="sweep", state="succeeded") == 1
    unknown_series = {"host": "unknown", "kind": "unknown", "state": "cancelled"}
    assert value(s, "benchbot_jobs_ended_total", **unknown_series) is None  # a worker's scope: its hosts only
    everything = ops_metrics.serve(ops_metrics.fleet_registry(redis_client, ["h1"], all_series=True), 0)
    try:  # the bot's scope: counted somewhere, never dropped
        assert value(scrape(everything.url), "benchbot_jobs_ended_total", **unknown_series) == 1
    finally:
        everything.stop()


def test_a_worker_scope_leaves_other_hosts_out(redis_client: redis.Redis) -> None:
    _enqueue(redis_client, "h9")
    events.publish(redis_client, "1", events.CANCELLED, {"by": "bob"})
    server = ops_metrics.serve(ops_metrics.fleet_registry(redis_client, ["h1"], all_series=False), 0)
    try:
        s = scrape(server.url)
    finally:
        server.stop()
    assert value(s, "benchbot_jobs_ended_total", host="h9", kind="bench", state="cancelled") is None
    assert value(s, "benchbot_queue_depth", host="h9") is None and value(s, "benchbot_queue_depth", host="h1") == 0


def test_a_taken_port_is_a_clear_error(redis_client: redis.Redis) -> None:
    first = ops_metrics.serve(ops_metrics.fleet_registry(redis_client, ["h1"], all_series=False), 0)
    try:
        with pytest.raises(BenchbotError, match=r"cannot serve metrics on 127\.0\.0\.1:\d+ .*\[metrics\]"):
            ops_metrics.serve(ops_metrics.fleet_registry(redis_client, ["h1"], all_series=False), first.port)
    finally:
        first.stop()


def test_a_held_connection_is_dropped_after_the_read_timeout(redis_client: redis.Redis) -> None:
    """Issue 39 round 4, item 7: a client that opens a connection and never finishes its request no longer
    holds a server thread for ever; a scrape beside it is answered."""
    import socket

    server = ops_metrics.serve(
        ops_metrics.fleet_registry(redis_client, ["h1"], all_series=False), 0, read_timeout_s=0.5
    )
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as held:
            held.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never the blank line that ends it
            assert value(scrape(server.url), "benchbot_queue_depth", host="h1") == 0
            start = time.monotonic()
            assert held.recv(4096) == b""  # the server closed it
            assert time.monotonic() - start < 5
    finally:
        server.stop()


def test_a_scrape_while_redis_is_away_says_so(state_dir: Path) -> None:
    gone = redis.Redis(unix_socket_path=str(state_dir / "nobody.sock"), retry=Retry(NoBackoff(), 0))
    server = ops_metrics.serve(ops_metrics.fleet_registry(gone, ["h1"], all_series=False), 0)
    try:
        s = scrape(server.url)
    finally:
        server.stop()
    assert value(s, "benchbot_redis_up") == 0 and value(s, "benchbot_queue_depth", host="h1") is None


# --------------------------------------------------------------------------- a real worker process


@pytest.fixture
def worker_endpoint(redis_url: str, redis_client: redis.Redis, tmp_path: Path, state_dir: Path) -> Iterator[str]:
    """``benchbot worker --host h1`` with ``[metrics] worker_ports = { h1 = PORT }``, as an operator runs it."""
    port = free_port()
    config = tmp_path / "benchbot.toml"
    config.write_text(
        f'[hosts.h1]\nport = {free_port()}\nlog_dir = "{tmp_path}"\n[hosts.h2]\nport = {free_port()}\n'
        f"[limits]\nlease_ttl_s = 5\n[metrics]\nworker_ports = {{ h1 = {port} }}\n"
    )
    env = {**os.environ, "REDIS_URL": redis_url}
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "--config", str(config), "worker", "--host", "h1"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    url = f"http://127.0.0.1:{port}/metrics"

    def answers() -> bool:
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.TransportError:
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()
            return False

    try:
        wait_until(answers, timeout=30, interval=0.1, what="the worker's /metrics")
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_real_worker_serves_its_hosts_and_counts_jobs_its_horses_ran(
    worker_endpoint: str, redis_client: redis.Redis
) -> None:
    s = scrape(worker_endpoint)
    assert value(s, "benchbot_queue_depth", host="h1") == 0
    assert value(s, "benchbot_queue_depth", host="h2") is None  # not this worker's host
    assert any(name == "process_resident_memory_bytes" for name, _ in s)
    wait_until(
        lambda: value(scrape(worker_endpoint), "benchbot_host_served", host="h1") == 1, what="the observer's liveness"
    )

    _enqueue(redis_client, "h1", until="benchbot:test:release")
    _enqueue(redis_client, "h1", func="tests.jobfuncs.crash")
    running = wait_until(
        lambda: (
            (s := scrape(worker_endpoint))
            and value(s, "benchbot_jobs", host="h1", kind="bench", state="running") == 1
            and (value(s, "benchbot_lease_held_seconds", host="h1") or 0) > 0
            and s
        ),
        timeout=30,
        what="the first job to hold h1",
    )
    assert value(running, "benchbot_queue_depth", host="h1") == 1

    redis_client.set("benchbot:test:release", "1")
    # A job publishes its ending and then gives the host back: a scrape between the two sees the second job
    # ended and its lease still held for a few milliseconds. Both jobs ended *and* the host free, then.
    done = wait_until(
        lambda: (
            (s := scrape(worker_endpoint))
            and value(s, "benchbot_jobs_ended_total", host="h1", kind="bench", state="failed") == 1
            and value(s, "benchbot_lease_held_seconds", host="h1") == 0
            and s
        ),
        timeout=30,
        what="both jobs to end and the host to be free",
    )
    # Counted in the horses (forked, gone), read back from Redis by the worker's own endpoint.
    assert value(done, "benchbot_jobs_ended_total", host="h1", kind="bench", state="succeeded") == 1
    assert value(done, "benchbot_job_failures_total", host="h1", kind="bench", category="internal") == 1
    assert value(done, "benchbot_job_duration_seconds_count", kind="bench") == 2
    assert value(done, "benchbot_queue_depth", host="h1") == 0


# --------------------------------------------------------------------------- the bot


def test_the_bot_serves_every_host_and_its_slack_ack_latency(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, state_dir: Path
) -> None:
    config = parse_config(EMBEDDED_TOML + f"\n[metrics]\nbot_port = {free_port()}\n", "test")
    with SlackHarness(config, redis_url, tmp_path, notifier=False) as h:
        server = bot_metrics.start_bot_metrics(config, redis_client)
        assert server is not None
        try:
            url = f"http://127.0.0.1:{config.metrics.bot_port}/metrics"
            first = scrape(url)
            before = value(first, "benchbot_slack_ack_seconds_count", kind="command") or 0
            before_sum = value(first, "benchbot_slack_ack_seconds_sum", kind="command") or 0
            answer = h.command("/launch", "cutlass cudnn")
            assert answer.status == 200
            s = wait_until(
                lambda: (s := scrape(url)) and value(s, "benchbot_queue_depth", host="sim") == 1 and s,
                what="the launch to be queued",
            )
            assert value(s, "benchbot_slack_ack_seconds_count", kind="command") == before + 1
            # Receipt to ack happened inside the client's round trip: measured, and no longer than it.
            took = (value(s, "benchbot_slack_ack_seconds_sum", kind="command") or 0) - before_sum
            assert 0 < took <= answer.elapsed_s
            assert value(s, "benchbot_queue_depth", host="sim-vllm") == 0
            assert value(s, "benchbot_jobs", host="sim", kind="launch", state="queued") == 1
        finally:
            server.stop()


def test_run_slack_in_socket_mode_serves_its_port_counts_the_ack_and_closes_it(
    redis_url: str, redis_client: redis.Redis, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.slack_app import run_slack

    port = free_port()
    config = parse_config(EMBEDDED_TOML + f"\n[metrics]\nbot_port = {port}\n", "test")
    url = f"http://127.0.0.1:{port}/metrics"
    with SlackStandIn() as standin, SocketModeStandIn() as socket_mode:
        standin.socket_mode_url = socket_mode.url
        monkeypatch.setenv("SLACK_BOT_TOKEN", BOT_TOKEN)
        monkeypatch.setenv("SLACK_APP_TOKEN", APP_TOKEN)
        monkeypatch.delenv("SLACK_SIGNING_SECRET", raising=False)
        monkeypatch.setenv("SLACK_API_URL", standin.base_url)
        stop = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            try:
                run_slack(config, redis_url, notify=False, stop=stop)
            except BaseException as exc:
                failure.append(exc)

        runner = threading.Thread(target=serve, daemon=True)
        runner.start()
        try:
            socket_mode.wait_connected()
            before = value(scrape(url), "benchbot_slack_ack_seconds_count", kind="command") or 0
            envelope = socket_mode.push(
                "slash_commands",
                {
                    "command": "/help",
                    "text": "",
                    "user_id": "alice",
                    "user_name": "alice",
                    "channel_id": "C0TEAM",
                    "team_id": "T0STANDIN",
                    "api_app_id": "A0STANDIN",
                    "response_url": standin.webhook_url(),
                    "trigger_id": "99.1.metrics",
                },
            )
            socket_mode.wait_ack(envelope)
            wait_until(
                lambda: value(scrape(url), "benchbot_slack_ack_seconds_count", kind="command") == before + 1,
                what="the Socket Mode ack to be counted",
            )
        finally:
            stop.set()
            runner.join(10)
        assert not runner.is_alive() and failure == []
    with pytest.raises(httpx.TransportError):  # stopped with the app: the port is free again
        httpx.get(url, timeout=2)


def test_no_metrics_port_means_no_endpoint(redis_client: redis.Redis) -> None:
    config = parse_config(EMBEDDED_TOML, "test")
    assert bot_metrics.start_bot_metrics(config, redis_client) is None
    assert ops_metrics.start_worker_metrics(config, "redis://127.0.0.1:1/0", ["sim"]) is None


@pytest.mark.slow
def test_the_scrape_bench_quick_mode_scrapes_every_queued_job() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "metrics_scrape.py"), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["bench"] == "metrics_scrape" and result["hosts"] == 3
    assert result["queue_depth_scraped"] == result["jobs_unfinished"] == 30  # every queued job, none invented
    assert 0 < result["scrape_ms"]["p50"] <= result["scrape_ms"]["max"] and result["series"] > 0
