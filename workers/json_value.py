"""JSON at the process's edges: typed on the way out, named once on the way in.

``JsonValue`` / ``JsonObject`` are what a ``to_dict`` returns: only JSON's own values, so mypy refuses a
datetime or a dataclass that ``json.dumps`` would refuse at run time. ``RawJson`` is a JSON object as it
was decoded (``json.loads`` of a payload, a Redis field, a stored record) until a ``from_dict`` reads it
into a frozen type: the one untyped edge, named here rather than spelled out at every decoder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: A JSON value. Its containers are the read-only ``Sequence`` / ``Mapping`` (covariant), so a typed
#: ``dict[str, float | None]`` or ``list[int]`` is one without a copy.
JsonValue = str | int | float | bool | None | Sequence["JsonValue"] | Mapping[str, "JsonValue"]
#: A JSON object, as a ``to_dict`` builds it.
JsonObject = dict[str, JsonValue]
#: A JSON object as decoded, before it is typed (what ``from_dict`` methods read).
RawJson = Mapping[str, Any]
