"""Parsers for the two nvidia-smi outputs the telemetry sampler reads.

* ``--query-gpu=QUERY_FIELDS --format=csv,noheader,nounits``: one CSV row per GPU. These fields, because
  they are what a bench's energy and headroom need: ``power.draw`` (W, integrated into J/token),
  ``utilization.gpu``/``utilization.memory`` (%, is the GPU busy or waiting on us), ``memory.used`` (MiB),
  ``clocks.sm``/``clocks.mem`` (MHz, throttling shows here first) and ``temperature.gpu`` (C).
* ``dmon -s pucvmt -c 1``: the only nvidia-smi view of PCIe throughput (``rxpci``/``txpci``, MB/s);
  columns are found by the header line (``# gpu ...``, or ``#Time gpu ...`` / ``#Date Time gpu ...``
  when ``-o T``/``-o DT`` is given), so extra groups (``jpg``/``ofa`` on newer drivers, ``pci`` of the
  ``e`` group before ``rxpci``) or another order never shift a value into the wrong column. A dmon
  run without the ``t`` group (the default ``-s puc``) has no PCIe columns and gives no readings.

Values nvidia-smi cannot give (``[N/A]``, ``[Not Supported]``, ``-``) become None; malformed rows are
skipped, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

QUERY_FIELDS = (
    "index",
    "name",
    "power.draw",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "clocks.sm",
    "clocks.mem",
    "temperature.gpu",
)


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one moment (``--query-gpu``)."""

    index: int
    name: str
    power_w: float | None
    util_pct: float | None
    mem_util_pct: float | None
    memory_used_mib: float | None
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    temperature_c: float | None


@dataclass(frozen=True)
class PcieReading:
    """One GPU's PCIe throughput at one moment (``dmon``), MB/s."""

    index: int
    rx_mbs: float | None
    tx_mbs: float | None


def _num(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None


def parse_query(text: str) -> list[GpuReading]:
    """Rows of ``--query-gpu=<QUERY_FIELDS>`` (noheader, nounits); a comma inside the name is harmless."""
    out = []
    tail = len(QUERY_FIELDS) - 2
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < len(QUERY_FIELDS):
            continue
        index = _num(fields[0])
        if index is None:
            continue
        values = [_num(f) for f in fields[-tail:]]
        out.append(GpuReading(int(index), ", ".join(fields[1:-tail]), *values))
    return out


def parse_dmon(text: str) -> list[PcieReading]:
    """Rows of ``nvidia-smi dmon`` that name a GPU, read through the header's columns.

    The header is the ``#`` line with a ``gpu`` column; the units line under it (``# Idx W C ...``) has
    none. A row with a word too many or too few (a ``^C`` echoed into it) is skipped.
    """
    columns: list[str] | None = None
    out = []
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0].startswith("#"):
            names = [words[0][1:], *words[1:]] if words[0] != "#" else words[1:]
            if "gpu" in names:
                columns = names
            continue
        if columns is None or len(words) != len(columns) or "rxpci" not in columns:
            continue
        row = dict(zip(columns, words, strict=True))
        index = _num(row["gpu"])
        if index is None:
            continue
        out.append(PcieReading(int(index), _num(row["rxpci"]), _num(row.get("txpci", "-"))))
    return out
