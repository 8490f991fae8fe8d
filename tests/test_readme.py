"""The README answers a newcomer's first-day questions (issue 16): each section a test can find."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    """The text under the heading ``title``, up to the next heading of the same or a higher level."""
    m = re.search(rf"^(#+) {re.escape(title)}$", README, re.M)
    assert m, f"README has no section {title!r}"
    nxt = re.search(rf"^#{{1,{len(m.group(1))}}} ", README[m.end() :], re.M)
    return README[m.end() : m.end() + nxt.start()] if nxt else README[m.end() :]


def test_readme_documents_a_mixed_real_and_simulated_fleet() -> None:
    text = section("A mixed fleet: real hosts and simulated ones")
    needed_parts = ("{python}", '"workers.sim.sglang"', '"workers.sim.nvidia_smi"', "[hosts.rehearsal.engine]")
    for needed in needed_parts:
        assert needed in text, needed
    assert "own fake GPUs" in text


DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK_RE = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
#: Paths the docs tell the reader to create (a new version's contract, compose's .env).
MADE_BY_THE_READER = {"workers/engines/contracts/sglang-0.5.24.json", "deploy/.env"}
CODE_PATH_RE = re.compile(r"`((?:shared|docs|deploy|bot|workers|tests|bench|tools|ops)/[A-Za-z0-9_./@-]+)`")


def test_docs_link_and_name_only_files_the_repository_has() -> None:
    """A fresh clone has every file the README and docs point at (no `shared/...` from outside it)."""
    missing = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for target in LINK_RE.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                missing.append(f"{doc.name}: link {target}")
        for path in CODE_PATH_RE.findall(text):
            if "*" in path or "<" in path:
                continue
            if not (ROOT / path.rstrip("/")).exists() and path not in MADE_BY_THE_READER:
                missing.append(f"{doc.name}: `{path}`")
    assert missing == []


def test_the_mixed_fleet_example_is_a_valid_config_with_one_simulated_host() -> None:
    from workers.config import parse_config
    from workers.host.simulated import is_simulated

    text = section("A mixed fleet: real hosts and simulated ones")
    toml = text.split("```toml\n", 1)[1].split("```", 1)[0]
    config = parse_config(toml, "README mixed fleet")
    assert {name: is_simulated(host) for name, host in config.hosts.items()} == {"gpu-1": False, "rehearsal": True}
    assert config.host("rehearsal").engine.command[0] != "{python}"  # the placeholder became the interpreter
