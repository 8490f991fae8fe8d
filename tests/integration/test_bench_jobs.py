"""Benchmarks you can trust, end to end: real workers, a simulated host, the dispatcher every front end uses.

Each test proves one promise of benchbot's one idea (docs/observe.md) through the real path (enqueue -> RQ worker ->
lease -> observe -> bench -> store): results carry what was observed before and after; a server
swapped mid-bench makes the run invalid; a bench refuses to measure under a label its requester did
not mean; stored runs export, compare and sweep. Benches are short (levels 1,4, in=64 out=16 n=8).
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bot.dispatch import Dispatcher
from bot.follow import plots_for_result
from tests.integration.harness import CHANNEL, HOST, BenchbotHost, first, kill_engines
from tests.util import wait_until
from workers import observer
from workers.benchmark.metrics import LevelMetrics
from workers.config import load_config
from workers.jobs import events, lease, queue
from workers.results import store
from workers.results.record import RunRecord

REPO = Path(__file__).resolve().parents[2]
BENCH = "1,4 in=64 out=16 n=8"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
METRIC_KEYS = set(LevelMetrics.__dataclass_fields__)

pytestmark = pytest.mark.slow


@pytest.fixture
def host(redis_url: str, tmp_path: Path) -> Iterator[BenchbotHost]:
    """A simulated host with two real workers (the harness's defaults: lease TTL 3 s, start-up 0.2 s)."""
    with BenchbotHost(redis_url, tmp_path) as h:
        yield h


def queue_job(h: BenchbotHost, user: str, line: str) -> str:
    reply = h.run(user, line)
    assert reply.ok and reply.job_id, reply.text
    return reply.job_id


def run_id_of(terminal: events.Event) -> str:
    data = terminal.data
    run_id = data.get("run_id") or (data.get("bench") or {}).get("run_id")
    assert run_id, data
    return str(run_id)


def global_events(h: BenchbotHost) -> list[events.Event]:
    """Every job's events in publication order (the stream the notifier reads)."""
    return [events.Event.from_entry(i, f) for i, f in h.r.xrange(events.GLOBAL_STREAM)]


def assert_truth_stamps(record: RunRecord, *, valid: bool = True) -> None:
    for observed in (record.config, record.config_after):
        assert observed and observed["state"] == "running"
        assert observed["fingerprint"] and observed["instance_id"]
    if valid:
        assert record.valid and record.invalid_reason is None
        assert record.config["instance_id"] == record.config_after["instance_id"]
        assert record.config["fingerprint"] == record.config_after["fingerprint"]


# ------------------------------------------------------------------ 1. launch then bench: one lease, truth stamps


def test_launch_then_bench_holds_the_lease_and_stores_an_observed_run(host: BenchbotHost, tmp_path: Path):
    launch = queue_job(host, "alice", f"/launch cutlass cudnn then bench {BENCH}")
    other = queue_job(host, "bob", "/bench 4 in=64 out=16 n=8 any")  # queued behind: must not run in between
    terminal, seen = host.wait(launch)
    assert terminal.type == "succeeded", (terminal.data, host.worker_logs())
    assert terminal.data["kind"] == "launch+bench"
    other_terminal, other_seen = host.wait(other)
    assert other_terminal.type == "succeeded", other_terminal.data

    # one lease across launch and bench: one `started`, ready before the bench, nobody else in between
    assert [e.type for e in seen].count("started") == 1
    types = [(e.type, e.data.get("phase")) for e in seen]
    assert types.index(("ready", None)) < types.index(("progress", "bench"))
    stream = global_events(host)
    launch_span = [i for i, e in enumerate(stream) if e.job == launch and e.type in ("started", "succeeded")]
    between = [e for e in stream[launch_span[0] : launch_span[1]] if e.job != launch]
    waited = [e for e in between if e.type == "progress" and e.data.get("phase") == "waiting"]
    assert waited and f"job {launch} (alice) holds it" in waited[0].data["message"]
    touched = [e for e in between if e not in waited and e.type != "queued"]
    assert touched == [], [(e.job, e.type, e.data.get("phase")) for e in touched]
    fence_launch = first(seen, "started").data["fence"]
    fence_other = first(other_seen, "started").data["fence"]
    assert fence_other > fence_launch

    # the stored run: who, where, when, what was observed before and after, params, per-level metrics
    r1 = store.get_run(host.r, run_id_of(terminal))
    assert_truth_stamps(r1)
    assert (r1.user, r1.host, r1.kind, r1.job_id) == ("alice", HOST, "bench", launch)
    assert r1.label == "cutlass cudnn"
    assert abs(r1.created_at - terminal.ts) < 60
    assert r1.config["server"]["args"]["moe_runner_backend"] == "flashinfer_cutlass"
    assert r1.config["managed"] is True and r1.config["launched_by"]["job"] == launch
    assert r1.engine_version
    assert len(r1.config["gpus"]) == 8 and r1.config["gpus"][0]["compute_cap"]
    assert r1.params["levels"] == [1, 4] and r1.params["input_len"] == 64 and r1.params["output_len"] == 16
    assert r1.concurrencies == [1, 4]
    for level in r1.levels:
        assert set(level) >= METRIC_KEYS
        assert level["completed"] == 8 and level["errors"] == 0
        assert level["output_tokens"] == 8 * 16 and level["output_tok_s"] > 0
        assert level["ttft_ms"]["p50"] > 0
    r2 = store.get_run(host.r, run_id_of(other_terminal))
    assert_truth_stamps(r2)
    assert r2.user == "bob" and r2.fingerprint == r1.fingerprint and r2.concurrencies == [4]
    assert r2.label == "cutlass cudnn"  # a stand-alone bench is named by the presets of what runs (16.7)

    # /runs, /runs tag, export (the real CLI), /compare
    listing = host.run("alice", "/runs")
    assert listing.ok and r1.id in listing.text and r2.id in listing.text
    tagged = host.run("alice", f"/runs tag {r1.id} baseline")
    assert tagged.ok and "baseline" in store.get_run(host.r, r1.id).tags
    assert store.baseline_for(host.r, HOST).id == r1.id

    env = {**host.env}
    jsonl = subprocess.run(
        [sys.executable, "-m", "bot.cli", "runs", "export", "--format", "jsonl"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert jsonl.returncode == 0, jsonl.stderr
    exported = [json.loads(line) for line in jsonl.stdout.splitlines()]
    assert [e["id"] for e in exported] == [r1.id, r2.id]
    assert RunRecord.from_dict(exported[0]) == store.get_run(host.r, r1.id)
    out_csv = tmp_path / "runs.csv"
    done = subprocess.run(
        [sys.executable, "-m", "bot.cli", "runs", "export", "--format", "csv", "--output", str(out_csv)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert [(row["run_id"], row["concurrency"]) for row in rows] == [(r1.id, "1"), (r1.id, "4"), (r2.id, "4")]
    assert rows[0]["fingerprint"] == r1.fingerprint and rows[0]["tags"] == "baseline"
    assert rows[0]["user"] == "alice" and float(rows[0]["output_tok_s"]) > 0

    compare = host.run("alice", f"/compare {r1.id} {r2.id}")
    assert compare.ok, compare.text
    assert r1.id in compare.text and r2.id in compare.text
    assert compare.files and all(Path(p).read_bytes().startswith(PNG_MAGIC) for p in compare.files)


# ------------------------------------------------------------------ 2. a server swapped mid-bench


def start_unmanaged_nextn(h: BenchbotHost) -> subprocess.Popen[bytes]:
    """Start a NEXTN simulated server on the host's port by hand, as a person over SSH would."""
    argv = [
        sys.executable,
        "-m",
        "workers.sim.sglang",
        "--model-path",
        "nvidia/Qwen3.5-397B-A17B-NVFP4",
        "--tp",
        "8",
        "--port",
        str(h.port),
        "--quantization",
        "modelopt_fp4",
        "--moe-runner-backend",
        "flashinfer_cutlass",
        "--fp4-gemm-backend",
        "flashinfer_cudnn",
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
        "--mamba-scheduler-strategy",
        "extra_buffer",
    ]
    return subprocess.Popen(
        argv,
        env={**h.env, "SGLANG_ENABLE_SPEC_V2": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def horse_of(h: BenchbotHost, worker_name: str) -> int:
    """The pid of the forked process (RQ's horse) running a job in the worker called ``worker_name``.

    The worker's other children are short-lived observation commands; the horse is a fork, so it has
    the worker's own command line (or RQ's ``rq:...`` process title when setproctitle is installed).
    """
    index = int(worker_name.rsplit("-", 1)[1])
    pid = h.workers[index - 1].pid

    def cmdline(p: int | str) -> bytes:
        try:
            return Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            return b""

    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    horses = [int(c) for c in children if cmdline(c) == cmdline(pid) or cmdline(c).startswith(b"rq:")]
    assert len(horses) == 1, (children, horses)
    return horses[0]


def test_server_swapped_mid_bench_marks_the_run_invalid(redis_url: str, tmp_path: Path):
    """The worst case: the swap is quick, later requests succeed against the new server, numbers look fine.

    The job's process is paused (SIGSTOP) at its first ``bench`` event while the server on the port is
    killed and another one (NEXTN, started by hand) takes the port; then it resumes. The lease TTL is
    long enough to survive the pause.
    """
    with BenchbotHost(redis_url, tmp_path, lease_ttl_s=30) as h:
        h.launch_ok("alice", "/launch cutlass cudnn")
        job = queue_job(h, "alice", f"/bench {BENCH}")
        bench_started = wait_until(
            lambda: next(
                (e for e in events.job_events(h.r, job) if e.type == "progress" and e.data.get("phase") == "bench"),
                None,
            ),
            timeout=30,
            what="the bench to start",
        )
        horse = horse_of(h, first(events.job_events(h.r, job), "started").data["worker"])
        os.kill(horse, signal.SIGSTOP)
        rogue = None
        try:
            kill_engines(h.port)
            rogue = start_unmanaged_nextn(h)
            wait_until(
                lambda: h.engine_pids() == [rogue.pid] and ready(h.port),
                timeout=30,
                what="the hand-started server to answer",
            )
        finally:
            os.kill(horse, signal.SIGCONT)
        try:
            terminal, _ = h.wait(job, timeout=60)
            assert terminal.type == "succeeded", (terminal.data, h.worker_logs())
            record = store.get_run(h.r, run_id_of(terminal))
            assert record.valid is False
            before, after = record.config["instance_id"], record.config_after["instance_id"]
            assert before and after and before != after
            assert after.split(":")[1] == str(rogue.pid)
            assert record.config_after["managed"] is False  # benchbot did not start it
            assert record.fingerprint != record.config_after["fingerprint"]
            assert record.invalid_reason == (f"the server changed during the bench: instance {before} became {after}")
            assert terminal.data["valid"] is False and terminal.data["invalid_reason"] == record.invalid_reason
            assert sum(level["completed"] for level in record.levels) >= 15  # most requests hit the new server
            assert "(invalid)" in record.display_label
            assert "INVALID" in terminal.data["table"]
            assert bench_started.ts < terminal.ts
        finally:
            if rogue is not None and rogue.poll() is None:
                rogue.kill()
            if rogue is not None:
                rogue.wait(timeout=10)


def ready(port: int) -> bool:
    """Whether a server answers ``/health`` on ``port`` with 200."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# ------------------------------------------------------------------ 3. a bench refuses a config nobody meant


def hold_host(h: BenchbotHost) -> lease.Lease:
    """Take the host's lease as a long job would, so the jobs queued next wait and run in a fixed order."""
    return lease.acquire(h.r, HOST, job="999999", user="carol", ttl_s=60, timeout_s=15)


def test_bench_refuses_when_another_launch_replaced_the_config_meant_and_any_overrides(host: BenchbotHost):
    launched, _ = host.launch_ok("alice", "/launch cutlass cudnn")
    held = hold_host(host)
    try:
        relaunch = queue_job(host, "bob", "/launch nextn cudnn")  # runs first, replaces cutlass
        erin = queue_job(host, "erin", f"/bench {BENCH}")  # meant cutlass (what runs now)
        frank = queue_job(host, "frank", "/bench 4 in=64 out=16 n=8 any")  # measures whatever runs
        expect = queue.job_payload(host.r, erin)["expect"]
    finally:
        held.release()
    assert expect["fingerprint"] == launched.data["config"]["fingerprint"]  # captured at enqueue
    assert host.wait(relaunch)[0].type == "succeeded"
    refused, _ = host.wait(erin)
    assert refused.type == "failed"
    message = refused.data["message"]
    assert "refusing to benchmark under a wrong label" in message
    assert "cutlass" in message and "now it is" in message and "nextn" in message.lower()
    assert "'any'" in message
    before = {r.id for r in store.list_runs(host.r, n=100)}
    ok, _ = host.wait(frank)
    assert ok.type == "succeeded", ok.data
    record = store.get_run(host.r, run_id_of(ok))
    assert record.id not in before and record.user == "frank"
    assert_truth_stamps(record)
    assert record.config["server"]["args"].get("speculative_algorithm") in ("NEXTN", "EAGLE")
    assert not any(r.user == "erin" for r in store.list_runs(host.r, n=100))


def test_a_bench_never_measures_a_server_nobody_meant(host: BenchbotHost):
    """Issue 25 item 6: bob's launch of the same config queued ahead, then alice's /bench; and a bench asked
    while nobody could observe the host. Both are refused when their turn comes; 'any' measures."""
    launched, _ = host.launch_ok("alice", "/launch nextn cudnn")
    blind = Dispatcher(host.config, host.r, plots_dir=host.work / "plots", observe_timeout_s=0)
    held = hold_host(host)
    try:
        relaunch = queue_job(host, "bob", "/launch nextn cudnn")  # same fingerprint, a new server
        alice = host.run("alice", f"/bench {BENCH}")
        host.r.delete(observer.last_key(HOST))
        unseen = blind.handle("erin", CHANNEL, f"/bench {BENCH}")  # no answer, no stored observation
        frank = blind.handle("frank", CHANNEL, "/bench 4 in=64 out=16 n=8 any")
    finally:
        held.release()
    assert alice.ok and unseen.ok and frank.ok
    assert "only that server: a job queued ahead may replace it" in alice.text, alice.text
    assert launched.data["config"]["instance_id"] in alice.text
    assert "measures: nothing: benchbot cannot tell which server you mean" in unseen.text, unseen.text
    assert "measures: whatever runs when its turn comes (any)" in frank.text, frank.text
    assert queue.job_payload(host.r, unseen.job_id)["expect"]["unknown"]
    assert host.wait(relaunch)[0].type == "succeeded"
    for job in (alice.job_id, unseen.job_id):
        refused, _ = host.wait(job)
        assert refused.type == "failed", refused.data
        assert "refusing to benchmark under a wrong label" in refused.data["message"]
    assert "was replaced by a job queued ahead of yours" in host.wait(alice.job_id)[0].data["message"]
    assert "could not tell which server you meant" in host.wait(unseen.job_id)[0].data["message"]
    ok, _ = host.wait(frank.job_id)
    assert ok.type == "succeeded", ok.data
    assert [r.user for r in store.list_runs(host.r, n=100)] == ["frank"]


def test_a_run_whose_requests_mostly_failed_is_stored_invalid(host: BenchbotHost):
    """Issue 25 item 7: every prompt overflows the context (the server answers 400): 0/4 ok was stored valid."""
    host.launch_ok("alice", "/launch cutlass cudnn --context-length 128")
    done, _ = host.wait(queue_job(host, "alice", "/bench 1 in=512 out=16 n=4"))
    assert done.type == "succeeded", done.data
    assert done.data["valid"] is False, done.data
    assert "4 of 4 requests failed: the numbers describe errors, not the server" in done.data["invalid_reason"]
    record = store.get_run(host.r, run_id_of(done))
    assert not record.valid and record.invalid_reason == done.data["invalid_reason"]


# ------------------------------------------------------------------ 4. nothing running; after my own launch


def test_bench_with_nothing_running_fails_then_follows_my_own_queued_launch(host: BenchbotHost):
    lonely = queue_job(host, "alice", f"/bench {BENCH}")
    terminal, _ = host.wait(lonely)
    assert terminal.type == "failed"
    assert f"nothing is serving on {HOST}:{host.port}" in terminal.data["message"]
    assert "/launch first" in terminal.data["message"]
    assert store.list_runs(host.r) == []

    held = hold_host(host)
    try:
        launch = queue_job(host, "alice", "/launch nextn cudnn")
        bench = queue_job(host, "alice", f"/bench {BENCH}")  # means the launch she queued just before
        other = queue_job(host, "bob", "/launch cutlass cudnn")  # replaces it before her second bench
        late = queue_job(host, "alice", "/bench 4 in=64 out=16 n=8")  # still means her own launch
    finally:
        held.release()
    assert queue.job_payload(host.r, late)["expect"]["after_job"] == launch
    assert host.wait(launch)[0].type == "succeeded"
    done, _ = host.wait(bench)
    assert done.type == "succeeded", done.data
    record = store.get_run(host.r, run_id_of(done))
    assert_truth_stamps(record)
    assert record.config["launched_by"]["job"] == launch and record.config["managed"] is True
    assert record.config["server"]["args"].get("speculative_algorithm") in ("NEXTN", "EAGLE")
    assert host.wait(other)[0].type == "succeeded"
    refused, _ = host.wait(late)
    assert refused.type == "failed"
    assert f"you asked to bench after your launch (job {launch})" in refused.data["message"]
    assert "flashinfer_cutlass" in refused.data["message"]
    assert [r.id for r in store.list_runs(host.r)] == [record.id]


# ------------------------------------------------------------------ 5. a sweep goes on past a failed launch


def test_sweep_records_the_failed_cell_and_ends_with_one_comparison(host: BenchbotHost, tmp_path: Path):
    terminal, seen = host.launch_ok(
        "alice", f"/sweep cutlass cudnn, trtllm cudnn, nextn cudnn bench {BENCH}", timeout=120
    )
    data = terminal.data
    assert data["kind"] == "sweep"
    cells = data["cells"]
    assert [(c["label"], c["status"]) for c in cells] == [
        ("cutlass cudnn", "ok"),
        ("trtllm cudnn", "failed"),
        ("nextn cudnn", "ok"),
    ]
    failed_cell = cells[1]
    assert failed_cell["diagnosis"]["category"] and failed_cell["diagnosis"]["summary"]
    assert any("going on" in (e.data.get("message") or "") for e in seen)
    records = store.get_runs(host.r, data["run_ids"])
    assert [r.status for r in records] == ["ok", "failed", "ok"]
    assert all(r.sweep_id == data["sweep_id"] and r.kind == "sweep-cell" for r in records)
    assert records[1].diagnosis["category"] == failed_cell["diagnosis"]["category"]
    for record in (records[0], records[2]):
        assert_truth_stamps(record)
        assert record.concurrencies == [1, 4]
    assert records[0].fingerprint != records[2].fingerprint
    table = data["table"]
    assert all(r.id in table for r in records)
    paths = plots_for_result(host.r, data, tmp_path / "plots")
    assert paths and all(Path(p).read_bytes().startswith(PNG_MAGIC) for p in paths)


def test_a_user_taken_off_the_access_list_has_queued_jobs_refused_and_may_cancel_their_own(
    redis_url: str, tmp_path: Path
):
    """Issue 25 item 7: the list is checked again when a job's turn comes; cancelling one's own stays open."""
    access = '[access]\nusers = ["alice", "bob"]\n'
    with BenchbotHost(redis_url, tmp_path, extra_toml=access) as h:
        _, seen = h.launch_ok("alice", "/launch cutlass cudnn")
        engine = first(seen, events.READY).data["config"]["process"]["pid"]
        held = hold_host(h)
        try:
            stop = queue_job(h, "alice", "/stop")
            bench = queue_job(h, "alice", "/bench 1 in=64 out=16 n=4 any")
            h.config_path.write_text(h.config_path.read_text().replace('["alice", "bob"]', '["bob"]'))
            bot = Dispatcher(load_config(str(h.config_path)), h.r, plots_dir=h.work / "plots")
            denied = bot.handle("alice", CHANNEL, "/launch cutlass")
            assert not denied.ok and "not on this benchbot's access list" in denied.text
            theirs = bot.handle("bob", CHANNEL, f"/cancel {bench}")
            assert not theirs.ok and "belongs to alice" in theirs.text
            own = bot.handle("alice", CHANNEL, f"/cancel {bench}")
            assert own.ok and f"job {bench}" in own.text and "belongs" not in own.text, own.text
        finally:
            held.release()
        refused, _ = h.wait(stop)
        assert refused.type == "failed"
        assert "alice is no longer on this benchbot's access list" in refused.data["message"], refused.data
        assert h.engine_pids() == [engine]  # the refused /stop touched nothing
        assert h.wait(bench)[0].type == "cancelled"


def test_a_bench_with_a_profile_says_where_the_trace_is_on_the_host(host: BenchbotHost):
    """Issue 22.5 through the real path: a real worker launches, benches, and profiles 3 steps at c=4."""
    job = queue_job(host, "alice", f"/launch cutlass cudnn then bench {BENCH} profile=3")
    terminal, _ = host.wait(job)
    assert terminal.type == "succeeded", (terminal.data, host.worker_logs())
    record = store.get_run(host.r, run_id_of(terminal))
    assert record.params["profile_steps"] == 3 and record.concurrencies == [1, 4]  # the bench ran in full
    profile = record.extra["profile"]
    assert (profile["steps"], profile["load"], profile["note"]) == (3, 4.0, "")
    log_dir = host.config.hosts[HOST].log_dir
    assert profile["trace_dir"] == f"{log_dir}/profiles"
    assert len(profile["files"]) == 8  # one per TP rank of the simulated TP 8 server
    for f in profile["files"]:
        assert Path(f["path"]).parent == Path(log_dir) / "profiles"
        assert Path(f["path"]).stat().st_size == f["size_bytes"] > 0
    assert profile["total_bytes"] == sum(f["size_bytes"] for f in profile["files"])
    assert "profile: 3 steps at c=4: 8 trace file(s)" in terminal.data["bench"]["table"]  # what the thread shows
