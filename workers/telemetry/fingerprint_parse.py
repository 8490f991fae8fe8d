"""Parsers for the host facts a run's fingerprint is made of (issue 22 item 3).

Two runs are only comparable when they ran on the same kind of machine, so each run records what
nvidia-smi and the engine's Python say about the host. Every format here is read defensively: a line
that does not look like the documented format is skipped, never guessed, and "could not tell" is None.

* ``nvidia-smi --query-gpu=FACT_FIELDS --format=csv,noheader,nounits``: one CSV row per GPU.
* the plain ``nvidia-smi`` screen (or ``-q``): the only place nvidia-smi states the CUDA version the
  driver supports (``CUDA Version: 12.4`` in the header box, ``CUDA Version : 12.4`` in ``-q``); no
  ``--query-gpu`` field carries it. 610 drivers renamed the box's field ``CUDA UMD Version: 13.3``
  (and ``Driver Version`` to ``KMD Version``); their ``-q`` prints both names. A driver that cannot
  tell says ``CUDA Version: N/A`` / ``Not Found``, which reads as None.
* ``nvidia-smi topo -m``: a tab-separated matrix, one column per GPU (and NIC on hosts that have
  them), then ``CPU Affinity`` / ``NUMA Affinity`` / ``GPU NUMA ID``; cells are ``X`` (self),
  ``NV#`` (a bonded set of # NVLinks), ``PIX``/``PXB``/``PHB``/``NODE``/``SYS`` (PCIe paths, nearest
  to farthest). Only the GPU-to-GPU part is kept: that is what all-reduce traffic crosses. The
  590-610 drivers of the recorded captures underline the header row with terminal escapes
  (``ESC[4m`` ... ``ESC[0m``) even when the output goes to a file, so they are removed first; pastes
  whose tabs became spaces read the same, since cells are split on any whitespace.
* the JSON line :data:`PACKAGES_SCRIPT` prints.

The real captures these formats are tested on, with their sources, are listed in
``tests/fixtures/nvidia_smi/README.md``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

FACT_FIELDS = ("index", "name", "driver_version", "memory.total", "compute_cap")
#: Distributions asked for, engine first. ``flashinfer-python`` is FlashInfer's PyPI name (older
#: wheels were ``flashinfer``); ``sgl-kernel`` is SGLang's kernel package.
PACKAGES = ("sglang", "vllm", "tensorrt_llm", "torch", "flashinfer-python", "flashinfer", "triton", "sgl-kernel")
#: Run by the engine's own Python: reads package metadata only (imports none of them, so it takes
#: milliseconds even where importing torch would take seconds) and prints one JSON object.
PACKAGES_SCRIPT = (
    "import importlib.metadata as m, json\n"
    "def v(d):\n"
    "    try:\n"
    "        return m.version(d)\n"
    "    except m.PackageNotFoundError:\n"
    "        return None\n"
    f"print(json.dumps({{d: v(d) for d in {PACKAGES!r}}}))\n"
)

_CUDA_RE = re.compile(r"CUDA (?:UMD )?Version\s*:\s*([0-9][0-9.]*)")
#: SGR sequences (``ESC[4m``, ``ESC[0m``): ``topo -m`` wraps its header row in them.
_ESCAPE_RE = re.compile(r"\x1b\[[0-9;]*m")
_DEVICE_RE = re.compile(r"^(GPU|NIC)\d+$")
_LINK_RE = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")


@dataclass(frozen=True)
class GpuFact:
    """One GPU as ``--query-gpu=FACT_FIELDS`` describes it; None where nvidia-smi could not say."""

    index: int
    name: str
    driver: str | None
    memory_mib: int | None
    compute_cap: str | None


@dataclass(frozen=True)
class Topology:
    """The GPU-to-GPU part of ``topo -m``: ``links[i][j]`` is how GPU i reaches GPU j (``X`` on the diagonal)."""

    gpus: tuple[str, ...]
    links: tuple[tuple[str, ...], ...]

    @property
    def kinds(self) -> tuple[str, ...]:
        """The distinct off-diagonal link kinds, sorted: ``("NV18",)``, ``("NODE", "SYS")``."""
        return tuple(sorted({c for i, row in enumerate(self.links) for j, c in enumerate(row) if i != j}))

    @property
    def summary(self) -> str:
        """``8 GPUs, NV18`` / ``4 GPUs, NODE/SYS``: how a table or a compare line names it."""
        kinds = "/".join(self.kinds) or "single GPU"
        return f"{len(self.gpus)} GPU{'s' if len(self.gpus) != 1 else ''}, {kinds}"

    def to_dict(self) -> dict[str, list[str] | list[list[str]]]:
        return {"gpus": list(self.gpus), "links": [list(row) for row in self.links]}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Topology | None:
        """None for anything that is not a square matrix of strings (a hand-edited or future record)."""
        raw_gpus, raw_links = data.get("gpus"), data.get("links")
        if not isinstance(raw_gpus, list) or not isinstance(raw_links, list):
            return None
        if not all(isinstance(row, list) for row in raw_links):
            return None
        gpus = tuple(str(g) for g in raw_gpus)
        links = tuple(tuple(str(c) for c in row) for row in raw_links)
        if len(links) != len(gpus) or any(len(row) != len(gpus) for row in links):
            return None
        return cls(gpus, links)


def _opt(text: str) -> str | None:
    text = text.strip()
    return None if not text or text.startswith("[") or text in ("N/A", "-") else text


def parse_gpu_facts(text: str) -> list[GpuFact]:
    """Rows of ``--query-gpu=FACT_FIELDS`` (noheader, nounits); a comma inside a GPU name is kept."""
    out = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < len(FACT_FIELDS) or not fields[0].isdigit():
            continue
        memory = _opt(fields[-2])
        out.append(
            GpuFact(
                index=int(fields[0]),
                name=", ".join(fields[1:-3]),
                driver=_opt(fields[-3]),
                memory_mib=int(float(memory)) if memory and memory.replace(".", "", 1).isdigit() else None,
                compute_cap=_opt(fields[-1]),
            )
        )
    return out


def parse_cuda_version(text: str) -> str | None:
    """The CUDA version of the plain ``nvidia-smi`` screen or of ``nvidia-smi -q``; None when absent.

    ``CUDA Version`` up to the 5xx drivers, ``CUDA UMD Version`` in the 610 screen (whose ``-q`` still
    prints the old name, marked deprecated, before the new one).
    """
    m = _CUDA_RE.search(text)
    return m.group(1) if m else None


def parse_topo(text: str) -> Topology | None:
    """The GPU-to-GPU matrix of ``nvidia-smi topo -m``; None when no header or no complete GPU row is found.

    The header is the first line whose leading words name devices (``GPU0 GPU1 ... NIC0``), read up to
    the first word that does not: hosts with more than ten NICs print ``NIC8NIC9`` run together there
    (and ``NODENODE`` in the NIC cells), which only cuts NIC columns, never GPU ones.
    """
    columns: list[str] | None = None
    rows: dict[str, list[str]] = {}
    for line in _ESCAPE_RE.sub("", text).splitlines():
        words = line.split()
        if not words:
            continue
        if columns is None:
            names = []
            for w in words:
                if not _DEVICE_RE.match(w):
                    break
                names.append(w)
            if names and names[0].startswith("GPU"):
                columns = names
            continue
        if not words[0].startswith("GPU") or not _DEVICE_RE.match(words[0]):
            continue
        cells = words[1 : 1 + len(columns)]
        if len(cells) != len(columns) or not all(_LINK_RE.match(c) for c in cells):
            continue
        rows[words[0]] = cells
    if columns is None:
        return None
    gpus = [c for c in columns if c.startswith("GPU")]
    at = [columns.index(g) for g in gpus]
    if not gpus or any(g not in rows for g in gpus):
        return None
    return Topology(tuple(gpus), tuple(tuple(rows[g][k] for k in at) for g in gpus))


def parse_packages(text: str) -> dict[str, str | None] | None:
    """``{distribution: version or None}`` from :data:`PACKAGES_SCRIPT`'s last JSON line; None if there is none."""
    for line in reversed(text.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return {str(k): (str(v) if isinstance(v, str) else None) for k, v in data.items()}
    return None
