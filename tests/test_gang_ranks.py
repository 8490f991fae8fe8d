"""Naming the rank that failed a gang launch (issue 38 item 3): a rank that died, one that never joined, else the head;
and /compare's word on runs with different member hosts (item 5).

Real processes on the local transport stand for the ranks (a ``sleep``, and one that has already exited), with
real log files; the diagnosis must name the rank, its host and its last log lines.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from workers.config import HostConfig
from workers.engines.diagnosis import Diagnosis
from workers.gang import fingerprints
from workers.gang.launch import blame_head_failure
from workers.gang.ranks import Rank
from workers.host.local import LocalTransport
from workers.host.transport import SpawnedProcess

HEAD_LOG = "[2026-12-07 00:00:00 TP0] Init torch distributed begin.\n"


async def _rank(rank: int, host: str, log: Path, text: str, proc: subprocess.Popen[bytes]) -> Rank:
    log.write_text(text)
    transport = LocalTransport(name=host)
    info = await transport.process_info(proc.pid)
    ticks = info.start_ticks if info is not None else 1
    r = Rank(rank, HostConfig(name=host), ctx=None, transport=transport)  # type: ignore[arg-type]
    r.spawned, r.log_path = SpawnedProcess(proc.pid, proc.pid, str(log), ticks), str(log)
    return r


def _run(tmp_path: Path, follower_text: str, follower_alive: bool) -> dict[str, object]:
    head_proc = subprocess.Popen(["sleep", "30"])
    follower_proc = subprocess.Popen(["sleep", "30" if follower_alive else "0"])
    if not follower_alive:
        follower_proc.wait()

    async def go() -> dict[str, object]:
        ranks = [
            await _rank(0, "gpu-a", tmp_path / "a.log", HEAD_LOG, head_proc),
            await _rank(1, "gpu-b", tmp_path / "b.log", follower_text, follower_proc),
        ]
        head = Diagnosis("timeout", "it did not answer within 40 s", "", "")
        failed = await blame_head_failure(ranks, head)
        assert isinstance(failed.diagnosis, dict)
        return failed.diagnosis

    try:
        return asyncio.run(go())
    finally:
        for proc in (head_proc, follower_proc):
            proc.kill()
            proc.wait()


def test_a_rank_that_never_joined_is_named_with_its_last_lines(tmp_path: Path) -> None:
    d = _run(tmp_path, "loading\n[2026-12-07 00:00:01 TP0] Init torch distributed begin.\n", follower_alive=True)
    assert d["category"] == "rank_never_joined" and (d["rank"], d["host"]) == (1, "gpu-b")
    assert d["summary"] == "rank 1 on gpu-b never joined the head (rank 0 on gpu-a) before the launch deadline"
    assert d["evidence_line"] == "[2026-12-07 00:00:01 TP0] Init torch distributed begin."
    assert d["log_tail"] == ["loading", "[2026-12-07 00:00:01 TP0] Init torch distributed begin."]


def test_a_rank_that_died_is_named(tmp_path: Path) -> None:
    d = _run(tmp_path, "x\ntorch.OutOfMemoryError: CUDA out of memory.\n", follower_alive=False)
    assert d["category"] == "rank_died" and d["summary"] == "rank 1 on gpu-b died before the gang was ready"
    assert d["evidence_line"] == "torch.OutOfMemoryError: CUDA out of memory."


def test_with_every_rank_joined_the_heads_own_diagnosis_names_the_head(tmp_path: Path) -> None:
    d = _run(
        tmp_path, "[2026-12-07 00:00:02 TP0] Init torch distributed ends. mem usage=0.38 GB\n", follower_alive=True
    )
    assert (d["rank"], d["host"], d["category"]) == (0, "gpu-a", "timeout")
    assert d["summary"] == "rank 0 on gpu-a (the head): it did not answer within 40 s"


def test_compare_says_when_two_runs_had_different_member_hosts() -> None:
    pair = fingerprints.members_extra("pair", [(0, "pair-a", {}), (1, "pair-b", {})])
    other = fingerprints.members_extra("pair2", [(0, "pair-a", {}), (1, "pair-c", {})])
    assert fingerprints.compare_lines([("r1", "pair-a", pair), ("r2", "pair-a", pair)]) == []
    assert fingerprints.compare_lines([("r1", "pair-a", pair), ("r2", "pair-a", other), ("r3", "gpu-1", {})]) == [
        "different member hosts: r2 ran on pair-a, pair-c, r1 on pair-a, pair-b",
        "different member hosts: r3 ran on gpu-1, r1 on pair-a, pair-b",
    ]
    assert fingerprints.compare_lines([("r1", "gpu-1", {}), ("r2", "gpu-2", {})]) == []  # one-host runs: as before
