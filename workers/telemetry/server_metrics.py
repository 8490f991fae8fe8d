"""The engine's own ``/metrics`` during a level: running and queued requests and KV-cache usage.

Parsed with ``prometheus_client``'s text parser (the exposition format has escapes, labels and
histograms a hand-written split gets wrong). Each engine names the same three things its own way (its
folder's ``ENGINE.metrics``; older vLLM releases call KV usage ``gpu_cache_usage_perc``); all report usage
as a 0..1 fraction. A reading takes the first name any registered engine uses that the scrape has.
"""

from __future__ import annotations

from collections.abc import Callable
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


def sample_values(text: str) -> dict[str, list[float]]:
    """Every sample's values by name, one per label set (a DP engine reports one series per rank)."""
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values.setdefault(sample.name, []).append(float(sample.value))
    return values


def _first(
    values: dict[str, list[float]], names: tuple[str, ...], combine: Callable[[list[float]], float]
) -> float | None:
    return next((combine(values[n]) for n in names if values.get(n)), None)


def parse_server_metrics(text: str) -> ServerReading:
    """The reading in ``text``: requests summed over ranks, KV usage the fullest rank's; a body that is not
    the exposition format raises ValueError."""
    values = sample_values(text)
    return ServerReading(
        _first(values, _names(lambda m: m.running), sum),
        _first(values, _names(lambda m: m.queued), sum),
        _first(values, _names(lambda m: m.kv_usage), max),
    )
