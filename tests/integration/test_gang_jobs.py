"""A gang job end to end (issue 38's first done-when): real RQ workers, real Redis, two simulated hosts that rendezvous.

``/launch nextn on pair then bench 1,8`` starts rank 0 on pair-a and rank 1 on pair-b (each with its rank's
``--nnodes/--node-rank/--dist-init-addr``), benches through the head, and ``/stop pair`` leaves both hosts
with their ports and GPUs free; a rank killed mid-bench ends the job with a diagnosis naming it, and the
other rank is stopped. One group of hosts for the module (its workers start once).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from tests.integration.harness import BenchbotHost, first
from tests.util import free_port, wait_until
from workers.jobs import events
from workers.results import store

#: Each test launches two simulated engines and benches them: ~45 s alone, past 120 s on the loaded 2-core box.
pytestmark = pytest.mark.timeout(300)

GROUP_TOML = """
[groups.pair]
hosts = ["pair-a", "pair-b"]
port = {port}
[groups.pair.engine]
flags = {{ "--tp-size" = 16, "--quantization" = "modelopt_fp4", "--disable-custom-all-reduce" = true }}
# exact, fast timing (the bench's numbers are not what is tested here)
env = {{ BENCHBOT_SIM_TIMING = "fixed", BENCHBOT_SIM_TTFT_MS = "5", BENCHBOT_SIM_ITL_MS = "1" }}
"""


@pytest.fixture(scope="module")
def gang(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BenchbotHost]:
    work = tmp_path_factory.mktemp("gang")
    with BenchbotHost(
        redis_url,
        work,
        workers=1,
        more_hosts={"pair-a": "", "pair-b": ""},
        extra_toml=GROUP_TOML.format(port=free_port()),
        sim_startup_s=0.5,
        launch_timeout_s=40,
        lease_ttl_s=10,  # not what is tested here; a 3 s lease is lost on a loaded 2-core box
    ) as h:
        yield h


def reply_job(seen: list[events.Event]) -> str:
    return str(seen[0].job)


def _ranks(h: BenchbotHost) -> tuple[list[int], list[int]]:
    return h.engine_pids("pair-a"), h.engine_pids("pair-b")


def test_launch_on_a_group_runs_both_ranks_benches_through_the_head_and_stop_frees_both(gang: BenchbotHost) -> None:
    h = gang
    terminal, seen = h.launch_ok("alice", "/launch nextn on pair then bench 1,8", timeout=150)
    started = first(seen, events.STARTED)
    assert started.data["host"] == "pair-a"  # queued and started on the first member, holding both
    ready = first(seen, events.READY)
    assert [(r["rank"], r["host"]) for r in ready.data["gang"]["ranks"]] == [(0, "pair-a"), (1, "pair-b")]
    argv = ready.data["launch"]["argv"]
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "0"
    assert ready.data["config"]["host"] == "pair-a" and ready.data["config"]["port"] == h.ports["pair-a"]
    assert ready.data["config"]["state"] == "running", ready.data["config"]
    assert terminal.data["bench"]["valid"] is True, terminal.data["bench"]
    run = store.get_run(h.r, terminal.data["bench"]["run_id"])
    assert (run.host, run.job_id) == ("pair-a", reply_job(seen))  # measured through the head
    assert [level["concurrency"] for level in run.levels] == [1, 8]
    assert run.config["server"]["args"]["tp_size"] == 16 and run.config["launched_by"]["job"] == reply_job(seen)
    members = run.extra["gang"]["members"]  # the fingerprint lists each member
    assert [(m["rank"], m["host"]) for m in members] == [(0, "pair-a"), (1, "pair-b")]
    assert all(m["fingerprint"]["gpu_count"] == 8 for m in members), members
    head, follower = _ranks(h)
    assert len(head) == 1 and len(follower) == 1  # both ranks run after the launch

    stopped, _ = h.launch_ok("alice", "/stop pair", timeout=60)
    message = stopped.data["message"]
    assert "pair-a: stopped" in message and "pair-b: stopped" in message, message
    assert "pair-a: ports" in message and "pair-b: port" in message and message.count("GPUs free") == 2, message
    assert _ranks(h) == ([], [])


def test_a_rank_killed_mid_bench_ends_the_job_naming_it_and_the_other_rank_is_stopped(gang: BenchbotHost) -> None:
    h = gang
    reply = h.run("alice", "/launch nextn on pair then bench 1,8 n=4000 out=64")
    assert reply.ok and reply.job_id, reply.text
    wait_until(
        lambda: any(
            e.type == events.PROGRESS and e.data.get("phase") == "bench" for e in events.job_events(h.r, reply.job_id)
        ),
        timeout=120,
        what="the gang's bench to start",
    )
    (victim,) = h.engine_pids("pair-b")
    os.kill(victim, signal.SIGKILL)  # the fault: rank 1 dies (the test's own simulated engine)
    terminal, _ = h.wait(reply.job_id, timeout=90)
    assert terminal.type == events.FAILED, terminal.data
    diagnosis = terminal.data["diagnosis"]
    assert diagnosis["category"] == "rank_died" and diagnosis["host"] == "pair-b" and diagnosis["rank"] == 1
    assert diagnosis["summary"].startswith("rank 1 on pair-b died during the bench"), diagnosis["summary"]
    assert diagnosis["log_tail"], diagnosis  # its last log lines
    assert "benchbot stopped every rank" in diagnosis["summary"] and "pair-a: ports" in diagnosis["summary"]
    assert _ranks(h) == ([], [])  # the head was stopped too
