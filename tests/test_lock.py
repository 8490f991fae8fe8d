"""The lock file: exact pins of everything ``.venv`` resolves, installed by ``make`` and CI (issue 36 item 9).

``pyproject.toml`` keeps lower bounds (people who install the package get what satisfies them);
``constraints.txt`` pins one tested set. A dependency added to pyproject.toml without ``make lock``
fails here, naming the command to run.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)$")


def pins() -> dict[str, Version]:
    """constraints.txt as {normalised name: version}; every line that is not a comment is ``name==version``."""
    out: dict[str, Version] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        out[canonicalize_name(match[1])] = Version(match[2])
    return out


def test_every_dependency_is_pinned_within_its_lower_bound() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]]
    locked = pins()
    missing = [str(r) for r in wanted if canonicalize_name(r.name) not in locked]
    assert not missing, f"not in constraints.txt: {missing}; run `make lock` and commit constraints.txt"
    outside = [
        f"{r} (locked {locked[canonicalize_name(r.name)]})"
        for r in wanted
        if locked[canonicalize_name(r.name)] not in r.specifier
    ]
    assert not outside, f"constraints.txt pins outside pyproject.toml's bounds: {outside}; run `make lock`"
    assert "benchbot" not in locked  # the project itself is installed editable, never pinned


def test_make_and_ci_install_from_the_lock_and_the_real_tier_keeps_its_own_requirements() -> None:
    makefile = (REPO / "Makefile").read_text()
    stamp = makefile[makefile.index("$(STAMP):") :].split("\n\n", 1)[0]
    assert "$(LOCK)" in stamp.splitlines()[0]  # a new lock reinstalls .venv
    assert '-c $(LOCK) -e ".[dev]"' in stamp and "LOCK := constraints.txt" in makefile
    real = makefile[makefile.index("$(REAL_STAMP):") :].split("\n\n", 1)[0]
    assert "-r tests/real/requirements.txt" in real and "$(LOCK)" not in real
    lock = makefile[makefile.index("\nlock:") :].split("\n\n", 1)[0]
    installs = [line for line in lock.splitlines() if "bin/python -m pip install" in line]
    assert installs[-1].endswith(
        'pip install --quiet $(if $(KEEP),-c $(LOCK)) -e ".[dev]"'
    )  # unconstrained unless KEEP
    assert "pip freeze --exclude-editable" in lock
    ci = (REPO / ".ci" / "run").read_text()
    assert "make lint" in ci and "make test" in ci  # CI installs through the Makefile, so from the lock
