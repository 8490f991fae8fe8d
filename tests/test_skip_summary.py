"""A run without OpenSSH says so in its last line, not only in "N skipped" (issue 16.9)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run_openssh_tests(env: dict[str, str]) -> str:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_transport.py", "-k", "openssh"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_last_line_counts_real_openssh_tests_skipped_and_says_why() -> None:
    out = _run_openssh_tests({**os.environ, "BENCHBOT_TEST_SSHD": "/nonexistent/sshd"})
    lines = out.rstrip("\n").splitlines()
    count = int(next(line for line in lines if " skipped" in line and " in " in line).split(" skipped")[0].split()[-1])
    assert count > 0
    assert lines[-1] == (
        f"{count} real-OpenSSH tests skipped: /nonexistent/sshd is not installed (apt-get install openssh-server);"
        " the asyncssh-server tests ran"
    )
