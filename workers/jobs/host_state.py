"""Host state written under the lease: fields (e.g. the server benchbot launched) only the fence holder sets.

:func:`workers.keys.host_state` is a hash. Every write checks, in the same Lua step, that the fence it
carries is the current lease's (:mod:`workers.jobs.lease`), so a holder that paused past its TTL cannot
clobber what the next holder wrote.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import redis

from workers import keys
from workers.errors import LeaseLostError
from workers.jobs.lease import lease_key
from workers.redis_conn import text_client

#: Hash of host state written under the lease (e.g. the server we launched).
state_key = keys.host_state


# KEYS: lease, state hash.  ARGV: fence, field, value, delete flag.
_FENCED_SET = """
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local h = cjson.decode(cur)
if tostring(h['fence']) ~= ARGV[1] then return 0 end
if ARGV[4] == '1' then redis.call('HDEL', KEYS[2], ARGV[2]) else redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
return 1
"""


def fenced_set(r: redis.Redis, host: str, key: str, value: str | Mapping[str, object] | None, fence: int) -> None:
    """Write (or with ``value=None`` delete) one field of the host state, only under the current fence.

    Raises :class:`LeaseLostError` when ``fence`` is not the current lease's: the caller's lease
    expired and someone else may be driving the host.
    """
    text = json.dumps(value) if isinstance(value, dict) else ("" if value is None else str(value))
    ok = r.eval(
        _FENCED_SET, 2, lease_key(host), state_key(host), str(int(fence)), key, text, "1" if value is None else "0"
    )
    if not ok:
        raise LeaseLostError(
            f"refused to record {key!r} for {host}: fence {fence} is stale (the lease expired or moved on)"
        )


def host_state(r: redis.Redis, host: str) -> dict[str, str]:
    """All host state fields written through :func:`fenced_set`."""
    fields: dict[str, str] = text_client(r).hgetall(state_key(host))
    return fields
