"""Count ``dict[str, Any]`` / ``Mapping[str, Any]`` in bot/, workers/ and ops/, and fail above a ceiling.

Issue 24: untyped dicts belong only at the edges where JSON or TOML really is untyped (Slack Block Kit,
raw TOML before validation, Redis decoding). ``make lint`` prints the count so a reviewer sees it move,
and fails when a change pushes it above :data:`CEILING`; lower the ceiling as modules get typed.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

#: The most ``dict[str, Any]`` + ``Mapping[str, Any]`` allowed: a ratchet, lowered as modules get typed (311
#: before issue 24's first pass, 296 after it, 307 once telemetry's per-level JSON summaries of issue 22 landed,
#: 316 with issue 23's operator metrics: bolt's listener bodies and contexts and the rendered compose and
#: Prometheus documents, all untyped edges; 193 once bot/, workers/results/ and ops/ were typed: the header
#: state, thread record, Block Kit messages and stored-run sub-objects got their types, Slack's wire bodies
#: in the stand-in one ``SlackJson`` alias; 190 with the engine seam; then the workers' benchmark, jobs,
#: telemetry and evaluation wrote JSON as ``workers.json_value.JsonObject`` and read it as ``RawJson``);
#: the goal (issue 24) is under 60.
CEILING = 95
PACKAGES = ("bot", "workers", "ops")
PATTERN = re.compile(r"\b(?:dict|Dict|Mapping|MutableMapping)\[\s*str\s*,\s*(?:typing\.)?Any\s*\]")


def count(root: Path) -> Counter[str]:
    """Occurrences per file, over every ``.py`` under the packages (comments and docstrings included)."""
    found: Counter[str] = Counter()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            hits = len(PATTERN.findall(path.read_text(encoding="utf-8")))
            if hits:
                found[str(path.relative_to(root))] = hits
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    found = count(root)
    total = sum(found.values())
    top = ", ".join(f"{name} {n}" for name, n in found.most_common(5))
    where = " ".join(p + "/" for p in PACKAGES)
    print(f"dict[str, Any] / Mapping[str, Any] in {where}: {total} (ceiling {CEILING}; most: {top})")
    if total > CEILING:
        print(f"above the ceiling of {CEILING}: type the new values (frozen dataclass / TypedDict)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
