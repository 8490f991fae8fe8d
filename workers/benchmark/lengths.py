"""Input and output length distributions: ``in=1024``, ``in=512-2048``, ``out=dataset``.

Real traffic does not send 1024 tokens every time, and a server's batching behaves differently when
lengths vary (padding, chunked prefill, requests finishing at different times). Three shapes:

- ``Fixed(n)``: every request ``n`` tokens (``in=1024``), what the closed-loop client does today;
- ``UniformRange(lo, hi)``: a whole number drawn uniformly from ``[lo, hi]``, both ends included
  (``in=512-2048``). Written as the two ends, never as a "range ratio": vLLM and SGLang read the same
  ``--random-range-ratio`` in opposite ways (bench-clients.md), ends cannot be misread;
- ``FromDataset()``: the lengths of the dataset's own prompts (``in=dataset``) or replies
  (``out=dataset``).

Draws are deterministic: ``random.Random`` seeded with ``(seed, stream)``, where the stream (``"in"``
or ``"out"``) keeps input and output lengths independent of each other.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from workers.errors import BenchbotError

#: A sanity bound for the parser; a deployment's own (lower) limit comes from the config.
MAX_LENGTH_TOKENS = 10_000_000
LENGTH_KEYS = ("in", "out")
DATASET_WORD = "dataset"
_RANGE_RE = re.compile(r"([0-9]+)\s*(?:-|–|\.\.)\s*([0-9]+)")
_SHORTHAND_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([kKmM])")


@dataclass(frozen=True)
class Fixed:
    """Every request gets exactly ``tokens`` tokens."""

    tokens: int

    def describe(self) -> str:
        return str(self.tokens)

    @property
    def mean(self) -> float:
        return float(self.tokens)

    @property
    def bounds(self) -> tuple[int, int]:
        return self.tokens, self.tokens


@dataclass(frozen=True)
class UniformRange:
    """A whole number of tokens drawn uniformly from ``[low, high]``, both included."""

    low: int
    high: int

    def describe(self) -> str:
        return f"{self.low}-{self.high}"

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    @property
    def bounds(self) -> tuple[int, int]:
        return self.low, self.high


@dataclass(frozen=True)
class FromDataset:
    """Lengths come from the dataset: its prompts (``in``) or its reference replies (``out``)."""

    def describe(self) -> str:
        return DATASET_WORD


LengthDist = Fixed | UniformRange | FromDataset


def parse_length(text: str, key: str = "in", *, max_tokens: int = MAX_LENGTH_TOKENS) -> LengthDist:
    """The value of ``in=`` / ``out=`` -> a distribution, or a ``BenchbotError`` saying how to write it.

    Accepts ``1024``, ``512-2048`` (also ``512..2048`` and an en dash), and ``dataset``.
    ``max_tokens`` is the deployment's limit (``config.limits.max_tokens``).
    """
    value = text.strip()
    opt = f"{key}="
    example = f"{opt}1024 (fixed) or {opt}512-2048 (uniform range)"
    if not value:
        raise BenchbotError(f"{opt} needs a number of tokens, e.g. {example}")
    if value.lower() == DATASET_WORD:
        return FromDataset()
    if re.fullmatch(r"[0-9]+", value):
        return Fixed(_tokens(value, opt, max_tokens))
    if match := _RANGE_RE.fullmatch(value):
        low, high = _tokens(match[1], opt, max_tokens), _tokens(match[2], opt, max_tokens)
        if low > high:
            raise BenchbotError(f"{opt}{value}: the range goes from low to high, e.g. {opt}{high}-{low}")
        return Fixed(low) if low == high else UniformRange(low, high)
    if match := _SHORTHAND_RE.fullmatch(value):
        raise BenchbotError(
            f"{opt}{value}: write the number of tokens in full, e.g. {opt}"
            f"{int(float(match[1]) * (1024 if match[2] in 'kK' else 1024**2))} "
            '("k" could mean 1000 or 1024)'
        )
    if re.fullmatch(r"-[0-9]+", value) or re.fullmatch(r"-[0-9]+\s*-\s*[0-9]+", value):
        raise BenchbotError(f"{opt}{value}: a length is at least 1 token")
    raise BenchbotError(f"{opt}{value} is not a length: write {example}, or {opt}{DATASET_WORD}")


def _tokens(digits: str, opt: str, max_tokens: int) -> int:
    if len(digits) > 9:
        raise BenchbotError(f"{opt}{digits}: at most {max_tokens} tokens")
    n = int(digits)
    if n < 1:
        raise BenchbotError(f"{opt}{digits}: a length is at least 1 token (0 tokens measures nothing)")
    if n > max_tokens:
        raise BenchbotError(f"{opt}{n}: at most {max_tokens} tokens on this deployment")
    return n


def sample_lengths(
    dist: LengthDist, n: int, seed: int, *, stream: str = "in", dataset_lengths: Sequence[int] | None = None
) -> tuple[int, ...]:
    """``n`` lengths drawn from ``dist``, the same for the same ``(seed, stream)``.

    ``FromDataset`` needs ``dataset_lengths``: the lengths of the ``n`` dataset items already chosen for
    these requests, returned as they are (the dataset sampler owns the randomness then).
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    if isinstance(dist, Fixed):
        return (dist.tokens,) * n
    if isinstance(dist, UniformRange):
        rng = random.Random(f"lengths:{seed}:{stream}")
        return tuple(rng.randint(dist.low, dist.high) for _ in range(n))
    if dataset_lengths is None:
        raise BenchbotError(f"{stream}={DATASET_WORD} needs a dataset: name one with data=NAME")
    if len(dataset_lengths) != n:
        raise ValueError("one dataset length per request")
    return tuple(max(1, int(x)) for x in dataset_lengths)
