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
