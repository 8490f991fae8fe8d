"""The hash that names a configuration, for every engine: one canonical form, one digest.

A fingerprint must not depend on key order, on 8 vs 8.0, or on which engine's driver computed it, so
the SGLang observation and the vLLM driver both hash through here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from workers.json_value import JsonValue


def canonical(value: Any) -> Any:
    """JSON-safe, order-independent form: floats that are whole become ints so 8 and 8.0 agree."""
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def digest(fields: Mapping[str, JsonValue]) -> str:
    """12 hex chars of the sha256 of ``fields`` in canonical JSON."""
    blob = json.dumps(canonical(fields), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
