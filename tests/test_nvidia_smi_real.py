"""Every nvidia-smi parser over every real capture in ``tests/fixtures/nvidia_smi/real`` (issue 22: "parsers are
tested on recorded real formats").

Each capture's source, board, driver and what was trimmed are in ``tests/fixtures/nvidia_smi/README.md``; the
tables below say what each capture really shows (GPU count, a link between two GPUs, the CUDA version in its
header, rx/tx of a row), so a parser that misreads a real format fails here. A capture added to the folder
without a line in these tables, or without a row in the README, fails too.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from workers.host.local import LocalTransport
from workers.observation import GPU_QUERY, parse_nvidia_smi
from workers.telemetry.fingerprint import collect
from workers.telemetry.fingerprint_parse import (
    FACT_FIELDS,
    Topology,
    parse_cuda_version,
    parse_gpu_facts,
    parse_topo,
)
from workers.telemetry.gpu_parse import QUERY_FIELDS, parse_dmon, parse_query

REAL = Path(__file__).parent / "fixtures" / "nvidia_smi" / "real"
README = REAL.parent / "README.md"

#: ``topo -m`` captures: GPU count, the distinct GPU-to-GPU link kinds, and a few cells ``(i, j): kind``.
TOPO: dict[str, tuple[int, tuple[str, ...], dict[tuple[int, int], str]] | None] = {
    "topo_8gpu_nv18_9nic_nccl1453.txt": (8, ("NV18",), {(0, 1): "NV18", (3, 4): "NV18", (7, 6): "NV18"}),
    "topo_8gpu_nv18_12nic_vllm13855.txt": (8, ("NV18",), {(0, 1): "NV18", (4, 7): "NV18"}),
    "topo_8gpu_nv1_nv2_old_nccltests29_spaces.txt": (
        8,
        ("NV1", "NV2", "SYS"),
        {(0, 1): "NV2", (0, 3): "NV1", (0, 5): "SYS", (4, 7): "NV1", (6, 2): "NV2"},
    ),
    "topo_2gpu_nv12_8nic_vllm19607_spaces.txt": (2, ("NV12",), {(0, 1): "NV12"}),
    "topo_2x5090_phb_club3090_1140.txt": (2, ("PHB",), {(0, 1): "PHB"}),
    "topo_5gpu_pcie_club3090_46_spaces.txt": (
        5,
        ("NODE", "PHB", "SYS"),
        {(0, 1): "SYS", (1, 2): "PHB", (1, 3): "NODE", (3, 4): "PHB", (2, 4): "NODE"},
    ),
    "topo_4xt4_old_nccl428_spaces.txt": (4, ("NODE", "SYS"), {(0, 1): "SYS", (1, 2): "NODE", (2, 3): "NODE"}),
    "topo_h200x1_590.48.01_ansi.txt": (1, (), {}),
    "topo_rtx2080s_610.57.04_ansi.txt": (1, (), {}),
    "topo_rtx2080s_win_610.62_no_affinity.txt": (1, (), {}),
    "topo_rtx2080s_win_591.86_error.txt": None,  # nvidia-smi's own error text, not a matrix
}

#: ``dmon`` captures: ``(gpu, rxpci, txpci)`` of every row the parser must read (MB/s).
DMON: dict[str, list[tuple[int, float | None, float | None]]] = {
    "dmon_s_t_unnamed156540825.txt": [(0, 60, 13), (0, 72, 12)],
    # -o DT prefixes date and time; the last row has a "^C" echoed into it and is skipped, not shifted
    "dmon_pucvmet_DT_unnamed70599337214.txt": [(0, 0, 2), (0, 0, 0), (0, 0, 2)],
    # the default groups (-s puc) have no PCIe columns: no readings rather than another column's numbers
    "dmon_default_h100_590.48.01_load.txt": [],
    "dmon_default_h100_mig_590.48.01.txt": [],
    "dmon_not_supported_gt640_415.27_keylase89.txt": [],
}

#: The plain screen and ``-q``: the CUDA version their header states (None where it states none).
CUDA: dict[str, str | None] = {
    "smi_rtx5090_570.124.06.txt": "12.8",
    "q_rtx5090_570.124.06.txt": "12.8",
    "smi_h200_550.90.12.txt": "12.4",
    "q_h200_550.90.12.txt": "12.4",
    "smi_h200_590.48.01.txt": "13.1",
    "q_h200_590.48.01.txt": "13.1",
    "smi_l40s_595.80_load.txt": "13.2",
    "smi_rtx2080s_610.57.04_kmd.txt": "13.3",  # "CUDA UMD Version: 13.3"
    "q_rtx2080s_610.57.04.txt": "13.3",
    "smi_gt640_415.27_keylase89.txt": "10.0",
    "q_gtx780_450.66_head_sysmon12.txt": "11.0",
    "smi_gtx1060_387.12_no_cuda_netdata2922.txt": None,  # drivers before 410 printed no CUDA field
    "smi_rtx5070_575.64.03_cuda_na_libc6shim14.txt": None,  # "CUDA Version: N/A"
    "q_rtxpro6000_580.105.06_cuda_not_found_cubecos312.txt": None,  # "CUDA Version : Not Found"
}


@dataclass(frozen=True)
class Stated:
    """What a recorded ``--query-gpu`` capture states about its one GPU."""

    name: str
    driver: str
    memory_total_mib: int
    compute_cap: str
    power_w: float
    util_pct: float | None
    memory_used_mib: int
    clocks_mhz: tuple[int, int]  # SM, memory
    temperature_c: int


#: Recorded ``--query-gpu=<~200 fields> --format=csv`` captures (header and units) and what they state.
QUERY: dict[str, Stated] = {
    # MIG on: utilisation is "[N/A]"
    "query_all_h100_mig_590.48.01.csv": Stated(
        "NVIDIA H100 80GB HBM3", "590.48.01", 81559, "9.0", 71.15, None, 59, (345, 2619), 42
    ),
    "query_all_l40s_595.80_load.csv": Stated("NVIDIA L40S", "595.80", 46068, "8.9", 110.23, 9, 1235, (2520, 9001), 54),
    "query_all_rtx2080s_610.57.04.csv": Stated(
        "NVIDIA GeForce RTX 2080 SUPER", "610.57.04", 8192, "7.5", 39.17, 0, 211, (765, 810), 33
    ),
}
#: A query with another field set and order, header kept: no parser may read it as its own fields.
OTHER_QUERY = "query_facts_reordered_570.86.15_triton8070.csv"

#: ``--help-query-gpu`` names these two by their long names in a header; both are accepted in a query.
_ALIASES = {"clocks.sm": "clocks.current.sm", "clocks.mem": "clocks.current.memory"}


def _text(name: str) -> str:
    return (REAL / name).read_text(encoding="utf-8")


def _requested(capture: str, fields: Sequence[str]) -> str:
    """What ``--query-gpu=FIELDS --format=csv,noheader,nounits`` prints, rebuilt from a recorded ``--format=csv``.

    The captures asked for every field with a header and units, so the exact form the parsers read is derived
    here, not recorded: the columns the header names, each value without the unit its header gives in brackets
    (``power.draw [W]`` and ``71.15 W`` -> ``71.15``; ``[N/A]`` has no unit and stays).
    """
    lines = capture.splitlines()
    header = lines[0].split(", ")
    names = [h.split(" [")[0] for h in header]
    out = []
    for line in lines[1:]:
        values = line.split(", ")
        assert len(values) == len(header), line[:80]  # no value of these captures holds ", "
        row = []
        for field in fields:
            at = names.index(_ALIASES.get(field, field))
            unit = header[at].partition(" [")[2].rstrip("]")
            value = values[at]
            row.append(value.removesuffix(f" {unit}") if unit else value)
        out.append(", ".join(row))
    return "\n".join(out) + "\n"


def test_every_capture_has_expectations_here_and_a_source_in_the_readme() -> None:
    files = {p.name for p in REAL.iterdir()}
    expected = {*TOPO, *DMON, *CUDA, *QUERY, OTHER_QUERY}
    assert files == expected
    readme = README.read_text(encoding="utf-8")
    assert [name for name in sorted(files) if f"`{name}`" not in readme] == []


@pytest.mark.parametrize("name", sorted(TOPO))
def test_topology_of_each_real_capture(name: str) -> None:
    want = TOPO[name]
    topo = parse_topo(_text(name))
    if want is None:
        assert topo is None
        return
    count, kinds, cells = want
    assert topo is not None
    assert topo.gpus == tuple(f"GPU{i}" for i in range(count)) and topo.kinds == kinds
    assert {ij: topo.links[ij[0]][ij[1]] for ij in cells} == cells
    # a shifted column breaks this: the matrix is symmetric with X exactly on the diagonal
    for i in range(count):
        assert [topo.links[i][j] == "X" for j in range(count)] == [j == i for j in range(count)]
        assert [topo.links[i][j] for j in range(count)] == [topo.links[j][i] for j in range(count)]
    assert Topology.from_dict(topo.to_dict()) == topo


@pytest.mark.parametrize(
    "path",
    [
        *(REAL / n for n in sorted(TOPO) if "\t" in (REAL / n).read_text(encoding="utf-8")),
        REAL.parent / "topo_nvlink.txt",
        REAL.parent / "topo_pcie.txt",
    ],
    ids=lambda p: p.name,
)
def test_topology_reads_the_same_from_the_tab_form_and_a_paste_that_lost_its_tabs(path: Path) -> None:
    tabbed = path.read_text(encoding="utf-8")
    assert parse_topo(tabbed) is not None and parse_topo(tabbed.expandtabs(8)) == parse_topo(tabbed)


def test_the_space_pasted_captures_really_lost_their_tabs() -> None:
    # the README calls these pastes whose tabs became spaces; their own tests above show the parser's tolerance
    spaced = [n for n in TOPO if n.endswith("_spaces.txt")]
    assert len(spaced) == 4 and all("\t" not in _text(n) for n in spaced)


def test_the_underlined_header_of_a_recorded_topo_is_read_through_its_escapes() -> None:
    text = _text("topo_h200x1_590.48.01_ansi.txt")
    assert text.splitlines()[0].startswith("\t\x1b[4mGPU0\t") and "\x1b[0m" in text  # as nvidia-smi wrote it
    topo = parse_topo(text)
    assert topo is not None and topo.links == (("X",),) and topo.summary == "1 GPU, single GPU"


def test_a_run_together_nic_header_cuts_nic_columns_only() -> None:
    text = _text("topo_8gpu_nv18_12nic_vllm13855.txt")
    assert "\tNIC8NIC9\t" in text and "\tNODENODE\t" in text  # nvidia-smi's own rendering past ten NICs
    topo = parse_topo(text)
    assert topo is not None and len(topo.gpus) == 8 and topo.kinds == ("NV18",)


@pytest.mark.parametrize("name", sorted(DMON))
def test_pcie_rows_of_each_real_dmon_capture(name: str) -> None:
    got = [(r.index, r.rx_mbs, r.tx_mbs) for r in parse_dmon(_text(name))]
    assert got == DMON[name]
    if not DMON[name]:
        assert "rxpci" not in _text(name)  # empty because the capture has no PCIe columns, not by misreading


@pytest.mark.parametrize("name", sorted(CUDA))
def test_cuda_version_of_each_real_screen_and_q(name: str) -> None:
    assert parse_cuda_version(_text(name)) == CUDA[name]


@pytest.mark.parametrize("name", sorted(QUERY))
def test_sampler_query_rows_from_real_values(name: str) -> None:
    want = QUERY[name]
    rows = parse_query(_requested(_text(name), QUERY_FIELDS))
    assert [(r.index, r.name, r.power_w, r.util_pct, r.memory_used_mib, r.temperature_c) for r in rows] == [
        (0, want.name, want.power_w, want.util_pct, want.memory_used_mib, want.temperature_c)
    ]
    assert (rows[0].sm_clock_mhz, rows[0].mem_clock_mhz) == want.clocks_mhz


@pytest.mark.parametrize("name", sorted(QUERY))
def test_fingerprint_facts_and_observed_gpus_from_real_values(name: str) -> None:
    want = QUERY[name]
    facts = parse_gpu_facts(_requested(_text(name), FACT_FIELDS))
    assert [(f.index, f.name, f.driver, f.memory_mib, f.compute_cap) for f in facts] == [
        (0, want.name, want.driver, want.memory_total_mib, want.compute_cap)
    ]
    gpus = parse_nvidia_smi(_requested(_text(name), GPU_QUERY.split(",")))
    assert [(g.name, g.memory_used_mib, g.memory_total_mib, g.utilization_pct, g.compute_cap) for g in gpus] == [
        (want.name, want.memory_used_mib, want.memory_total_mib, want.util_pct, want.compute_cap)
    ]


def test_another_query_with_its_header_is_never_read_as_ours() -> None:
    text = _text(OTHER_QUERY)
    assert parse_gpu_facts(text) == [] and parse_query(text) == [] and parse_nvidia_smi(text) == []


@pytest.mark.parametrize("name", sorted(p.name for p in REAL.iterdir()))
def test_every_parser_over_every_real_capture_reads_only_its_own_format(name: str) -> None:
    """A parser given another command's real output finds nothing in it (and never raises)."""
    text = _text(name)
    assert (parse_topo(text) is not None) == (TOPO.get(name) is not None)
    assert bool(parse_dmon(text)) == bool(DMON.get(name))
    assert (parse_cuda_version(text) is not None) == (CUDA.get(name) is not None)
    # none of the recorded files is in the noheader/nounits form those three read (see _requested)
    assert parse_query(text) == [] and parse_gpu_facts(text) == [] and parse_nvidia_smi(text) == []


REPLAY = """\
import pathlib, sys
folder, args = pathlib.Path(sys.argv[1]), sys.argv[2:]
answer = {(): "screen", ("topo", "-m"): "topo"}.get(tuple(args))
if answer is None and args and args[0].startswith("--query-gpu="):
    answer = "facts"
if answer is None:
    sys.exit(9)
sys.stdout.write((folder / answer).read_text(encoding="utf-8"))
"""


def test_a_host_fingerprint_from_a_610_driver_s_real_outputs(tmp_path: Path) -> None:
    """The fingerprint through a real process answering with recorded 610 outputs: its screen says
    ``CUDA UMD Version`` and its ``topo -m`` header is underlined; neither is reported "not understood"."""
    (tmp_path / "screen").write_text(_text("smi_rtx2080s_610.57.04_kmd.txt"), encoding="utf-8")
    (tmp_path / "topo").write_text(_text("topo_rtx2080s_610.57.04_ansi.txt"), encoding="utf-8")
    facts = _requested(_text("query_all_rtx2080s_610.57.04.csv"), FACT_FIELDS)
    (tmp_path / "facts").write_text(facts, encoding="utf-8")
    (tmp_path / "replay.py").write_text(REPLAY, encoding="utf-8")
    smi = (sys.executable, str(tmp_path / "replay.py"), str(tmp_path))
    engine = (sys.executable, "-m", "workers.sim.sglang", "--model-path", "m")
    fp = asyncio.run(collect(LocalTransport(), smi, engine, "0.5.9"))
    assert fp.missing == (), fp.missing
    assert (fp.gpu_name, fp.gpu_count, fp.driver, fp.cuda) == ("NVIDIA GeForce RTX 2080 SUPER", 1, "610.57.04", "13.3")
    assert fp.topology is not None and fp.topology.gpus == ("GPU0",)
