"""The fence check: proof, before every side effect on a host, that the job still holds its lease with a margin.

One Lua round trip passes only if the lease key still names this job and fence *and* has at least the
margin left, so whatever the job does next lands before the lease can expire. A pass (and every heartbeat
renewal, :meth:`workers.jobs.lease.Lease.renew`) leaves a local deadline on the monotonic clock; until it
passes a check is a clock comparison. See docs/reliability.md, "Fenced side effects".
"""

from __future__ import annotations

import time

import redis

from workers import keys
from workers.errors import LeaseLostError
from workers.jobs.lease_holder import LeaseHolder
from workers.redis_conn import ClientRecipe, TextRedis, text_client

#: The default margin is this share of the TTL (5 s of 30 s): see :func:`default_margin_s`.
DEFAULT_MARGIN_SHARE = 1 / 6

# KEYS: lease.  ARGV: job, fence, margin_ms.
# Returns {1, pttl} when the lease is ours with at least margin_ms left, else {0, why, detail}:
# 'gone' (expired or released), 'taken' (detail: the holder's JSON) or 'margin' (detail: pttl).
_CHECK = """
local cur = redis.call('GET', KEYS[1])
if not cur then return {0, 'gone', ''} end
local h = cjson.decode(cur)
if tostring(h['job']) ~= ARGV[1] or tostring(h['fence']) ~= ARGV[2] then return {0, 'taken', cur} end
local left = redis.call('PTTL', KEYS[1])
if left < tonumber(ARGV[3]) then return {0, 'margin', tostring(left)} end
return {1, left}
"""


def default_margin_s(ttl_s: float) -> float:
    """The fence-check margin when the config names none: a sixth of the TTL (5 s of 30 s).

    Why a sixth: the heartbeat renews every TTL/3, so a healthy lease never has less than 2/3 of its TTL
    left and one missed renewal still leaves 1/3; a margin of TTL/6 therefore never refuses a holder
    whose heartbeat is merely one beat late, while leaving a side effect 5 s (at 30 s) to land after
    its check passed: far more than an SSH round trip for a spawn or a signal, or sending one request.
    """
    return ttl_s * DEFAULT_MARGIN_SHARE


def check_margin(ttl_s: float, margin_s: float) -> float:
    """A margin must be >= 0 and below the TTL (a check right after a renewal would fail otherwise)."""
    if not 0 <= margin_s < ttl_s:
        raise ValueError(f"lease margin {margin_s:g} s must be at least 0 and below the lease TTL {ttl_s:g} s")
    return margin_s


class FenceCheck:
    """Proof that a job still holds its host, with a margin: call it before every side effect.

    ``check()`` is a monotonic-clock comparison while the local deadline holds, and one Redis round
    trip (:data:`_CHECK`) once it has passed. The deadline only ever moves with a proof: ``t0 +
    remaining - margin`` where ``t0`` was read before the Redis call that proved ``remaining``, so a
    process paused anywhere between the clock read and the reply wakes with a deadline already in the
    past. Any copy is sound until its own deadline, so the object is picklable (a bench shard in a
    child process gets one; CLOCK_MONOTONIC is system-wide) and opens its own Redis client there.
    """

    def __init__(
        self, r: redis.Redis | None, host: str, job: str, fence: int, margin_s: float, valid_until: float = 0.0
    ) -> None:
        self.host = host
        self.job = str(job)
        self.fence = int(fence)
        self.margin_s = float(margin_s)
        self.valid_until = valid_until
        self.lost_reason: str | None = None
        self.redis_checks = 0  # how often a check had to ask Redis (the rest were clock comparisons)
        self._redis = text_client(r) if r is not None else None
        # How a copy in another process opens its own client (a plain server or a Sentinel set).
        self._recipe = ClientRecipe.of(self._redis) if self._redis is not None else None

    def __call__(self) -> None:
        self.check()

    def check(self) -> None:
        """Return if the lease is ours with at least the margin left; raise LeaseLostError otherwise."""
        if self.lost_reason is not None:
            raise LeaseLostError(self._message(self.lost_reason))
        if time.monotonic() < self.valid_until:
            return
        self.verify()

    def verify(self) -> float:
        """Ask Redis now (whatever the local deadline says); returns the seconds the lease has left."""
        t0 = time.monotonic()  # before the call: a pause during it must not stretch the deadline
        self.redis_checks += 1
        try:
            reply = self._client().eval(
                _CHECK, 1, keys.lease(self.host), self.job, str(self.fence), max(0, int(self.margin_s * 1000))
            )
        except redis.RedisError as exc:
            # Not proof of loss (the heartbeat decides that), but no proof of holding either.
            raise LeaseLostError(
                f"cannot check the lease on {self.host} ({type(exc).__name__}): not touching the host"
            ) from exc
        if int(reply[0]) == 1:
            left_s = int(reply[1]) / 1000
            self.extend(t0 + left_s - self.margin_s)
            return left_s
        why, detail = reply[1], reply[2]
        if why == "margin":
            # Still ours, but it could expire before what we are about to do lands: refuse, not lost.
            raise LeaseLostError(
                f"the lease on {self.host} has only {int(detail)} ms left, less than the {self.margin_s:g} s "
                "margin a side effect needs (renewals are late): not touching the host"
            )
        if why == "taken":
            holder = LeaseHolder.from_json(detail)
            self.lose(f"job {holder.job} ({holder.user}) holds it now (fence {holder.fence}, ours {self.fence})")
        else:
            self.lose("it expired")
        raise LeaseLostError(self._message(self.lost_reason or why))

    def deadline(self) -> float:
        """The instant (``time.monotonic()``) until which the lease is proven ours with the margin; -inf once lost.

        The host-side fence gets it with every action (mapped onto the host's clock), so a worker that
        wakes after it refuses on the host too, not only here.
        """
        return float("-inf") if self.lost_reason is not None else self.valid_until

    def extend(self, until: float) -> None:
        """Move the local deadline later (never earlier: any proof is a lower bound on the expiry)."""
        if until > self.valid_until:
            self.valid_until = until

    def lose(self, why: str) -> None:
        """Remember the lease is gone for good (another fence can never become ours again)."""
        if self.lost_reason is None:
            self.lost_reason = why

    def _message(self, why: str) -> str:
        return f"lost the lease on {self.host}: {why}; stopped touching the host"

    def _client(self) -> TextRedis:
        if self._redis is None:
            if self._recipe is None:
                raise LeaseLostError(f"no Redis to check the lease on {self.host}")
            self._redis = text_client(self._recipe.build())
        return self._redis

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_redis"] = None  # a client does not cross processes; the copy opens its own
        return state
