"""The server's own view of a level's latency, beside the client's: its histograms, read at the level's edges.

An engine's ``/metrics`` carries latency histograms it measures itself (vLLM ``time_to_first_token_seconds``,
``inter_token_latency_seconds``, ``e2e_request_latency_seconds``; SGLang the same names under ``sglang:``;
each engine folder's ``MetricNames`` lists them). Their ``_sum`` and ``_count`` only grow, so the level's
mean is the delta between a scrape taken when its measured phase starts (after the warmup) and one taken
when it ends: ``(sum1 - sum0) / (count1 - count0)``, in ms.

The client's figures include everything between the engine and the client's socket (the API server's
detokenising, framing and sending, the client's own scheduling). A gap larger than noise between the two
is named in the run's table (:func:`gap_notes`): "first token out of the engine at 9 ms, at the client at
150 ms: the API server delivers it late, not the engine". Nothing here raises into the bench.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from workers.engines.interface import MetricNames
from workers.json_value import JsonObject
from workers.telemetry.server_metrics import sample_values

#: The histograms a level's server view reads: (key in the view, the MetricNames field naming them).
KEYS = ("ttft", "itl", "e2e")
#: A client-minus-server gap is named only past this (ms) and past :data:`GAP_NOISE_SHARE` of the server's mean.
GAP_NOISE_MS = 20.0
GAP_NOISE_SHARE = 0.25

#: One scrape's totals: ``{key: (sum_s, count)}`` for each histogram the server has.
Totals = dict[str, tuple[float, float]]


@dataclass(frozen=True)
class LatencyNames:
    """Which histogram names hold each key, the first one a scrape has wins (releases renamed some)."""

    ttft: tuple[str, ...] = ()
    itl: tuple[str, ...] = ()
    e2e: tuple[str, ...] = ()

    @classmethod
    def of(cls, names: MetricNames) -> LatencyNames:
        return cls(names.ttft, names.itl, names.e2e)

    def any(self) -> bool:
        return bool(self.ttft or self.itl or self.e2e)


def totals(text: str, names: LatencyNames) -> Totals:
    """``{key: (sum, count)}`` over every label set of each histogram in a ``/metrics`` text; a key whose
    histogram is absent is left out. A body that is not the exposition format raises ValueError. Only the
    histograms' own families are parsed (a large ``/metrics`` costs a skim, not a parse)."""
    values = sample_values(text, names=(*names.ttft, *names.itl, *names.e2e))
    out: Totals = {}
    for key in KEYS:
        for name in getattr(names, key):
            sums, counts = values.get(name + "_sum"), values.get(name + "_count")
            if sums and counts:
                out[key] = (sum(sums), sum(counts))
                break
    return out


def level_view(start: Totals | None, end: Totals | None) -> JsonObject | None:
    """The server's means over the level (ms) and how many observations each has; None without both scrapes.

    ``requests`` is the end-to-end histogram's count delta: the requests the server finished in between.
    A key whose count did not grow (or shrank: the server restarted) is None.
    """
    if start is None or end is None:
        return None
    view: JsonObject = {}
    for key in KEYS:
        mean = None
        n = 0.0
        if key in start and key in end:
            n = end[key][1] - start[key][1]
            if n > 0:
                mean = round(1000.0 * (end[key][0] - start[key][0]) / n, 3)
        view[f"{key}_ms"] = mean
        view[f"{key}_count"] = int(n) if n > 0 else 0
    view["requests"] = view["e2e_count"]
    return view


def _client_mean(level: Mapping[str, object], key: str) -> float | None:
    stats = level.get(f"{key}_ms")
    value = stats.get("mean") if isinstance(stats, Mapping) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _server_mean(level: Mapping[str, object], key: str) -> float | None:
    view = level.get("server_view")
    value = view.get(f"{key}_ms") if isinstance(view, Mapping) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def gap(level: Mapping[str, object], key: str) -> float | None:
    """Client mean minus server mean (ms) when it is larger than noise, else None."""
    client, server = _client_mean(level, key), _server_mean(level, key)
    if client is None or server is None:
        return None
    diff = client - server
    return diff if diff > max(GAP_NOISE_MS, GAP_NOISE_SHARE * server) else None


_WHAT = {
    "ttft": ("first token out of the engine at {s}, at the client at {c}", "delivers it late"),
    "e2e": ("requests finished in the engine at {s}, at the client at {c}", "delivers their ends late"),
    "itl": ("tokens {s} apart in the engine, {c} at the client", "spaces them out"),
}


def gap_notes(where: str, level: Mapping[str, object]) -> list[str]:
    """One sentence per client-vs-server gap larger than noise, naming who is late.

    The client's own event-loop lag bounds what the client can add; a gap beyond it is the API server's
    (between the engine's histogram and the socket), not the engine's.
    """
    client = level.get("client")
    lag = client.get("lag_p99_ms") if isinstance(client, Mapping) else None
    lag_ms = float(lag) if isinstance(lag, int | float) and not isinstance(lag, bool) else 0.0
    notes = []
    for key in ("ttft", "e2e", "itl"):
        diff = gap(level, key)
        if diff is None:
            continue
        c, s = _client_mean(level, key), _server_mean(level, key)
        text, late = _WHAT[key]
        said = text.format(s=_ms(s), c=_ms(c))
        if diff > lag_ms:
            who = f"the API server {late}, not the engine"
        else:
            who = f"the client's own lag (p99 {lag_ms:.0f} ms) can explain it"
        notes.append(f"{where}: {said} (means): {who}")
    return notes


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


class LevelScrapes:
    """The two scrapes of each level: :meth:`measured_start` (after its warmup) and :meth:`level_end`.

    ``views[i]`` is level ``i``'s :func:`level_view` (None where a scrape failed or the start was never
    marked); a scrape that fails is a missing view, never an error.
    """

    def __init__(self, url: str, names: LatencyNames, api_key: str | None = None, timeout_s: float = 5.0) -> None:
        self.url, self.names, self.api_key, self.timeout_s = url, names, api_key, timeout_s
        self.views: list[JsonObject | None] = []
        self._start: Totals | None = None

    async def scrape(self) -> Totals | None:
        from workers.capped_http import capped_client

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            async with capped_client(headers=headers, timeout=self.timeout_s) as client:
                resp = await client.get(self.url)
            if resp.status_code != 200:
                return None
            # Parsed off the event loop that drives the load (a large body would stall it: issue 39, round 4).
            return await asyncio.to_thread(totals, resp.text, self.names)
        except Exception:  # best effort: no view for this level
            return None

    def level_begins(self) -> None:
        self._start = None
        self.views.append(None)

    async def measured_start(self) -> None:
        self._start = await self.scrape()

    async def level_end(self) -> None:
        if self._start is not None and self.views:
            self.views[-1] = level_view(self._start, await self.scrape())
        self._start = None
