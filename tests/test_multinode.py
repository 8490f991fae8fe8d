"""The multi-node argv table (issue 38 item 3) against the recorded contracts, and the simulator's rendezvous (item 7).

Every flag the table may add is an option of every recorded release of its engine (nothing invented); an
engine with no recorded node-rank option is refused with its reason. Two simulated SGLang ranks meet at
``--dist-init-addr`` and only the head serves; a rank slow to join still joins; a rank that cannot reach
the head exits with the simulator's own line (no recorded text exists for it, said so in
``workers/sim/rendezvous.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.util import free_port, wait_until
from workers.engines import multinode
from workers.engines.contract import all_contracts
from workers.errors import BenchbotError
from workers.sim import rendezvous

MODEL = "nvidia/Qwen3.5-397B-A17B-NVFP4"


@pytest.mark.parametrize("kind", sorted(multinode.FORMS))
def test_every_multinode_flag_is_recorded_in_every_release(kind: str) -> None:
    form = multinode.FORMS[kind]
    contracts = all_contracts(kind)
    assert contracts
    for contract in contracts:
        assert multinode.unrecorded(form, contract) == [], contract.label()
        assert contract.check_flags(form.flags(nnodes=2, rank=1, head="10.0.0.1", port=5000)) == [], contract.label()


def test_rank_flags_are_filled_in_and_followers_get_theirs() -> None:
    sglang = multinode.FORMS["sglang"]
    assert sglang.flags(nnodes=2, rank=1, head="10.0.0.1", port=5000) == (
        ("--nnodes", "2"),
        ("--node-rank", "1"),
        ("--dist-init-addr", "10.0.0.1:5000"),
    )
    vllm = multinode.FORMS["vllm"]
    assert ("--headless", True) in vllm.flags(nnodes=2, rank=1, head="h", port=1)
    assert ("--headless", True) not in vllm.flags(nnodes=2, rank=0, head="h", port=1)
    assert multinode.without_rank_flags(sglang, {"--nnodes": "2", "--tp-size": "16"}) == {"--tp-size": "16"}


def test_an_engine_without_a_recorded_rank_option_is_refused_with_why() -> None:
    with pytest.raises(BenchbotError, match="MPI launch"):
        multinode.form_for("trtllm", "TensorRT-LLM")
    assert not any("node" in opt.dest for c in all_contracts("trtllm") for opt in c.options if "rank" in opt.dest)


def _rank(tmp: Path, rank: int, port: int, meet: int, *extra: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "workers.sim.sglang", "--model-path", MODEL, "--port", str(port)]
    argv += ["--tp-size", "16", "--quantization", "modelopt_fp4", "--disable-custom-all-reduce"]
    argv += ["--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", f"127.0.0.1:{meet}"]
    argv += ["--sim-startup-s", "0.5", "--sim-state-dir", str(tmp / f"state{rank}"), *extra]
    log = open(tmp / f"rank{rank}.log", "wb")  # noqa: SIM115 - the child writes it; closed with the test's tmp
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def test_two_simulated_ranks_meet_the_head_serves_and_a_rank_that_cannot_reach_it_says_so(tmp_path: Path) -> None:
    head_port, follower_port, meet = free_port(), free_port(), free_port()
    procs = [
        _rank(tmp_path, 0, head_port, meet),
        _rank(tmp_path, 1, follower_port, meet, "--sim-join-delay-s", "1.5"),  # slow to join, still in time
    ]
    try:
        wait_until(
            lambda: "fired up and ready" in (tmp_path / "rank0.log").read_text(), timeout=60, what="the head to serve"
        )
        assert httpx.get(f"http://127.0.0.1:{head_port}/health", timeout=5).status_code == 200
        follower = (tmp_path / "rank1.log").read_text()
        assert "Init torch distributed ends." in follower and procs[1].poll() is None
        with pytest.raises(httpx.ConnectError):  # a rank above 0 serves no HTTP
            httpx.get(f"http://127.0.0.1:{follower_port}/health", timeout=2)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=20)
    lonely = _rank(tmp_path, 1, free_port(), free_port(), "--sim-join-timeout-s", "1")
    assert lonely.wait(timeout=60) == 1
    last = (tmp_path / "rank1.log").read_text().strip().splitlines()[-1]
    assert last.endswith(rendezvous.UNREACHABLE_HEAD.format(rank=1, addr=last.split(" at ")[1].split()[0], timeout=1))
