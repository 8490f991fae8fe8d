"""Put the simulated host's tools on a PATH: ``install_nvidia_smi(bin_dir)`` writes an ``nvidia-smi``."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path


def install_nvidia_smi(bin_dir: str | os.PathLike[str]) -> Path:
    """Write an executable ``nvidia-smi`` wrapper running the stand-in with this interpreter.

    The shebang is ``sys.executable`` so the wrapper finds ``workers`` from the same venv; the
    repository root goes on ``PYTHONPATH`` in case the package is not installed.
    """
    path = Path(bin_dir) / "nvidia-smi"
    path.parent.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[2]
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(root)!r})\n"
        "from workers.sim.nvidia_smi import main\n"
        "sys.exit(main())\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
