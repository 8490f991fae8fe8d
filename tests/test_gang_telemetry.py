"""A gang's telemetry summed over its members (issue 38 item 5), sampled for real: each member's ``nvidia-smi``
stand-in (its own state dir, read through its own local transport) while a level runs, then summed per level.

The simulated GPUs' power is known: ``gpu_state.power_w`` of the utilisation a sim server publishes in the
host's registry. The busy member here is such an entry (this test's own pid, so it counts as alive); the
other member's GPUs are idle. A member whose nvidia-smi cannot be run is named in the level's ``missing``
and the gang's sum is left out, never a sum of fewer members. And ``/compare``'s table names differing member
hosts (the fingerprint's other half of item 5).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from pathlib import Path

import pytest

from tests.factories import make_run
from tests.util import async_wait_until
from workers.config import HostConfig
from workers.gang import fingerprints
from workers.gang import telemetry as gang_telemetry
from workers.host.local import LocalTransport
from workers.results.record import RunRecord
from workers.results.tables import compare_table
from workers.sim import registry
from workers.sim.gpu_state import power_w
from workers.sim.profile import load_profile
from workers.telemetry.summary import attach, run_extra

SIM_SMI = (sys.executable, "-m", "workers.sim.nvidia_smi")
BUSY_UTIL = 50
LEVEL = {"duration_s": 2.0, "output_tokens": 400.0, "output_tok_s": 200.0}


def _host(name: str, state: Path, nvidia_smi: tuple[str, ...] = SIM_SMI) -> HostConfig:
    return HostConfig(name=name, nvidia_smi=nvidia_smi, env={"BENCHBOT_SIM_STATE_DIR": str(state)})


def _busy(state: Path) -> None:
    """A sim server's registry entry on every GPU at BUSY_UTIL %, 10 + 20 MB/s PCIe each (this process)."""
    registry.register(
        registry.state_dir(str(state)),
        {"pid": os.getpid(), "gpus": list(range(8)), "util": BUSY_UTIL, "pcie_rx_mbs": 10, "pcie_tx_mbs": 20},
    )


def _level(hosts: list[HostConfig]) -> dict:
    """One level sampled on every member (at least two ticks each), summarized as the bench stores it."""

    async def go() -> dict:
        tel = gang_telemetry.for_gang([(rank, host, LocalTransport()) for rank, host in enumerate(hosts)])
        samplers = [tel, *(m.tel for m in tel.members)]
        for sampler in samplers:
            sampler.interval_s = 0.1

        async def sampled() -> bool:
            return all(len(s.levels[0]) >= 2 for s in samplers)

        async with tel.level(0, 1):
            await async_wait_until(sampled, timeout=30, what="two ticks on every member")
        (level,) = attach(tel, 0, [dict(LEVEL)])
        return level

    return asyncio.run(go())


@pytest.fixture
def states(tmp_path: Path) -> tuple[Path, Path]:
    head, follower = tmp_path / "sim-a", tmp_path / "sim-b"
    _busy(head)
    registry.state_dir(str(follower))
    return head, follower


def test_a_gang_level_sums_every_members_power_and_keeps_each_members_own(states: tuple[Path, Path]) -> None:
    head_state, follower_state = states
    level = _level([_host("pair-a", head_state), _host("pair-b", follower_state)])
    tel = level["telemetry"]
    profile = load_profile(None)
    busy_w, idle_w = profile.count * power_w(profile, BUSY_UTIL), profile.count * power_w(profile, 0)
    head, follower = tel["members"]
    assert (head["rank"], head["host"], follower["rank"], follower["host"]) == (0, "pair-a", 1, "pair-b")
    assert head["total"]["power_w"]["mean"] == pytest.approx(busy_w, abs=0.01)
    assert follower["total"]["power_w"]["mean"] == pytest.approx(idle_w, abs=0.01)
    assert set(head["gpus"]) == set(follower["gpus"]) == {str(i) for i in range(8)} and "gpus" not in tel
    # the gang's figures are the members' sums, over the tokens the head served
    assert tel["total"]["power_w"]["mean"] == pytest.approx(busy_w + idle_w, abs=0.01)
    assert tel["total"]["power_w"]["max"] == pytest.approx(busy_w + idle_w, abs=0.01)
    assert tel["energy_j"] == pytest.approx(head["energy_j"] + follower["energy_j"], abs=0.01)
    assert tel["energy_j"] == pytest.approx((busy_w + idle_w) * LEVEL["duration_s"], abs=0.01)
    assert tel["j_per_tok"] == pytest.approx(tel["energy_j"] / LEVEL["output_tokens"], abs=1e-4)
    assert tel["j_per_tok"] == pytest.approx(head["j_per_tok"] + follower["j_per_tok"], abs=1e-4)
    assert tel["tok_s_per_w"] == pytest.approx(LEVEL["output_tok_s"] / (busy_w + idle_w), abs=1e-4)
    assert head["total"]["pcie_mbs"]["mean"] == 8 * 30 and follower["total"]["pcie_mbs"]["mean"] == 0
    assert tel["pcie_bytes"] == head["pcie_bytes"] + follower["pcie_bytes"] == 8 * 30 * 1e6 * LEVEL["duration_s"]
    assert all(row[1] == pytest.approx(busy_w + idle_w, abs=0.01) for row in tel["timeline"]), tel["timeline"]
    # nothing GPU-side is missing; the head's /metrics (nobody serves it here) is said as on one host
    assert head["missing"] == follower["missing"] == []
    assert [m for m in tel["missing"] if "pair-" in m] == [] and any("/metrics" in m for m in tel["missing"])
    assert run_extra((level,))["telemetry"]["j_per_tok"] == tel["j_per_tok"]


def test_a_member_without_an_nvidia_smi_answer_is_named_and_the_gang_is_not_summed(
    states: tuple[Path, Path], tmp_path: Path
) -> None:
    head_state, _ = states
    broken = _host("pair-c", tmp_path / "sim-c", nvidia_smi=(str(tmp_path / "no-such-nvidia-smi"),))
    level = _level([_host("pair-a", head_state), broken])
    tel = level["telemetry"]
    head, follower = tel["members"]
    assert follower["host"] == "pair-c" and follower["total"] == {"power_w": None, "pcie_mbs": None}
    assert follower["energy_j"] is None and follower["missing"], follower
    assert head["energy_j"] is not None  # the member that answered keeps its own figures
    assert tel["total"] == {"power_w": None, "pcie_mbs": None}
    assert tel["energy_j"] is None and tel["j_per_tok"] is None and tel["pcie_bytes_per_tok"] is None
    named = [m for m in tel["missing"] if m.startswith("pair-c (rank 1): ")]
    assert named and named[0].startswith("pair-c (rank 1): no nvidia-smi on the host"), tel["missing"]
    assert "the gang's GPU power is not summed: no GPU power sample from pair-c (rank 1)" in tel["missing"]
    assert all(row[1] is None for row in tel["timeline"])


def test_compare_names_the_member_hosts_when_two_gang_runs_ran_on_different_ones() -> None:
    def gang_run(run_id: str, *hosts: str) -> RunRecord:
        run = make_run(run_id, host=hosts[0], levels=(1,))
        members = fingerprints.members_extra("pair", [(rank, host, {}) for rank, host in enumerate(hosts)])
        return dataclasses.replace(run, extra={**run.extra, **members})

    same = compare_table([gang_run("r1", "pair-a", "pair-b"), gang_run("r2", "pair-a", "pair-b")])
    assert "different member hosts" not in same
    table = compare_table([gang_run("r1", "pair-a", "pair-b"), gang_run("r2", "pair-a", "pair-c")])
    assert "different member hosts: r2 ran on pair-a, pair-c, r1 on pair-a, pair-b" in table.splitlines(), table
