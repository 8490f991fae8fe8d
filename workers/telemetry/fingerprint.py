"""The host fingerprint stored with every run, and what ``/compare`` says when two runs' hosts differ.

A tok/s difference between two runs means something only when the config is the only thing that
changed. Each bench therefore records, before its first level, the machine it ran on: GPU name and
count, driver and CUDA versions, the GPU-to-GPU topology (``nvidia-smi topo -m``) and the engine's
package versions in the engine's own Python (engine, torch, flashinfer, triton, sgl-kernel).

Best effort like the rest of telemetry: each fact that could not be learnt is named in ``missing``
and the bench goes on. Every command here only reads (nvidia-smi queries, ``importlib.metadata``),
so, as for the telemetry sampler, no fence check precedes them: the fence guards side effects. The
commands are argv lists; the SSH transport quotes each word, so nothing is interpreted by a shell.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from workers.telemetry.fingerprint_parse import (
    FACT_FIELDS,
    PACKAGES_SCRIPT,
    Topology,
    parse_cuda_version,
    parse_gpu_facts,
    parse_packages,
    parse_topo,
)
from workers.telemetry.sampler import _Runner

EXTRA_KEY = "host_fingerprint"  # where a run record keeps it (``RunRecord.extra``)
COMMAND_TIMEOUT_S = 20.0
FACTS_ARGS = (f"--query-gpu={','.join(FACT_FIELDS)}", "--format=csv,noheader,nounits")
#: Package names as the compare line shows them (the distribution names stay in the record).
SHOWN = {"flashinfer-python": "flashinfer", "tensorrt_llm": "tensorrt-llm"}


class StoredFingerprint(TypedDict):
    """The JSON shape of a stored fingerprint (``RunRecord.extra["host_fingerprint"]``)."""

    gpu_name: str | None
    gpu_count: int | None
    driver: str | None
    cuda: str | None
    memory_mib: int | None
    compute_cap: str | None
    topology: dict[str, list[str] | list[list[str]]] | None
    engine_version: str | None
    packages: dict[str, str | None]
    missing: list[str]


@dataclass(frozen=True)
class HostFingerprint:
    """What a run's host was; None / empty where it could not be learnt (then ``missing`` says why)."""

    gpu_name: str | None = None
    gpu_count: int | None = None
    driver: str | None = None
    cuda: str | None = None
    memory_mib: int | None = None
    compute_cap: str | None = None
    topology: Topology | None = None
    engine_version: str | None = None
    packages: tuple[tuple[str, str | None], ...] = ()  # (distribution, version or None when not installed)
    missing: tuple[str, ...] = field(default=())

    def to_dict(self) -> StoredFingerprint:
        """The JSON stored under ``extra["host_fingerprint"]``."""
        return {
            "gpu_name": self.gpu_name,
            "gpu_count": self.gpu_count,
            "driver": self.driver,
            "cuda": self.cuda,
            "memory_mib": self.memory_mib,
            "compute_cap": self.compute_cap,
            "topology": self.topology.to_dict() if self.topology else None,
            "engine_version": self.engine_version,
            "packages": dict(self.packages),
            "missing": list(self.missing),
        }

    @classmethod
    def from_dict(cls, data: object) -> HostFingerprint | None:
        """The stored fingerprint, or None for a record without one (older runs) or an unreadable one."""
        if not isinstance(data, Mapping):
            return None

        def text(key: str) -> str | None:
            value = data.get(key)
            return None if value is None else str(value)

        def number(key: str) -> int | None:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        packages = data.get("packages")
        topo = data.get("topology")
        missing = data.get("missing")
        return cls(
            gpu_name=text("gpu_name"),
            gpu_count=number("gpu_count"),
            driver=text("driver"),
            cuda=text("cuda"),
            memory_mib=number("memory_mib"),
            compute_cap=text("compute_cap"),
            topology=Topology.from_dict(topo) if isinstance(topo, Mapping) else None,
            engine_version=text("engine_version"),
            packages=tuple((str(k), None if v is None else str(v)) for k, v in sorted((packages or {}).items()))
            if isinstance(packages, Mapping)
            else (),
            missing=tuple(str(m) for m in missing) if isinstance(missing, list) else (),
        )

    @property
    def installed(self) -> dict[str, str]:
        """The packages that are there, by distribution name."""
        return {k: v for k, v in self.packages if v is not None}

    @property
    def summary(self) -> str:
        """``8x NVIDIA H100 80GB HBM3, driver 580.95.05, CUDA 13.0, NV18``: one line for a table's notes."""
        bits = []
        if self.gpu_name:
            bits.append(f"{self.gpu_count}x {self.gpu_name}" if self.gpu_count else self.gpu_name)
        if self.driver:
            bits.append(f"driver {self.driver}")
        if self.cuda:
            bits.append(f"CUDA {self.cuda}")
        if self.topology:
            bits.append("/".join(self.topology.kinds) or "single GPU")
        bits += [f"{SHOWN.get(k, k)} {v}" for k, v in self.installed.items()]
        return ", ".join(bits) or "unknown host"


def packages_argv(command: Sequence[str]) -> list[str] | None:
    """The argv that prints the engine's package versions from the engine's own Python, or None.

    ``python [switches] -m module ...`` names its interpreter; a console script given by path
    (``/venv/bin/sglang serve``, ``/venv/bin/vllm serve``) is asked through the ``python3`` beside it,
    the venv's own. A bare console-script name leaves the interpreter unknown: None, reported missing.
    An ``env K=V ...`` prefix is dropped: its values are the engine's environment (tokens, keys), never
    words for a probe's argv.
    """
    items = list(command)
    if "-m" in items and items.index("-m") > 0:
        interpreter = items[: items.index("-m")]
        if os.path.basename(interpreter[0]) == "env":  # ``env K=V python``: the assignments may hold secrets
            interpreter = [w for w in interpreter[1:] if "=" not in w and not w.startswith("-")][-1:]
        return [*interpreter, "-c", PACKAGES_SCRIPT] if interpreter else None
    if items and os.path.dirname(items[0]):
        return [os.path.join(os.path.dirname(items[0]), "python3"), "-c", PACKAGES_SCRIPT]
    return None


async def _output(transport: _Runner, argv: Sequence[str], what: str, missing: list[str]) -> str | None:
    """stdout of ``argv`` or None, with a short reason in ``missing`` (never raises)."""
    try:
        result = await transport.run(list(argv), timeout=COMMAND_TIMEOUT_S)
    except Exception as exc:  # best effort: the bench goes on without this fact
        missing.append(f"{what}: {type(exc).__name__}")
        return None
    code = getattr(result, "returncode", 1)
    if code != 0:
        missing.append(f"{what}: exit {code}")
        return None
    return str(getattr(result, "stdout", ""))


async def collect(
    transport: _Runner,
    nvidia_smi: Sequence[str],
    engine_command: Sequence[str],
    engine_version: str | None,
    *,
    gpus: bool = True,
) -> HostFingerprint:
    """The fingerprint of the host behind ``transport``: four read-only commands, run concurrently.

    ``gpus=False``: a host without GPUs (``gpus = 0``), whose missing nvidia-smi is no fact missed.
    """
    missing: list[str] = []
    smi = list(nvidia_smi)
    pkg_argv = packages_argv(engine_command)

    if smi:
        facts_text, screen, topo_text = await asyncio.gather(
            _output(transport, [*smi, *FACTS_ARGS], "GPU query", missing),
            _output(transport, smi, "nvidia-smi screen", missing),
            _output(transport, [*smi, "topo", "-m"], "topology", missing),
        )
    else:
        facts_text = screen = topo_text = None
        if gpus:
            missing.append("the host config names no nvidia-smi")
    pkg_text = await _output(transport, pkg_argv, "package versions", missing) if pkg_argv else None
    if pkg_argv is None:
        missing.append("package versions: the engine command names no Python to ask")

    facts = parse_gpu_facts(facts_text or "")
    names = sorted({f.name for f in facts})
    drivers = sorted({f.driver for f in facts if f.driver})
    cuda = parse_cuda_version(screen) if screen else None
    topology = parse_topo(topo_text) if topo_text else None
    packages = parse_packages(pkg_text) if pkg_text else None
    for got, text, what in (
        (facts, facts_text, "GPU query"),
        (cuda, screen, "CUDA version"),
        (topology, topo_text, "topology"),
        (packages, pkg_text, "package versions"),
    ):
        if not got and text is not None:
            missing.append(f"{what}: output not understood")
    return HostFingerprint(
        gpu_name=" + ".join(names) or None,
        gpu_count=len(facts) or None,
        driver=" + ".join(drivers) or None,
        cuda=cuda,
        memory_mib=facts[0].memory_mib if facts else None,
        compute_cap=facts[0].compute_cap if facts else None,
        topology=topology,
        engine_version=engine_version,
        packages=tuple(sorted((packages or {}).items())),
        missing=tuple(missing),
    )


def differences(a: HostFingerprint, b: HostFingerprint, engines: tuple[str, str] = ("", "")) -> list[str]:
    """What differs between two hosts, each as ``driver 550.54.15 -> 580.95.05``; facts one side lacks are skipped.

    ``engines`` are the two runs' engine kinds, when known: the engine line names them (``engine sglang 0.5.9 ->
    vllm 0.34.0``), since two kinds' version numbers mean nothing side by side.
    """
    out = []
    for what, x, y in (
        ("GPU", a.gpu_name, b.gpu_name),
        ("GPU count", a.gpu_count, b.gpu_count),
        ("driver", a.driver, b.driver),
        ("CUDA", a.cuda, b.cuda),
    ):
        if x is not None and y is not None and x != y:
            out.append(f"{what} {x} -> {y}")
    if line := _engine_difference((a.engine_version, b.engine_version), engines):
        out.append(line)
    if a.topology and b.topology and a.topology.links != b.topology.links:
        out.append(f"topology {a.topology.summary} -> {b.topology.summary}")
    if a.packages and b.packages:
        mine, theirs = dict(a.packages), dict(b.packages)
        for name in sorted(set(mine) & set(theirs)):
            if mine[name] != theirs[name]:
                shown = SHOWN.get(name, name)
                out.append(f"{shown} {mine[name] or 'absent'} -> {theirs[name] or 'absent'}")
    return out


def _engine_difference(versions: tuple[str | None, str | None], kinds: tuple[str, str]) -> str | None:
    """``engine sglang 0.5.9 -> vllm 0.34.0``, ``engine sglang 0.5.9 -> 0.5.23`` (one kind), ``engine 0.5.9 ->
    0.5.23`` (kinds unknown: an older record); None when alike."""
    (va, vb), (ka, kb) = versions, kinds
    other_kind = bool(ka and kb and ka != kb)
    if va is None or vb is None:  # a version one side lacks is skipped; a change of engine never is
        return f"engine {ka} -> {kb}" if other_kind else None
    if other_kind:
        return f"engine {ka} {va} -> {kb} {vb}"
    if va == vb:
        return None
    return f"engine {ka + ' ' if ka and ka == kb else ''}{va} -> {vb}"


def compare_lines(runs: Sequence[tuple[str, object, str]]) -> list[str]:
    """``/compare``'s warning lines: each run whose host differs from the first run's, and runs without one.

    ``runs`` are ``(run id, stored fingerprint dict, engine kind or "")``, first run first (the compare baseline).
    """
    prints = [(rid, HostFingerprint.from_dict(data), kind) for rid, data, kind in runs]
    known = [(rid, fp, kind) for rid, fp, kind in prints if fp is not None]
    if not known:
        return []
    lines = []
    base_id, base, base_kind = known[0]
    for rid, fp, kind in known[1:]:
        if diff := differences(base, fp, (base_kind, kind)):
            lines.append(f"not only the config differs: {rid} vs {base_id}: " + "; ".join(diff))
    unknown = [rid for rid, fp, _ in prints if fp is None]
    if unknown and len(prints) > 1:
        lines.append(f"no host fingerprint stored for {', '.join(unknown)}: its host cannot be compared")
    return lines
