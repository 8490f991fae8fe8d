"""``GET /server_info``: split into launch args and scheduler facts, secrets hidden; is it SGLang at all?

Both known shapes are read: 0.5.9's flat object and 0.5.23's resolved args plus extras
(docs/observe.md, "One observation"; each version's keys: docs/sim.md, "HTTP surface").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from workers.json_value import JsonObject, JsonValue
from workers.secrets import redact, redact_text

#: Top-level ``/server_info`` keys that are not launch args (both shapes: docs/sim.md, "HTTP surface").
NON_ARG_KEYS = frozenset(
    {
        "version",
        "internal_states",
        "status",
        "max_total_num_tokens",
        "max_req_input_len",
        "launch_command",
        "kv_events",
        "startup_time",
        "frontend",
        "server_args",
        "sim",  # benchbot's simulator reports its own settings here
    }
)
#: Non-arg top-level keys that describe the running server; they go to ``ServerInfo.internal``.
_INTERNAL_TOP_KEYS = ("max_total_num_tokens", "max_req_input_len", "status", "startup_time", "kv_events", "sim")


@dataclass(frozen=True)
class ServerInfo:
    """``GET /server_info`` split into launch ``args`` and what the scheduler reports (``internal``)."""

    version: str | None
    args: JsonObject
    internal: JsonObject
    launch_command: str | None = None


def parse_server_info(data: object) -> ServerInfo:
    """Parse both known shapes: 0.5.9's flat object and 0.5.23's resolved args plus extras.

    ``internal`` holds scheduler facts: ``internal_states[0]`` minus the args it repeats, plus the
    top-level non-arg keys (``max_total_num_tokens``, ``status``, ``startup_time``, the simulator's
    ``sim``...). Secrets are redacted.
    """
    if not isinstance(data, Mapping):
        raise ValueError("server_info is not a JSON object")
    nested = data.get("server_args")
    source: Mapping[str, JsonValue] = nested if isinstance(nested, Mapping) else data
    args = {k: v for k, v in source.items() if k not in NON_ARG_KEYS}
    states = data.get("internal_states")
    internal: JsonObject = {}
    if isinstance(states, list) and states and isinstance(states[0], Mapping):
        internal = {k: v for k, v in states[0].items() if k not in args}
        if len(states) > 1:
            internal["dp_ranks"] = len(states)
    elif isinstance(states, Mapping):
        internal = {k: v for k, v in states.items() if k not in args}
    for key in _INTERNAL_TOP_KEYS:
        if key in data and key not in internal:
            internal[key] = data[key]
    launch = data.get("launch_command")
    version = data.get("version")
    return ServerInfo(
        version=str(version) if version is not None else None,
        args=redact(args),
        internal=redact(internal),
        launch_command=redact_text(launch) if isinstance(launch, str) else None,
    )


def looks_like_sglang(data: object) -> bool:
    """A cheap check that a JSON answer on ``/server_info`` came from SGLang and not some other server."""
    if not isinstance(data, Mapping):
        return False
    nested = data.get("server_args")
    source: Mapping[str, JsonValue] = nested if isinstance(nested, Mapping) else data
    return "version" in data and any(k in source for k in ("model_path", "tp_size"))
