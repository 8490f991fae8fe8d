"""What one response may cost the load generator: bytes, head size, line length, and silence.

A server that streams forever, sends a chunk size of ``FFFF...`` or endless headers grew the client by
~600 MB/s, and a silent or trickling one held a request for the whole 900 s timeout (issue 25, item 3).
The same client runs inside workers against engines, so a broken engine could take a worker's memory.
Every response is now bounded, and a request that hits a bound ends with an error that names the
option to change (``... (max-bytes=70MB)``), so :func:`limit_kind` can count it and the level says so.

The defaults are far from what a healthy server sends: the byte budget grows with the output asked for
(SGLang's ``/generate`` streams the whole text so far in every event, so a response grows with the
square of its tokens), a head of 64 KiB is ~100 times a real one, a line of 1 MiB (or 64 bytes a token)
holds the longest cumulative event, and the silences are minutes. Each check on the hot path is a
counter comparison per read; the clocks are read by one watchdog per sender, not per chunk.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from workers.errors import BenchbotError
from workers.json_value import JsonObject, RawJson

MiB = 2**20
DEFAULT_TIMEOUT_S = 900.0
DEFAULT_FIRST_BYTE_S = 300.0
DEFAULT_IDLE_S = 300.0
DEFAULT_HEADER_BYTES = 64_000
#: The byte budget with no ``max-bytes=``: this floor plus :data:`BYTES_PER_TOKEN_SQUARED` x tokens^2.
BYTES_FLOOR = 64 * MiB
BYTES_PER_TOKEN_SQUARED = 32
#: The line budget with no ``line-bytes=``: this floor or 64 bytes per output token, the larger.
LINE_FLOOR = 1 * MiB
LINE_BYTES_PER_TOKEN = 64
#: A chunk-size line (hex digits and extensions) longer than this is not HTTP.
CHUNK_LINE_BYTES = 1024

#: The option each bound is changed with; a cut request's error ends with ``(<option>=<value>)``.
OPTIONS = ("timeout", "first-byte", "idle", "max-bytes", "header-bytes", "line-bytes")
_KIND = re.compile(r"\((" + "|".join(re.escape(o) for o in OPTIONS) + r")=[^()]*\)$|\((framing)\)$")
_SIZE = re.compile(r"(?P<number>\d+(?:\.\d*)?)\s*(?P<unit>[kKmMgG]i?[bB]|[bB])?")
_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def format_bytes(n: int) -> str:
    """``70MB``, ``64KiB``-free: decimal units, as people type them back into ``max-bytes=``."""
    for unit, size in (("GB", 1000**3), ("MB", 1000**2), ("KB", 1000)):
        if n >= size:
            return f"{n / size:.4g}{unit}"
    return f"{n}B"


def parse_bytes(text: str, what: str) -> int:
    """``"256MB"`` / ``"1GiB"`` / ``"65536"`` -> bytes (at least 1 KB); a friendly error otherwise."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise BenchbotError(f"{what}{text} is not a size: write it like {what}256MB, {what}1GB or {what}65536")
    value = float(match["number"]) * _UNITS[(match["unit"] or "b").lower()]
    if not math.isfinite(value) or value < 1000:
        raise BenchbotError(f"{what}{text}: a response budget below 1KB would cut every response")
    return int(value)


def limit_kind(error: str | None) -> str | None:
    """The option a request's error says it was cut by (``max-bytes``, ``idle``, ...), or None."""
    if not error:
        return None
    match = _KIND.search(error)
    return (match.group(1) or match.group(2)) if match else None


@dataclass(frozen=True)
class ResponseLimits:
    """The bounds on one response; ``None`` byte budgets scale with the output tokens asked for."""

    timeout_s: float = DEFAULT_TIMEOUT_S  # the whole request
    first_byte_s: float = DEFAULT_FIRST_BYTE_S  # send -> the whole response head (status and headers)
    idle_s: float = DEFAULT_IDLE_S  # the longest silence between two reads (the wait for the first token too)
    max_bytes: int | None = None  # the whole response as received (head and framing included)
    header_bytes: int = DEFAULT_HEADER_BYTES
    line_bytes: int | None = None  # the longest line of the body (an SSE ``data:`` line)

    def __post_init__(self) -> None:
        for name in ("timeout_s", "first_byte_s", "idle_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise BenchbotError(f"{name} must be a positive number of seconds, not {value!r}")
        for name in ("max_bytes", "header_bytes", "line_bytes"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and value >= 1000):
                raise BenchbotError(f"{name} must be at least 1000 bytes, not {value!r}")

    def bytes_for(self, output_tokens: int) -> int:
        """The byte budget of a response asked for ``output_tokens`` tokens."""
        if self.max_bytes is not None:
            return self.max_bytes
        return BYTES_FLOOR + BYTES_PER_TOKEN_SQUARED * output_tokens * output_tokens

    def line_for(self, output_tokens: int) -> int:
        """The longest body line a response asked for ``output_tokens`` tokens may have."""
        if self.line_bytes is not None:
            return self.line_bytes
        return max(LINE_FLOOR, LINE_BYTES_PER_TOKEN * output_tokens)

    def budget(self, output_tokens: int) -> Budget:
        """The resolved bounds for responses of at most ``output_tokens`` tokens (what a sender checks)."""
        return Budget(
            self.timeout_s,
            self.first_byte_s,
            self.idle_s,
            self.bytes_for(output_tokens),
            self.header_bytes,
            self.line_for(output_tokens),
            explicit_bytes=self.max_bytes is not None,
            explicit_line=self.line_bytes is not None,
        )

    def to_dict(self) -> JsonObject:
        """Only what differs from the defaults (the spec and run JSON stay as they were without it)."""
        default = ResponseLimits()
        return {k: v for k, v in self.__dict__.items() if v != getattr(default, k)}

    @classmethod
    def from_dict(cls, data: RawJson | None) -> ResponseLimits:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (a newer bot's)."""
        data = data or {}
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        for key in ("max_bytes", "header_bytes", "line_bytes"):
            if known.get(key) is not None:
                known[key] = int(known[key])
        for key in ("timeout_s", "first_byte_s", "idle_s"):
            if key in known:
                known[key] = float(known[key])
        return cls(**known)


@dataclass(frozen=True)
class Budget:
    """:class:`ResponseLimits` resolved for one sender, with the sentences a cut request ends with."""

    timeout_s: float
    first_byte_s: float
    idle_s: float
    max_bytes: int
    header_bytes: int
    line_bytes: int
    explicit_bytes: bool = False
    explicit_line: bool = False

    def too_big(self) -> str:
        return (
            f"the response grew past {format_bytes(self.max_bytes)} and was cut off: a healthy server ends "
            f"long before (max-bytes={format_bytes(self.max_bytes)})"
        )

    def announced_too_big(self, size: int, received: int = 0) -> str:
        """A response announced to outgrow max-bytes: by ``size`` alone (its Content-Length, one huge chunk),
        or a chunk that, after the ``received`` bytes already read, would take the running total past it."""
        limit = f"(max-bytes={format_bytes(self.max_bytes)})"
        if size > self.max_bytes or not received:
            return f"the server announced {format_bytes(size)} to come, more than the whole response may be {limit}"
        return (
            f"the response would grow past {format_bytes(self.max_bytes)}: {format_bytes(received)} received, then "
            f"a chunk of {format_bytes(size)} announced {limit}"
        )

    def head_too_big(self, detail: str = "") -> str:
        said = f" ({detail})" if detail else ""
        return (
            f"the response head (status and headers) grew past {format_bytes(self.header_bytes)} without "
            f"ending{said} (header-bytes={format_bytes(self.header_bytes)})"
        )

    def line_too_long(self) -> str:
        return (
            f"a line of the response grew past {format_bytes(self.line_bytes)} without a newline "
            f"(line-bytes={format_bytes(self.line_bytes)})"
        )

    def chunk_line_too_long(self) -> str:
        return f"a chunk-size line grew past {CHUNK_LINE_BYTES} bytes: not HTTP chunked framing (framing)"

    def bad_framing(self, what: str) -> str:
        return f"not HTTP framing: {what} (framing)"

    def no_first_byte(self) -> str:
        return f"no complete response head within {self.first_byte_s:g} s (first-byte={self.first_byte_s:g}s)"

    def silent(self) -> str:
        return f"nothing received for {self.idle_s:g} s mid-response (idle={self.idle_s:g}s)"

    def timed_out(self) -> str:
        return f"timed out after {self.timeout_s:g} s (timeout={self.timeout_s:g}s)"


DEFAULT_LIMITS = ResponseLimits()
