"""Prometheus beside benchbot: the rendered compose service and scrape config follow ``[metrics]``, and
the committed Grafana dashboard asks only for metrics the endpoints serve (and shows every one of them)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from bot.metrics import ACK_METRIC
from ops import deploy, prometheus
from tests.test_deploy import parse_yaml
from workers import ops_metrics
from workers.config import Config, MetricsConfig, load_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "deploy" / "benchbot.example.toml"
DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"


@pytest.fixture(scope="module")
def config() -> Config:
    return load_config(str(EXAMPLE))


def test_the_example_config_names_a_port_for_the_bot_and_every_worker(config: Config) -> None:
    assert config.metrics.bot_port is not None
    assert set(config.metrics.worker_ports) == set(config.hosts)


def test_compose_gets_an_optional_prometheus_on_loopback_and_reachable_endpoints(config: Config) -> None:
    services = parse_yaml(deploy.render_compose(config))["services"]
    prom = services["prometheus"]
    assert prom["profiles"] == ["metrics"]  # `docker compose up` alone does not start it
    assert prom["ports"] == ["127.0.0.1:9090:9090"]
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prom["volumes"]
    assert f"--config.file={prometheus.CONTAINER_CONFIG}" in prom["command"]
    assert "prometheus-data" in parse_yaml(deploy.render_compose(config))["volumes"]
    for name in ("bot", *(f"worker-{h}" for h in config.hosts)):
        assert services[name]["environment"][ops_metrics.BIND_ENV] == "0.0.0.0", name
    # No metrics port is published on the host: only the compose network (Prometheus) reaches them.
    assert services["bot"]["ports"] == ["3000:3000"]
    assert all("ports" not in services[f"worker-{h}"] for h in config.hosts)


def test_the_scrape_config_targets_every_configured_endpoint(config: Config) -> None:
    rendered = deploy.render_all(config)
    scrape = parse_yaml(rendered["prometheus.yml"])
    assert scrape["global"]["scrape_interval"] == "15s"
    jobs = {job["job_name"]: job["static_configs"][0]["targets"] for job in scrape["scrape_configs"]}
    assert jobs == {
        "benchbot-bot": [f"bot:{config.metrics.bot_port}"],
        "benchbot-workers": [f"worker-{h}:{p}" for h, p in config.metrics.worker_ports.items()],
    }
    services = parse_yaml(rendered["compose.yaml"])["services"]
    assert all(target.split(":")[0] in services for targets in jobs.values() for target in targets)


def test_only_the_workers_with_a_port_are_widened(config: Config) -> None:
    first = next(iter(config.hosts))
    one = replace(config, metrics=MetricsConfig(worker_ports={first: 9465}))
    services = parse_yaml(deploy.render_compose(one))["services"]
    assert ops_metrics.BIND_ENV in services[f"worker-{first}"]["environment"]
    assert ops_metrics.BIND_ENV not in services["bot"]["environment"]
    assert all(ops_metrics.BIND_ENV not in services[f"worker-{h}"]["environment"] for h in config.hosts if h != first)
    jobs = parse_yaml(prometheus.render_prometheus_yml(one) or "")["scrape_configs"]
    assert [job["job_name"] for job in jobs] == ["benchbot-workers"]


def test_without_metrics_nothing_is_rendered_for_prometheus(config: Config) -> None:
    off = replace(config, metrics=MetricsConfig())
    rendered = deploy.render_all(off)
    assert "prometheus.yml" not in rendered
    doc = parse_yaml(rendered["compose.yaml"])
    assert "prometheus" not in doc["services"] and "prometheus-data" not in doc["volumes"]
    assert all(ops_metrics.BIND_ENV not in s.get("environment", {}) for s in doc["services"].values())


# --------------------------------------------------------------------------- the Grafana dashboard

SERVED = {*ops_metrics.FLEET_METRICS, ACK_METRIC}
FUNCTIONS = {"max", "min", "sum", "by", "rate", "increase", "histogram_quantile", "label_values", "le"}


def _exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    exprs += [v["definition"] for v in board["templating"]["list"] if "definition" in v]
    return exprs


def _metric_names(expr: str) -> set[str]:
    """Identifiers that name a series (not label names inside {...} or by (...), not functions)."""
    expr = re.sub(r"label_values\(([a-z_]+), [a-z_]+\)", r"\1", expr)  # its second argument is a label
    without_labels = re.sub(r"\{[^}]*\}|\[[^]]*\]", "", expr)  # selectors and ranges ([1h])
    without_groupings = re.sub(r"\bby \([^)]*\)", "", without_labels)
    names = set(re.findall(r"[a-z_][a-z0-9_]*", without_groupings)) - FUNCTIONS
    return names


def _base(name: str) -> str:
    return re.sub(r"_(total|bucket|count|sum)$", "", name)


def test_the_dashboard_asks_only_for_served_metrics_and_shows_each_of_them() -> None:
    asked = {name for expr in _exprs() for name in _metric_names(expr)}
    assert asked, "no expressions found"
    unknown = {name for name in asked if _base(name) not in SERVED}
    assert not unknown, f"the dashboard asks for metrics nobody serves: {sorted(unknown)}"
    assert {_base(name) for name in asked} >= SERVED, (
        f"not on the dashboard: {sorted(SERVED - {_base(n) for n in asked})}"
    )


def test_the_dashboard_is_grafana_json_with_a_datasource_and_host_variable() -> None:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert board["uid"] and board["title"] == "benchbot" and board["schemaVersion"] >= 36
    names = [v["name"] for v in board["templating"]["list"]]
    assert names == ["datasource", "host"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])


def test_the_docs_list_every_metric_served() -> None:
    doc = (ROOT / "docs" / "prometheus.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(benchbot_[a-z_]+)` \|", doc, re.M))
    assert {_base(row) for row in rows} == SERVED
