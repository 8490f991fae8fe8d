"""The engine's own ``/metrics`` during a level: running and queued requests and KV-cache usage.

Parsed with ``prometheus_client``'s text parser (the exposition format has escapes, labels and
histograms a hand-written split gets wrong). Each engine names the same three things its own way (its
folder's ``ENGINE.metrics``; older vLLM releases call KV usage ``gpu_cache_usage_perc``); all report usage
as a 0..1 fraction. A reading takes the first name any registered engine uses that the scrape has.

A scrape never disturbs the load it measures (issue 39 round 4, item 4): a real engine with many series
and DP ranks serves a megabyte of ``/metrics``, and prometheus' parser takes seconds over it. So only the
lines of the families asked for are parsed (a cheap name test per line, the rest skipped unparsed), at
most :data:`MAX_LINES` lines and :data:`MAX_SAMPLES` samples are read, and the sampler runs the parse off
the event loop (:mod:`workers.telemetry.sampler`). An engine's figure is checked before it is a fact
(item 6): a NaN, an infinity, a negative count or a KV usage outside 0..1 is dropped and counted, never a
``kv_usage_peak inf`` or a ``queue_mean -5``.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from workers.engines import registry
from workers.engines.interface import MetricNames


def _names(pick: Callable[[MetricNames], tuple[str, ...]]) -> tuple[str, ...]:
    """One metric's names over every registered engine, in registry order."""
    return tuple(name for engine in registry.engines() for name in pick(engine.metrics))


@dataclass(frozen=True)
class ServerReading:
    """One scrape: requests running and waiting, KV-cache usage (0..1); None when the server has no such metric."""

    running: float | None
    queued: float | None
    kv_usage: float | None
    #: Samples of these metrics dropped as impossible (NaN, infinite, negative, a usage above 1).
    dropped: int = 0
    #: True when the body had more than the bounds read (:data:`MAX_LINES`, :data:`MAX_SAMPLES`).
    truncated: bool = False


#: The most lines of one ``/metrics`` body looked at (a real engine's is ~15k lines; 16 MiB is ~300k).
MAX_LINES = 400_000
#: The most samples of the asked families kept from one body (a DP engine has one series per rank).
MAX_SAMPLES = 20_000
#: What a family's samples may end with beside its name (histograms, summaries, counters).
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created", "_gsum", "_gcount")


def _family_of(line: str) -> str:
    """The metric name a sample line or a ``# HELP``/``# TYPE`` line is about ("" for a comment)."""
    if line.startswith("#"):
        parts = line.split(None, 3)
        return parts[2] if len(parts) > 2 and parts[1] in ("HELP", "TYPE", "UNIT") else ""
    end = len(line)
    for stop in ("{", " ", "\t"):
        at = line.find(stop)
        if 0 <= at < end:
            end = at
    return line[:end]


def _wanted(name: str, names: Collection[str]) -> bool:
    if name in names:
        return True
    return any(name.endswith(suffix) and name[: -len(suffix)] in names for suffix in _SUFFIXES)


def sample_values(text: str, names: Collection[str] | None = None) -> dict[str, list[float]]:
    """Every sample's values by name, one per label set (a DP engine reports one series per rank);
    ``names``: only those families' lines are parsed (the rest are skipped unparsed). At most
    :data:`MAX_LINES` lines and :data:`MAX_SAMPLES` samples are read (:func:`read_values` says whether
    the body held more)."""
    return read_values(text, names)[0]


def read_values(text: str, names: Collection[str] | None = None) -> tuple[dict[str, list[float]], bool]:
    """:func:`sample_values` and whether the body went past the bounds (truncated)."""
    kept: list[str] = []
    truncated = False
    for count, line in enumerate(io.StringIO(text)):
        if count >= MAX_LINES or len(kept) >= MAX_SAMPLES:
            truncated = True
            break
        if names is None or _wanted(_family_of(line), names):
            kept.append(line)
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families("".join(kept)):
        for sample in family.samples:
            values.setdefault(sample.name, []).append(float(sample.value))
    return values, truncated


def possible(value: float, *, fraction: bool = False) -> bool:
    """A gauge value an engine can really report: finite, not negative (and at most 1 for a fraction)."""
    return math.isfinite(value) and value >= 0 and (not fraction or value <= 1.0)


def _first(
    values: dict[str, list[float]],
    names: tuple[str, ...],
    combine: Callable[[list[float]], float],
    dropped: list[int],
    *,
    fraction: bool = False,
) -> float | None:
    """The first of ``names`` with a possible value, combined over its series; impossible ones counted."""
    for name in names:
        found = values.get(name) or []
        good = [v for v in found if possible(v, fraction=fraction)]
        dropped[0] += len(found) - len(good)
        if good:
            return combine(good)
    return None


def parse_server_metrics(text: str) -> ServerReading:
    """The reading in ``text``: requests summed over ranks, KV usage the fullest rank's, impossible samples
    dropped and counted; a body that is not the exposition format raises ValueError."""
    running, queued, kv = _names(lambda m: m.running), _names(lambda m: m.queued), _names(lambda m: m.kv_usage)
    values, truncated = read_values(text, {*running, *queued, *kv})
    dropped = [0]
    return ServerReading(
        _first(values, running, sum, dropped),
        _first(values, queued, sum, dropped),
        _first(values, kv, max, dropped, fraction=True),
        dropped=dropped[0],
        truncated=truncated,
    )
