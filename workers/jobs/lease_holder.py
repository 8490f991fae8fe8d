"""Who holds a host's lease: the JSON record in the lease key, as ``status``, the reaper and a fence check read it."""

from __future__ import annotations

import json
from dataclasses import dataclass

DEFAULT_TTL_S = 30.0


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a host: shown by ``status`` and used to report a dead holder's job."""

    user: str
    job: str
    worker: str
    since: float
    fence: int
    seq: int | None = None
    ttl_ms: int = int(DEFAULT_TTL_S * 1000)
    #: Every host of the gang this lease is one member of (lease order); empty for a one-host job.
    gang: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, raw: str) -> LeaseHolder:
        """Parse the JSON stored in the lease key."""
        body = json.loads(raw)
        seq = body.get("seq")
        gang = body.get("gang")
        return cls(
            user=str(body.get("user", "")),
            job=str(body.get("job", "")),
            worker=str(body.get("worker", "")),
            since=float(body.get("since", 0.0)),
            fence=int(body.get("fence", 0)),
            seq=int(seq) if isinstance(seq, int | float) else None,
            ttl_ms=int(body.get("ttl_ms", DEFAULT_TTL_S * 1000)),
            gang=tuple(str(h) for h in gang) if isinstance(gang, list) else (),
        )
