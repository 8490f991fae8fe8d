"""The host fingerprint (issue 22 item 3): parsers on the documented nvidia-smi formats, collection from
the simulated host through a real transport, and /compare's line when two runs' hosts differ."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.factories import make_run
from workers.host.local import LocalTransport
from workers.results import tables
from workers.results.record import RunRecord
from workers.telemetry.fingerprint import (
    EXTRA_KEY,
    HostFingerprint,
    collect,
    compare_lines,
    differences,
    packages_argv,
)
from workers.telemetry.fingerprint_parse import (
    PACKAGES,
    PACKAGES_SCRIPT,
    Topology,
    parse_cuda_version,
    parse_gpu_facts,
    parse_packages,
    parse_topo,
)

FIX = Path(__file__).parent / "fixtures" / "nvidia_smi"
SIM_SMI = (sys.executable, "-m", "workers.sim.nvidia_smi")
SIM_ENGINE = (sys.executable, "-m", "workers.sim.sglang", "--model-path", "m")


def test_topology_keeps_the_gpu_matrix_and_drops_nic_columns_rows_and_legends() -> None:
    nvlink = parse_topo((FIX / "topo_nvlink.txt").read_text())
    assert nvlink is not None and nvlink.gpus == tuple(f"GPU{i}" for i in range(8))
    assert nvlink.links[0][0] == "X" and nvlink.links[3][5] == "NV18" and nvlink.kinds == ("NV18",)
    assert all(len(row) == 8 for row in nvlink.links)  # the NIC0/NIC1 columns are not GPU links
    pcie = parse_topo((FIX / "topo_pcie.txt").read_text())
    assert pcie is not None and pcie.summary == "4 GPUs, NODE/SYS"
    assert pcie.links[0][1] == "NODE" and pcie.links[1][2] == "SYS" and pcie.links[2][3] == "NODE"
    assert Topology.from_dict(pcie.to_dict()) == pcie


@pytest.mark.parametrize(
    "text",
    ["", "No devices were found\n", "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\n", "Legend:\n  X = Self\n"],
)
def test_topology_that_is_not_a_complete_matrix_is_none(text: str) -> None:
    assert parse_topo(text) is None


def test_cuda_version_from_the_screen_header_and_from_q() -> None:
    assert parse_cuda_version((FIX / "smi_screen.txt").read_text()) == "12.4"
    assert parse_cuda_version((FIX / "smi_q_head.txt").read_text()) == "12.8"
    assert parse_cuda_version("NVIDIA-SMI has failed because it couldn't communicate with the driver") is None


def test_gpu_facts_rows_and_unavailable_fields() -> None:
    facts = parse_gpu_facts((FIX / "query_facts.csv").read_text())
    assert [(f.index, f.name, f.driver, f.memory_mib, f.compute_cap) for f in facts] == [
        (0, "NVIDIA H200", "550.54.15", 143771, "9.0"),
        (1, "NVIDIA H200", "550.54.15", 143771, "9.0"),
    ]
    odd = parse_gpu_facts("0, Board, With Comma, [N/A], [N/A], [Not Supported]\nnonsense\n")
    assert [(f.name, f.driver, f.memory_mib, f.compute_cap) for f in odd] == [("Board, With Comma", None, None, None)]


def test_packages_script_runs_in_a_real_python_and_says_absent_as_none() -> None:
    out = subprocess.run([sys.executable, "-c", PACKAGES_SCRIPT], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    found = parse_packages(out.stdout)
    assert found is not None and set(found) == set(PACKAGES)
    assert found["torch"] is None  # the test venv has no torch: said as absent, not as an error
    assert parse_packages("warning: something\n") is None
    assert parse_packages('noise\n{"torch": "2.8.0", "triton": null}\n') == {"torch": "2.8.0", "triton": None}


def test_packages_are_asked_of_the_engines_own_python() -> None:
    argv = packages_argv(["/opt/venv/bin/python3", "-u", "-m", "sglang.launch_server", "--port", "1"])
    assert argv is not None and argv[:3] == ["/opt/venv/bin/python3", "-u", "-c"]
    console = packages_argv(["/opt/vllm/bin/vllm", "serve", "m"])
    assert console is not None and console[0] == "/opt/vllm/bin/python3"
    assert packages_argv(["vllm", "serve", "m"]) is None  # no interpreter benchbot can name
    wrapped = packages_argv(["/usr/bin/env", "-u", "X", "HF_TOKEN=hf_secret", "python3", "-m", "sglang.launch_server"])
    assert wrapped is not None and wrapped[:2] == ["python3", "-c"] and not any("hf_secret" in w for w in wrapped)


def _collect(nvidia_smi: tuple[str, ...], engine: tuple[str, ...] = SIM_ENGINE) -> HostFingerprint:
    return asyncio.run(collect(LocalTransport(), nvidia_smi, engine, "0.5.9"))


def test_the_simulated_host_answers_every_fact(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    smi = (*SIM_SMI, f"--sim-state-dir={tmp_path}")
    monkeypatch.setenv("BENCHBOT_SIM_PROFILE", "h100-x8")
    fp = _collect(smi)
    assert fp.missing == (), fp.missing
    assert (fp.gpu_name, fp.gpu_count, fp.cuda, fp.engine_version) == ("NVIDIA H100 80GB HBM3", 8, "13.0", "0.5.9")
    assert fp.driver and fp.topology is not None and fp.topology.kinds == ("NV18",)
    assert dict(fp.packages).keys() == set(PACKAGES)
    assert HostFingerprint.from_dict(json.loads(json.dumps(fp.to_dict()))) == fp  # survives the stored JSON
    monkeypatch.setenv("BENCHBOT_SIM_PROFILE", "rtx-pro-6000-x8")
    pcie = _collect(smi)
    diff = differences(fp, pcie)
    assert any(d.startswith("GPU NVIDIA H100 80GB HBM3 -> NVIDIA RTX PRO 6000") for d in diff), diff
    assert any(d.startswith("topology 8 GPUs, NV18 -> 8 GPUs, NODE/SYS") for d in diff), diff
    assert differences(fp, fp) == []


def test_a_host_without_nvidia_smi_or_python_is_reported_missing_never_raised() -> None:
    fp = _collect(("/nonexistent/nvidia-smi",), ("sglang", "serve"))
    assert fp.gpu_name is None and fp.topology is None and fp.cuda is None and fp.engine_version == "0.5.9"
    assert any(m.startswith("GPU query") for m in fp.missing) and any(m.startswith("topology") for m in fp.missing)
    assert any("names no Python" in m for m in fp.missing)
    garbled = _collect((sys.executable, "-c", "print('hello')"), (sys.executable, "-c", "print(1)", "-m", "x"))
    assert (
        "GPU query: output not understood" in garbled.missing and "topology: output not understood" in garbled.missing
    )


def _with_host(run: RunRecord, **facts: object) -> RunRecord:
    base = HostFingerprint(
        gpu_name="NVIDIA H200",
        gpu_count=8,
        driver="550.54.15",
        cuda="12.4",
        topology=parse_topo((FIX / "topo_nvlink.txt").read_text()),
        engine_version="0.5.9",
        packages=(("flashinfer-python", "0.4.1"), ("torch", "2.8.0"), ("vllm", None)),
    )
    fp = dataclasses.replace(base, **facts)  # type: ignore[arg-type]
    return dataclasses.replace(run, extra={**run.extra, EXTRA_KEY: fp.to_dict()})


def test_compare_flags_two_runs_whose_hosts_differ_beyond_the_config() -> None:
    a = _with_host(make_run("r1"))
    b = _with_host(
        make_run("r2", label="triton"),
        driver="580.95.05",
        packages=(("flashinfer-python", "0.5.0"), ("torch", "2.8.0"), ("vllm", None)),
    )
    same = _with_host(make_run("r3", label="triton"))
    text = tables.compare_table([a, b, same])
    flagged = [line for line in text.splitlines() if line.startswith("not only the config differs")]
    assert flagged == [
        "not only the config differs: r2 vs r1: driver 550.54.15 -> 580.95.05; flashinfer 0.4.1 -> 0.5.0"
    ]
    assert "not only the config differs" not in tables.compare_table([a, same])


def test_compare_of_two_engines_names_their_kinds_beside_the_versions() -> None:
    """Issue 36 item 5: an SGLang run against a vLLM run reads "engine sglang 0.5.9 -> vllm 0.34.0", not
    "engine 0.5.9 -> 0.34.0"; two runs of one engine name it once, and a change of engine is said
    even where a version is unknown."""

    def of(run_id: str, kind: str, version: str | None) -> RunRecord:
        run = _with_host(make_run(run_id), engine_version=version)
        return dataclasses.replace(run, config={**run.config, "engine_kind": kind})

    sglang, vllm, newer = of("r1", "sglang", "0.5.9"), of("r2", "vllm", "0.34.0"), of("r3", "sglang", "0.5.23")
    flagged = [line for line in tables.compare_table([sglang, vllm, newer]).splitlines() if "engine" in line]
    assert flagged == [
        "not only the config differs: r2 vs r1: engine sglang 0.5.9 -> vllm 0.34.0",
        "not only the config differs: r3 vs r1: engine sglang 0.5.9 -> 0.5.23",
    ]
    unknown = of("r4", "vllm", None)
    assert compare_lines([("r1", sglang.extra[EXTRA_KEY], "sglang"), ("r4", unknown.extra[EXTRA_KEY], "vllm")]) == [
        "not only the config differs: r4 vs r1: engine sglang -> vllm"
    ]


def test_compare_names_runs_without_a_fingerprint_and_older_pairs_say_nothing() -> None:
    a = _with_host(make_run("r1"))
    old = make_run("r2")
    assert compare_lines([("r1", a.extra[EXTRA_KEY], "sglang"), ("r2", None, "sglang")]) == [
        "no host fingerprint stored for r2: its host cannot be compared"
    ]
    assert compare_lines([("r1", None, ""), ("r2", None, "")]) == []
    assert "fingerprint" not in tables.compare_table([make_run("r1"), old])


def test_the_level_table_names_the_host() -> None:
    run = _with_host(make_run("r1"))
    text = tables.format_levels_table(run)
    assert "host: 8x NVIDIA H200, driver 550.54.15, CUDA 12.4, NV18, flashinfer 0.4.1, torch 2.8.0" in text


def test_slash_compare_through_the_store_says_the_hosts_differ(redis_client: redis.Redis, tmp_path: Path) -> None:
    from bot.dispatch import Dispatcher
    from tests.test_dispatch import CONFIG_TEXT
    from workers.config import parse_config
    from workers.results import store

    a = store.save_run(redis_client, _with_host(make_run("r1")))
    b = store.save_run(
        redis_client,
        _with_host(make_run("r2"), gpu_name="NVIDIA B200", topology=parse_topo((FIX / "topo_pcie.txt").read_text())),
    )
    dispatcher = Dispatcher(parse_config(CONFIG_TEXT), redis_client, plots_dir=tmp_path, observe_timeout_s=0.2)
    reply = dispatcher.handle("alice", "C-bench", f"/compare {a} {b}")
    assert reply.ok, reply.text
    assert (
        "not only the config differs: r2 vs r1: GPU NVIDIA H200 -> NVIDIA B200; "
        "topology 8 GPUs, NV18 -> 4 GPUs, NODE/SYS" in reply.text
    )


def test_the_fingerprint_crosses_a_real_ssh_server_with_every_word_quoted(tmp_path: Path) -> None:
    """The package script (newlines, quotes, braces, parentheses) reaches the remote Python intact."""
    from tests.sshd import asyncssh_server

    smi = (*SIM_SMI, f"--sim-state-dir={tmp_path / 'state'}")

    async def scenario(server: object) -> HostFingerprint:
        async with server.transport() as t:  # type: ignore[attr-defined]
            return await collect(t, smi, SIM_ENGINE, "0.5.9")

    (tmp_path / "ssh").mkdir()
    with asyncssh_server(tmp_path / "ssh") as server:
        fp = asyncio.run(scenario(server))
    assert fp.missing == (), fp.missing
    assert fp.gpu_count == 8 and fp.topology is not None and fp.cuda
    assert dict(fp.packages).keys() == set(PACKAGES)
