"""Prometheus ``/metrics`` for the people who run benchbot: the fleet as Redis holds it, read at scrape time.

Why a custom collector instead of gauges kept up to date: queue depth, lease holders and observation
ages live in Redis and change in other processes (the bot enqueues, a horse takes the lease, an observer
writes an observation). A gauge in this process would only be as fresh as its last update; reading Redis
when Prometheus asks is always current, costs nothing between scrapes, and gives every process that
serves ``/metrics`` the same answer. One scrape is three round trips, whatever the fleet's size: one
pipeline (counters, histogram, each host's lease holder, observation and observer liveness), then the
two of :func:`workers.jobs.queue_view.list_jobs_many` (the very reads ``/queue`` makes, so the dashboard's
queue depth is exactly what people see in Slack).

The counters of events that happen in forked work horses come from Redis too
(:mod:`workers.jobs.job_metrics` says why). Per-process series (the bot's Slack ack latency, the process
collector's CPU and memory) are the only ones kept in memory.

Every endpoint is opt-in (``[metrics]`` in the config; nothing listens by default) and binds loopback
unless the config says otherwise (``BENCHBOT_METRICS_BIND`` overrides it for a container, whose loopback
no Prometheus beside it can reach).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis
from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from workers import keys, redis_conn
from workers.config import Config
from workers.errors import BenchbotError
from workers.jobs import job_metrics, queue_view
from workers.jobs.events import JobState

log = logging.getLogger(__name__)

BIND_ENV = "BENCHBOT_METRICS_BIND"
#: Live job states, as /queue shows them (``queued``: no worker took it yet; ``waiting``: in line).
LIVE_STATES = (JobState.QUEUED, JobState.WAITING, JobState.RUNNING)


@dataclass(frozen=True)
class CounterSpec:
    """How one stored counter (:mod:`workers.jobs.job_metrics`) is exposed: its name, help and label names."""

    name: str
    documentation: str
    labels: tuple[str, ...]


COUNTERS: dict[str, CounterSpec] = {
    job_metrics.JOBS_ENDED: CounterSpec(
        "benchbot_jobs_ended", "Jobs that ended, by host, kind and ending", ("host", "kind", "state")
    ),
    job_metrics.JOB_FAILURES: CounterSpec(
        "benchbot_job_failures", "Failed jobs by host, kind and diagnosis category", ("host", "kind", "category")
    ),
    job_metrics.LEASE_LOSSES: CounterSpec(
        "benchbot_lease_losses", "Jobs that lost their host's lease mid-job (ended failed, lease_lost)", ("host",)
    ),
    job_metrics.ENGINE_LAUNCHES: CounterSpec(
        "benchbot_engine_launches", "Engine processes spawned, by host and engine kind", ("host", "engine")
    ),
    job_metrics.ENGINE_LAUNCH_FAILURES: CounterSpec(
        "benchbot_engine_launch_failures",
        "Spawned engines that never became usable, by diagnosis category",
        ("host", "engine", "category"),
    ),
}

#: Every metric name a benchbot endpoint serves (counters without ``_total``), for the docs and the dashboard test.
FLEET_METRICS = (
    "benchbot_queue_depth",
    "benchbot_jobs",
    *(spec.name for spec in COUNTERS.values()),
    "benchbot_job_duration_seconds",
    "benchbot_lease_held_seconds",
    "benchbot_observation_age_seconds",
    "benchbot_host_served",
    "benchbot_redis_up",
    "benchbot_metrics_collect_seconds",
)


@dataclass(frozen=True)
class _HostReads:
    """What the pipeline read for one host."""

    holder_since: float | None
    observed_at: float | None
    served: bool


def _since(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        body = json.loads(raw)
        return float(body["since"]) if isinstance(body, dict) else None
    except (ValueError, KeyError, TypeError):
        return None


def _observed_at(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        body = json.loads(raw)
        at = body.get("observed_at") if isinstance(body, dict) else None
        return float(at) if isinstance(at, int | float) else None
    except ValueError:
        return None


class FleetCollector(Collector):
    """The fleet's metrics, read from Redis on every :meth:`collect` (that is, every scrape).

    ``hosts``: the hosts this endpoint reports (a worker: the ones it serves; the bot: all of them).
    ``all_series``: whether counters of hosts outside ``hosts`` are reported too (the bot's endpoint,
    so a job whose host is no longer configured still counts somewhere).
    """

    def __init__(
        self,
        r: redis.Redis,
        hosts: Sequence[str],
        *,
        all_series: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._r = redis_conn.text_client(r)
        self._hosts = list(hosts)
        self._all_series = all_series
        self._clock = clock

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: describing would read Redis at registration (and fail while it is away)."""
        return []

    def _wanted(self, host: str) -> bool:
        return self._all_series or host in self._hosts

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        try:
            yield from self._collect()
        except redis.RedisError as exc:
            # A scrape while Redis is away: say so in one series instead of failing the whole endpoint.
            log.warning("metrics: Redis unreachable during a scrape (%s)", type(exc).__name__)
            up = GaugeMetricFamily("benchbot_redis_up", "Whether this scrape could read Redis")
            up.add_metric([], 0)
            yield up
            return
        up = GaugeMetricFamily("benchbot_redis_up", "Whether this scrape could read Redis")
        up.add_metric([], 1)
        yield up
        took = GaugeMetricFamily("benchbot_metrics_collect_seconds", "How long reading this scrape from Redis took")
        took.add_metric([], time.perf_counter() - started)
        yield took

    def _collect(self) -> Iterator[Metric]:
        pipe = self._r.pipeline(transaction=False)
        pipe.hgetall(keys.METRICS_COUNTERS)
        pipe.hgetall(keys.METRICS_DURATIONS)
        for host in self._hosts:
            pipe.get(keys.lease(host))
            pipe.pttl(keys.lease(host))
            pipe.get(keys.host_observed(host))
            pipe.exists(keys.observer_alive(host))
        answers = pipe.execute()
        now = self._clock()
        counters, durations = answers[0], answers[1]
        reads: dict[str, _HostReads] = {}
        for i, host in enumerate(self._hosts):
            holder, ttl_ms, observed, alive = answers[2 + 4 * i : 6 + 4 * i]
            reads[host] = _HostReads(_since(holder) if ttl_ms != -2 else None, _observed_at(observed), bool(alive))
        lines = queue_view.list_jobs_many(self._r, self._hosts)

        depth = GaugeMetricFamily(
            "benchbot_queue_depth", "Jobs waiting for the host (queued or in line)", labels=["host"]
        )
        jobs = GaugeMetricFamily(
            "benchbot_jobs", "Unfinished jobs by host, kind and state", labels=["host", "kind", "state"]
        )
        for host in self._hosts:
            line = lines.get(host, [])
            depth.add_metric([host], sum(1 for job in line if job.state != JobState.RUNNING))
            counts: dict[tuple[str, str], int] = {}
            for job in line:
                counts[(job.kind, job.state)] = counts.get((job.kind, job.state), 0) + 1
            for (kind, state), n in sorted(counts.items()):
                jobs.add_metric([host, kind, str(state)], n)
        yield depth
        yield jobs

        held = GaugeMetricFamily(
            "benchbot_lease_held_seconds",
            "How long the current job has held the host's lease (0: free)",
            labels=["host"],
        )
        age = GaugeMetricFamily(
            "benchbot_observation_age_seconds",
            "Age of the host's stored observation (what /status shows)",
            labels=["host"],
        )
        served = GaugeMetricFamily(
            "benchbot_host_served", "1 while a worker's observer serves the host", labels=["host"]
        )
        for host, read in reads.items():
            held.add_metric([host], max(0.0, now - read.holder_since) if read.holder_since is not None else 0.0)
            if read.observed_at is not None:
                age.add_metric([host], max(0.0, now - read.observed_at))
            served.add_metric([host], 1 if read.served else 0)
        yield held
        yield age
        yield served

        yield from self._counters(job_metrics.parse_counters(counters))
        duration = HistogramMetricFamily(
            "benchbot_job_duration_seconds", "How long jobs held their host's lease, by kind", labels=["kind"]
        )
        bounds = [str(float(b)) for b in job_metrics.DURATION_BUCKETS] + ["+Inf"]
        for hist in job_metrics.parse_durations(durations):
            duration.add_metric([hist.kind], list(zip(bounds, hist.cumulative, strict=True)), hist.total)
        yield duration

    def _counters(self, stored: list[job_metrics.Counted]) -> Iterator[Metric]:
        families = {
            metric: CounterMetricFamily(spec.name, spec.documentation, labels=list(spec.labels))
            for metric, spec in COUNTERS.items()
        }
        for series in sorted(stored, key=lambda c: (c.metric, c.labels)):
            spec = COUNTERS.get(series.metric)
            if spec is None or len(series.labels) != len(spec.labels) or not self._wanted(series.labels[0]):
                continue
            families[series.metric].add_metric(list(series.labels), series.value)
        yield from families.values()


# ---- serving ------------------------------------------------------------------------------------


class MetricsServer:
    """A running ``/metrics`` endpoint (prometheus_client's WSGI server in a daemon thread)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    @property
    def url(self) -> str:
        return f"http://{self._server.server_address[0]!s}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def metrics_bind(config: Config) -> str:
    """The address to listen on: ``BENCHBOT_METRICS_BIND`` if set (a container), else ``[metrics] bind``."""
    bind = os.environ.get(BIND_ENV, "").strip() or config.metrics.bind
    try:
        ipaddress.ip_address(bind)
    except ValueError:
        raise BenchbotError(f"{BIND_ENV}={bind!r} is not an IP address to listen on (e.g. 0.0.0.0)") from None
    return bind


#: How long one connection may take to send its request (and to read the answer) before it is dropped: a
#: thread per held connection would otherwise pile up behind a slow or idle client (issue 39 round 4, item 7).
READ_TIMEOUT_S = 10.0


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


def serve(
    registry: CollectorRegistry, port: int, bind: str = "127.0.0.1", *, read_timeout_s: float = READ_TIMEOUT_S
) -> MetricsServer:
    """Serve ``registry`` on ``http://bind:port/metrics``; a clear BenchbotError if the port is taken. Each
    connection has ``read_timeout_s`` for every read and write (prometheus_client's own server has none)."""

    class Handler(WSGIRequestHandler):
        timeout = read_timeout_s  # socketserver sets it on the connection's socket

        def log_message(self, format: str, *args: object) -> None:  # no line per scrape
            pass

    server_class = _ThreadingServer6 if ":" in bind else _ThreadingServer
    try:
        server = make_server(bind, port, make_wsgi_app(registry), server_class, handler_class=Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
    except OSError as exc:
        raise BenchbotError(
            f"cannot serve metrics on {bind}:{port} ({exc.strerror or exc}); pick another port under [metrics]"
        ) from None
    log.info("metrics on http://%s:%d/metrics", bind, server.server_port)
    return MetricsServer(server, thread)


def fleet_registry(r: redis.Redis, hosts: Sequence[str], *, all_series: bool) -> CollectorRegistry:
    """A registry with the fleet collector and this process's CPU/memory (``process_*``)."""
    registry = CollectorRegistry()
    registry.register(FleetCollector(r, hosts, all_series=all_series))
    ProcessCollector(registry=registry)
    return registry


def start_worker_metrics(config: Config, redis_url: str, hosts: Sequence[str]) -> MetricsServer | None:
    """A worker's endpoint (its hosts only), if ``[metrics] worker_ports`` names one of them; else None.

    A port already taken is a warning, not a reason to stop: a second worker for the same host on the
    same machine (docs/deploy.md: safe, for availability) finds the first one's endpoint there, and that
    endpoint already reports this host (every series comes from Redis). Metrics never keep jobs from running.
    """
    port = config.metrics.worker_port(list(hosts))
    if port is None:
        return None
    bind = metrics_bind(config)
    r = redis_conn.connect(redis_url, decode_responses=True)
    try:
        return serve(fleet_registry(r, hosts, all_series=False), port, bind)
    except BenchbotError as exc:
        log.warning("worker for %s runs without its own /metrics: %s", ", ".join(hosts), exc)
        r.close()
        return None
