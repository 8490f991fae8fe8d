"""The bot's ``/metrics``: the fleet (read from Redis at scrape time) plus the one series only the bot has.

Slack gives an app 3 s to acknowledge a slash command or a button press, or the user sees "operation
timed out" even though the command ran. How close the bot comes to that is what operators need to
watch (bench/ack_latency.py measures it once; this measures it always): ``benchbot_slack_ack_seconds``,
from the moment a request reached the bot (HTTP mode: :class:`bot.slack_http.SlackHTTPServer` stamps
it before reading the body; Socket Mode: the first bolt middleware) to the moment ``ack()`` returned.

The histogram lives in this process (the bot does not fork), in :data:`REGISTRY`; the served registry
adds :class:`workers.ops_metrics.FleetCollector` over every configured host.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping

import redis
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from workers.config import Config
from workers.ops_metrics import MetricsServer, fleet_registry, metrics_bind, serve

#: The bolt context key holding ``time.monotonic()`` at the request's receipt.
RECEIVED_AT = "benchbot_received_at"
#: Around Slack's 3 s deadline, finer below 100 ms where a healthy bot lives.
ACK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0)
COMMAND, ACTION = "command", "action"
ACK_METRIC = "benchbot_slack_ack_seconds"

#: This process's own series (the fleet's are read from Redis by the served registry).
REGISTRY = CollectorRegistry()
SLACK_ACK = Histogram(
    ACK_METRIC,
    "Time from a Slack request's receipt to its ack (Slack gives up after 3 s)",
    ["kind"],
    buckets=ACK_BUCKETS,
    registry=REGISTRY,
)


def stamp_receipt(context: MutableMapping[str, object], next_: Callable[[], None]) -> None:
    """Bolt middleware: the receipt time, unless the HTTP server stamped an earlier one."""
    context.setdefault(RECEIVED_AT, time.monotonic())
    next_()


def observe_ack(kind: str, context: Mapping[str, object]) -> None:
    """Record one ack's latency (call right after ``ack()``)."""
    received = context.get(RECEIVED_AT)
    if isinstance(received, float):
        SLACK_ACK.labels(kind).observe(max(0.0, time.monotonic() - received))


class _Own(Collector):
    """:data:`REGISTRY` inside the served registry."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


def start_bot_metrics(config: Config, r: redis.Redis) -> MetricsServer | None:
    """The bot's endpoint on ``[metrics] bot_port`` (all hosts); None when the config names no port."""
    if config.metrics.bot_port is None:
        return None
    registry = fleet_registry(r, list(config.hosts), all_series=True)
    registry.register(_Own())
    return serve(registry, config.metrics.bot_port, metrics_bind(config))
