"""The engine's own words for every failure and warning the simulator produces, per imitated version.

The contract recorded from the wheel (``workers/engines/contracts/sglang-<v>.json``) holds each text
behind benchbot's diagnosis rules by key (``kv_pool_too_small``, ``cuda_graph_capture_failed``, ...),
and for a Python literal also its template: the literal parts as the source writes them and one field
per f-string (or ``%``) value, named by the source expression and formatted as the source formats it
(``{x=}`` is ``x=`` then ``repr(x)``). The simulator renders that template with its own values, so
its wording is the wheel's by construction: there is no second copy here to drift.

Values are passed by the field's expression or by the last name of a dotted one
(``mem_fraction_static=`` fills ``self.server_args.mem_fraction_static``); calls and other expressions
are passed as written (``**{"process.name()": ...}``). A text this version does not have raises
:class:`TextMissing` (the failure mode does not exist there); a missing value raises
``TextFieldMissing`` (a bug in the simulator, caught by its tests).
"""

from __future__ import annotations

from workers.engines.contract import Contract


class TextMissing(LookupError):
    """The imitated version has no such text (the failure mode does not exist there)."""


def has(contract: Contract, key: str) -> bool:
    """True when the imitated version prints the text ``key``."""
    return contract.text(key) is not None


def say(contract: Contract, key: str, **values: object) -> str:
    """The recorded text ``key`` of this version, its fields filled with ``values``."""
    entry = contract.texts.get(key)
    if entry is None or entry.text is None:
        raise TextMissing(f"{contract.label()} has no recorded text {key!r}")
    return entry.render(values)
