"""What the effect journal keeps of one fenced actuator operation, made from its request and its answer.

Apart from :mod:`workers.host.transport` (which calls it once an operation answered or failed) so the transport
stays one interface; the journal itself is :mod:`workers.jobs.effects`'s.
"""

from __future__ import annotations

from collections.abc import Mapping

from workers.json_value import JsonObject

#: The outcome of a spawn's record written before the actuator ran: the job asked for it, no answer yet.
ASKED = "asked"


def effect_record(
    request: JsonObject, answer: Mapping[str, object] | None, outcome: str, began: float, ended: float
) -> JsonObject:
    """What the effect journal keeps of one fenced actuator operation: its kind, the fence token it carried, the
    process it named or started, the outcome and its wall-clock span; never argv, env or a file's text."""
    fence = request.get("fence")
    token = fence.get("token") if isinstance(fence, Mapping) else None
    pid = request.get("pid") if request.get("op") == "signal" else (answer or {}).get("pid")
    record: JsonObject = {
        "op": str(request.get("op")),
        "fence": token if isinstance(token, int) else None,
        "outcome": outcome,
        "began": began,
        "ended": ended,
    }
    if isinstance(pid, int):
        record["pid"] = pid
    for name in ("window", "window_boot"):  # the host's fence lock, on its wall clock and on its boot clock
        window = (answer or {}).get(name)
        if isinstance(window, list) and len(window) == 2 and all(isinstance(t, int | float) for t in window):
            record[name] = [float(window[0]), float(window[1])]
    if request.get("op") == "signal":
        record["signal"] = str(request.get("signal"))
        record["group"] = bool(request.get("group"))
    return record
