"""Fenced side effects end to end: a job paused past its lease touches nothing when it wakes up.

Real ``benchbot worker`` processes, a real Redis, the simulator. A job is paused deterministically with
``workers.jobs.faults``' hook (``BENCHBOT_FAULT_PAUSE_AT``: the job process writes a marker and SIGSTOPs itself
at a named point, heartbeat thread included), the lease TTL passes, another worker takes the host and
runs its own job, then the test sends SIGCONT and checks from the outside (/proc, the engine's own
counters, files on the host) what the stale job did. Also: a launch is READY only for the instance it
spawned, and a cancel that lands after the smoke test still ends the job ``cancelled`` with its engine
stopped. See docs/reliability.md, "Fenced side effects".
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from bot import job_threads
from bot.render import event_text
from tests.integration.harness import HOST, BenchbotHost, first
from tests.util import wait_until
from workers import keys, observer
from workers.jobs import events, faults
from workers.results import store

pytestmark = pytest.mark.slow

SHORT_BENCH = "1 in=64 out=16 n=4"


def pause_env(point: str, marker: Path) -> dict[str, str]:
    """Worker environment that makes the first job reaching ``point`` stop itself."""
    return {faults.PAUSE_AT_ENV: point, faults.PAUSE_MARKER_ENV: str(marker)}


def queue_job(h: BenchbotHost, user: str, line: str) -> str:
    reply = h.run(user, line)
    assert reply.ok and reply.job_id, reply.text
    return reply.job_id


def wait_paused(h: BenchbotHost, marker: Path, job_id: str, timeout: float = 60) -> int:
    """Wait until ``job_id``'s process stopped itself at its pause point; returns its pid."""
    wait_until(
        lambda: marker.exists() and marker.read_text().endswith("}"),
        timeout=timeout,
        what=f"job {job_id} to pause ({h.worker_logs()})",
    )
    paused = json.loads(marker.read_text())
    assert paused["job"] == job_id, paused
    wait_until(lambda: process_state(paused["pid"]) == "T", timeout=10, what="the job process to be stopped")
    return int(paused["pid"])


def process_state(pid: int) -> str | None:
    """The state letter from /proc/PID/stat (T = stopped, Z = zombie), None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def resume_and_wait_exit(pid: int) -> None:
    """SIGCONT the paused job process and wait until it has finished (gone or a zombie)."""
    os.kill(pid, signal.SIGCONT)
    wait_until(lambda: process_state(pid) in (None, "Z"), timeout=60, what=f"the resumed job process {pid} to end")


def rq_failure(h: BenchbotHost, job_id: str) -> str:
    """The traceback RQ stored for a job that raised (what the job process itself decided)."""
    job = Job.fetch(job_id, connection=h.r, serializer=JSONSerializer)
    wait_until(
        lambda: job.get_status(refresh=True).value in ("failed", "finished"),
        timeout=30,
        what=f"RQ to record job {job_id}'s end",
    )
    result = job.latest_result()
    return str(getattr(result, "exc_string", "") or "")


def engine_requests(port: int) -> float:
    """``sglang:num_requests_total`` from the engine's own /metrics (launched with --enable-metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    match = re.search(r"^sglang:num_requests_total\{[^}]*\} ([0-9.]+)$", text, re.M)
    assert match, text[:500]
    return float(match.group(1))


def engine_log(h: BenchbotHost, job_id: str) -> Path:
    """Where a launch of ``job_id`` writes its engine's log (created by the spawn)."""
    return h.work / "logs" / f"engine-{HOST}-job{job_id}.log"


# --------------------------------------------------------------------------- paused past the lease TTL


def test_a_launch_paused_past_its_lease_before_the_spawn_spawns_nothing_when_it_wakes(
    redis_url: str, tmp_path: Path
) -> None:
    """Split brain, issue 12 item 1: the stale launch must not start a second engine."""
    marker = tmp_path / "paused.json"
    with BenchbotHost(redis_url, tmp_path, workers=2, env=pause_env(faults.BEFORE_SPAWN, marker)) as h:
        stale = queue_job(h, "alice", "/launch cutlass cudnn")
        pid = wait_paused(h, marker, stale)
        fresh = queue_job(h, "bob", "/launch cutlass cudnn --enable-metrics")
        terminal, seen = h.wait(fresh, timeout=90)  # waits for the stale lease to expire, then launches
        assert terminal.type == "succeeded", terminal.data
        assert events.terminal_type(h.r, stale) == "failed"  # reported when bob's job took the host
        ready = first(seen, events.READY).data["config"]

        resume_and_wait_exit(pid)

        assert "LeaseLostError" in rq_failure(h, stale)
        assert not engine_log(h, stale).exists(), "the stale job spawned an engine"
        assert h.engine_pids() == [ready["process"]["pid"]]
        record = observer.launched_record(h.r, HOST)
        assert record is not None and record.job == fresh and record.instance_id == ready["instance_id"]
        now = h.run("alice", "/status").data["hosts"][0]["fresh"]
        assert now["instance_id"] == ready["instance_id"] and now["managed"] is True
        assert now["launched_by"]["job"] == fresh


def test_a_launch_paused_after_its_redis_check_is_refused_by_the_host_itself(redis_url: str, tmp_path: Path) -> None:
    """The window Redis cannot close: the check passed, then the job froze past its TTL before the spawn.

    Bob's job claimed the host (its fence file) meanwhile; the resumed spawn reaches the host-side actuator,
    which compares fences under its lock and starts nothing.
    """
    marker = tmp_path / "paused.json"
    with BenchbotHost(redis_url, tmp_path, workers=2, env=pause_env(faults.SPAWN_AFTER_CHECK, marker)) as h:
        stale = queue_job(h, "alice", "/launch cutlass cudnn")
        pid = wait_paused(h, marker, stale)
        fresh = queue_job(h, "bob", "/launch cutlass cudnn --enable-metrics")
        terminal, seen = h.wait(fresh, timeout=90)
        assert terminal.type == "succeeded", terminal.data
        ready = first(seen, events.READY).data["config"]

        resume_and_wait_exit(pid)

        assert "StaleFenceError" in rq_failure(h, stale)  # the host refused it, not Redis
        assert not engine_log(h, stale).exists(), "the stale job spawned an engine"
        assert h.engine_pids() == [ready["process"]["pid"]]


def test_a_launch_resumed_as_its_lease_expires_is_refused_by_the_host_before_anyone_else_claims(
    redis_url: str, tmp_path: Path
) -> None:
    """Issue 25 item 1: the spawn reaches the host after the lease expired but before any newer claim.

    One worker, so bob's launch waits in the queue and nobody claims the host meanwhile: a fence that
    compared tokens only let alice's expired spawn through (then bob's launch met an engine "not started
    by benchbot"). The token now carries its deadline in the host's clock; the host refuses it.
    """
    marker = tmp_path / "paused.json"
    with BenchbotHost(redis_url, tmp_path, workers=1, env=pause_env(faults.SPAWN_AFTER_CHECK, marker)) as h:
        stale = queue_job(h, "alice", "/launch cutlass cudnn")
        pid = wait_paused(h, marker, stale)
        fresh = queue_job(h, "bob", "/launch cutlass cudnn --enable-metrics")
        wait_until(lambda: not h.r.exists(keys.lease(HOST)), timeout=30, what="alice's lease to expire")

        resume_and_wait_exit(pid)  # at once: nobody has taken the lease, let alone claimed the host

        failure = rq_failure(h, stale)
        assert "StaleFenceError" in failure and "expired" in failure, failure[-800:]
        assert not engine_log(h, stale).exists(), "the expired job spawned an engine"
        assert h.engine_pids() == []
        terminal, seen = h.wait(fresh, timeout=90)
        assert terminal.type == "succeeded", (terminal.data, h.worker_logs())
        ready = first(seen, events.READY).data["config"]
        assert h.engine_pids() == [ready["process"]["pid"]]
        now = h.run("alice", "/status").data["hosts"][0]["fresh"]
        assert now["managed"] is True and now["launched_by"]["job"] == fresh


def test_after_redis_forgets_its_fence_counter_the_next_job_moves_past_the_hosts_token_and_runs(
    redis_url: str, tmp_path: Path
) -> None:
    """Issue 25 item 7: an embedded Redis restarted without persistence hands out fence 1 again while the
    host's fence file holds a higher one; every job then failed as stale ("another worker may hold the host")
    until someone removed the file. Now the job, seeing no lease was granted after its own, takes a fence above
    the host's and runs."""
    with BenchbotHost(redis_url, tmp_path, workers=1) as h:
        h.launch_ok("alice", "/launch cutlass cudnn")
        h.launch_ok("alice", "/launch cutlass cudnn")
        fence_file = h.work / "logs" / f".benchbot-fence-{h.port}"
        assert fence_file.read_text() == "2\n"
        h.r.delete(keys.lease_fence(HOST))  # what a Redis restarted without persistence has forgotten

        terminal, seen = h.launch_ok("bob", "/launch nextn cudnn")

        notes = [str(e.data.get("message")) for e in seen if e.type == events.PROGRESS]
        assert any("Redis had lost its fence counter" in n and "holds 2" in n for n in notes), notes
        assert fence_file.read_text() == "3\n" and int(h.r.get(keys.lease_fence(HOST))) == 3
        now = h.run("bob", "/status").data["hosts"][0]["fresh"]
        assert now["managed"] is True and now["launched_by"]["job"] == terminal.job


def test_a_bench_paused_past_its_lease_sends_no_request_to_the_next_jobs_engine(redis_url: str, tmp_path: Path) -> None:
    """A stale bench resumed after another job launched its own engine: not one request reaches it."""
    marker = tmp_path / "paused.json"
    with BenchbotHost(redis_url, tmp_path, workers=2, env=pause_env(faults.BEFORE_BENCH_REQUEST, marker)) as h:
        stale = queue_job(h, "alice", "/launch cutlass cudnn then bench 8 in=64 out=16 n=16")
        pid = wait_paused(h, marker, stale)
        fresh = queue_job(h, "bob", "/launch cutlass cudnn --enable-metrics")
        terminal, seen = h.wait(fresh, timeout=90)
        assert terminal.type == "succeeded", terminal.data
        engine = first(seen, events.READY).data["config"]["process"]["pid"]
        before = engine_requests(h.port)

        resume_and_wait_exit(pid)

        assert "LeaseLostError" in rq_failure(h, stale)
        assert engine_requests(h.port) == before, "the stale bench sent requests to the new job's engine"
        assert h.engine_pids() == [engine]
        assert [run.job_id for run in store.list_runs(h.r, n=100)] == []  # the stale bench stored nothing


def test_a_stop_paused_past_its_lease_sends_no_signal_when_it_wakes(redis_url: str, tmp_path: Path) -> None:
    """A stale /stop must not stop the server the next holder is using."""
    marker = tmp_path / "paused.json"
    with BenchbotHost(redis_url, tmp_path, workers=2, env=pause_env(faults.BEFORE_SIGNAL, marker)) as h:
        _, seen = h.launch_ok("alice", "/launch cutlass cudnn")
        engine = first(seen, events.READY).data["config"]["process"]["pid"]
        stale = queue_job(h, "alice", "/stop")
        pid = wait_paused(h, marker, stale)
        fresh = queue_job(h, "bob", f"/bench {SHORT_BENCH} any")
        terminal, _ = h.wait(fresh, timeout=90)
        assert terminal.type == "succeeded", terminal.data

        resume_and_wait_exit(pid)

        assert "LeaseLostError" in rq_failure(h, stale)
        assert h.engine_pids() == [engine], "the stale /stop signalled the server"
        assert process_state(engine) not in (None, "Z", "T")


# --------------------------------------------------------------------------- READY only for our instance

FOREIGN_SERVER = textwrap.dedent("""
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._answer({})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer({"text": " Paris, a city on the Seine known for its museums.",
                          "meta_info": {"completion_tokens": 11}})

        def log_message(self, *args):
            pass

    HTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
""")


def test_a_launch_is_never_ready_for_a_process_it_did_not_spawn(redis_url: str, tmp_path: Path) -> None:
    """Another server takes the port between the port check and the spawn: our engine cannot bind, the
    other answers /health and /generate with 200. The launch fails naming it and stops what it started."""
    marker = tmp_path / "paused.json"
    with BenchbotHost(redis_url, tmp_path, workers=1, lease_ttl_s=30, env=pause_env(faults.BEFORE_SPAWN, marker)) as h:
        job = queue_job(h, "alice", "/launch cutlass cudnn --sim-startup-s 20")
        pid = wait_paused(h, marker, job)
        host = h.config.host(HOST)
        foreign = subprocess.Popen(
            [sys.executable, "-c", FOREIGN_SERVER, host.bind, str(h.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_until(lambda: _answers(h.port), timeout=15, what="the foreign server to answer")
            os.kill(pid, signal.SIGCONT)
            terminal, seen = h.wait(job, timeout=60)
            assert terminal.type == "failed", terminal.data
            assert not [e for e in seen if e.type == events.READY]
            diagnosis = terminal.data["diagnosis"]
            assert diagnosis["category"] == "port_in_use", diagnosis
            assert f"pid {foreign.pid}:" in diagnosis["summary"], diagnosis  # names who answers, with its argv
            assert foreign.poll() is None, "benchbot signalled a process it did not start"
            wait_until(lambda: not h.engine_pids(), timeout=15, what="our engine to be stopped")
            assert observer.launched_record(h.r, HOST).job == job  # recorded, then not called ready
        finally:
            foreign.kill()
            foreign.wait(timeout=10)


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


# --------------------------------------------------------------------------- cancel until the terminal event


@pytest.mark.parametrize("point", [faults.BEFORE_SMOKE, faults.BEFORE_SUCCESS])
def test_a_cancel_landing_after_the_engine_is_up_ends_cancelled_and_stops_it(
    redis_url: str, tmp_path: Path, point: str
) -> None:
    """Issue 12 item 4: a cancel after the health wait, or after smoke test and observation but before
    `succeeded`, ends the job `cancelled` and stops the engine it started."""
    marker = tmp_path / "paused.json"
    with BenchbotHost(
        redis_url, tmp_path, workers=1, lease_ttl_s=30, cancel_grace_s=120, env=pause_env(point, marker)
    ) as h:
        job = queue_job(h, "alice", "/launch cutlass cudnn")
        pid = wait_paused(h, marker, job)
        engines = h.engine_pids()
        assert len(engines) == 1
        asked = h.run("alice", f"/cancel {job}")
        assert asked.ok and "asked job" in asked.text, asked.text
        os.kill(pid, signal.SIGCONT)
        terminal, _ = h.wait(job, timeout=60)
        assert terminal.type == "cancelled", terminal.data
        assert h.engine_pids() == []
        assert process_state(engines[0]) in (None, "Z")
        again = h.run("bob", f"/cancel {job}")
        assert "already ended (cancelled)" in again.text, again.text


def test_cancel_of_a_finished_job_says_it_ended_to_anyone(redis_url: str, tmp_path: Path) -> None:
    """`/cancel` of a job that ended answers that, whoever asks (it used to answer "belongs to alice")."""
    with BenchbotHost(redis_url, tmp_path, workers=1) as h:
        terminal, _ = h.launch_ok("alice", "/launch cutlass cudnn")
        for user in ("bob", "alice"):
            reply = h.run(user, f"/cancel {terminal.job}")
            assert reply.ok and f"job {terminal.job} already ended (succeeded)" in reply.text, reply.text
        assert not h.r.exists(f"benchbot:job:{terminal.job}:cancel")
        assert len(h.engine_pids()) == 1  # nothing touched


def test_a_cancel_landing_after_a_stop_stopped_the_engine_says_so(redis_url: str, tmp_path: Path) -> None:
    """Issue 36 item 10: a `/stop` cancelled after it stopped the engine ends "cancelled by alice after the
    engine was stopped (pid N)", not a bare "cancelled by alice" that reads as if the engine still ran. The
    stop job pauses just before its `succeeded` (its engine gone), the cancel lands, then it resumes."""
    marker = tmp_path / "paused.json"
    marker.write_text("{}")  # held while the launch passes the pause point; removed, the /stop pauses there
    env = pause_env(faults.BEFORE_SUCCESS, marker)
    with BenchbotHost(redis_url, tmp_path, workers=1, lease_ttl_s=30, cancel_grace_s=120, env=env) as h:
        h.launch_ok("alice", "/launch cutlass cudnn")
        (engine,) = h.engine_pids()
        marker.unlink()
        job = queue_job(h, "alice", "/stop")
        pid = wait_paused(h, marker, job)
        assert h.engine_pids() == [] and process_state(engine) in (None, "Z")  # stopped before the cancel
        asked = h.run("alice", f"/cancel {job}")
        assert asked.ok and "asked job" in asked.text, asked.text
        os.kill(pid, signal.SIGCONT)
        terminal, _ = h.wait(job, timeout=60)
        assert terminal.type == "cancelled", terminal.data
        done = f"the engine was stopped (pid {engine})"
        assert terminal.data["done"] == done
        assert event_text(terminal) == f"[#{job}] cancelled by @alice after {done}"
        assert job_threads.fold({}, terminal)["cancelled_after"] == done  # what the Slack header says
