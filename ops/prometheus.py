"""Prometheus beside benchbot in compose: the optional service and its ``prometheus.yml``, from ``[metrics]``.

Rendered from the config for the same reason as the rest of ``deploy/``: the scrape targets are the
ports ``[metrics]`` names and the worker services the hosts name, so writing them by hand would drift.
Nothing here is rendered for a config without ``[metrics]`` (its processes serve no endpoint).

In compose every process runs in its own container, whose loopback no other container reaches, so the
bot and the workers get ``BENCHBOT_METRICS_BIND=0.0.0.0`` there; no metrics port is published on the
host, only the compose network reaches them. Prometheus itself is published on the host's loopback
(``127.0.0.1:9090``) and is behind the compose profile ``metrics``: ``docker compose --profile metrics
up -d`` starts it, a plain ``up`` does not.
"""

from __future__ import annotations

from ops.defaults import GENERATED
from ops.yaml_emit import Yaml, to_yaml
from workers.config import Config
from workers.ops_metrics import BIND_ENV

PROMETHEUS_IMAGE = "prom/prometheus:v2.53.0"
PROMETHEUS_FILE = "prometheus.yml"
PROFILE = "metrics"
SCRAPE_INTERVAL = "15s"
VOLUME = "prometheus-data"
#: Where the compose file mounts the rendered scrape config.
CONTAINER_CONFIG = "/etc/prometheus/prometheus.yml"


def scrape_targets(config: Config) -> dict[str, list[str]]:
    """Job name -> ``service:port`` targets on the compose network (the bot's service is ``bot``)."""
    metrics = config.metrics
    targets: dict[str, list[str]] = {}
    if metrics.bot_port is not None:
        targets["benchbot-bot"] = [f"bot:{metrics.bot_port}"]
    workers = [f"worker-{name}:{port}" for name, port in metrics.worker_ports.items() if name in config.hosts]
    if workers:
        targets["benchbot-workers"] = workers
    return targets


def prometheus_document(config: Config) -> dict[str, Yaml]:
    """``prometheus.yml`` as data: one job for the bot, one for the workers."""
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": targets}]}
            for job, targets in scrape_targets(config).items()
        ],
    }


def prometheus_service(config: Config) -> dict[str, Yaml] | None:
    """The compose service (None without ``[metrics]``)."""
    if not config.metrics.enabled:
        return None
    return {
        "image": PROMETHEUS_IMAGE,
        "profiles": [PROFILE],
        "command": [f"--config.file={CONTAINER_CONFIG}", "--storage.tsdb.path=/prometheus"],
        "volumes": [f"./{PROMETHEUS_FILE}:{CONTAINER_CONFIG}:ro", f"{VOLUME}:/prometheus"],
        "ports": ["127.0.0.1:9090:9090"],
        "restart": "unless-stopped",
    }


SERVICE_COMMENT = (
    "Prometheus over the bot's and workers' /metrics (deploy/prometheus.yml, rendered from [metrics]).\n"
    "Optional: docker compose --profile metrics up -d. UI on this machine only: http://127.0.0.1:9090;\n"
    "import deploy/grafana-dashboard.json into Grafana with it as the data source."
)


def bind_env(config: Config, service: str) -> dict[str, str]:
    """The environment a compose service adds so its endpoint is reachable from the Prometheus container."""
    metrics = config.metrics
    serves = (service == "bot" and metrics.bot_port is not None) or (
        service.startswith("worker-") and service.removeprefix("worker-") in metrics.worker_ports
    )
    return {BIND_ENV: "0.0.0.0"} if serves else {}


def render_prometheus_yml(config: Config) -> str | None:
    """``prometheus.yml`` text (None without ``[metrics]``)."""
    if not config.metrics.enabled:
        return None
    header = (
        "Prometheus's scrape config for the compose file (service names as targets).\n"
        f"{GENERATED}\n"
        "With systemd instead, scrape the same ports on the machines that run the bot and the workers\n"
        "(they bind [metrics] bind, 127.0.0.1 by default: run Prometheus there or set bind)."
    )
    return to_yaml(prometheus_document(config), header)
