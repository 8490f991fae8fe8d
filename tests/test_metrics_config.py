"""``[metrics]``: off by default, ports checked at load with errors that name the key (docs/prometheus.md)."""

from __future__ import annotations

import pytest

from workers import ops_metrics
from workers.config import EMBEDDED_TOML, MetricsConfig, parse_config
from workers.errors import BenchbotError, ConfigError

HOSTS = '[hosts.a]\n[hosts.b]\nport = 30001\n[hosts.c]\ntransport = "ssh"\nssh_target = "c.lab"\n'


def test_no_section_opens_no_port_and_binds_loopback() -> None:
    for config in (parse_config(HOSTS), parse_config(EMBEDDED_TOML, "embedded")):
        assert config.metrics == MetricsConfig()
        assert not config.metrics.enabled and config.metrics.bind == "127.0.0.1"
        assert config.metrics.worker_port(["a"]) is None


def test_ports_of_the_bot_and_of_each_workers_first_named_host() -> None:
    config = parse_config(
        HOSTS + '[metrics]\nbind = "0.0.0.0"\nbot_port = 9464\nworker_ports = { b = 9466, a = 9465 }\n'
    )
    metrics = config.metrics
    assert metrics.enabled and metrics.bind == "0.0.0.0" and metrics.bot_port == 9464
    assert metrics.worker_port(["a"]) == 9465
    assert metrics.worker_port(["c", "b", "a"]) == 9466  # c has none: the first host that has one
    assert metrics.worker_port(["c"]) is None
    assert parse_config(HOSTS + "[metrics]\nworker_ports = { c = 9500 }\n").metrics.bot_port is None


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("bot_port = 0", r"metrics\.bot_port: 0 is out of range 1\.\.65535"),
        ("bot_port = 70000", r"metrics\.bot_port: 70000 is out of range"),
        ('bot_port = "9464"', r"metrics\.bot_port: expected an integer"),
        ("bot_port = true", r"metrics\.bot_port: expected an integer"),
        ('bind = "gpu box"', r"metrics\.bind: 'gpu box' is not an IP address"),
        ('bind = "localhost"', r"metrics\.bind: 'localhost' is not an IP address"),
        ("bind = 1", r"metrics\.bind: expected a non-empty string"),
        ("worker_ports = { z = 9465 }", r"metrics\.worker_ports\.z: 'z' is not one of the hosts \(a, b, c\)"),
        ("worker_ports = { a = -1 }", r"metrics\.worker_ports\.a: -1 is out of range"),
        ("worker_ports = 9465", r"metrics\.worker_ports: expected a table"),
        (
            "bot_port = 9464\nworker_ports = { a = 9464 }",
            r"metrics\.worker_ports\.a: 9464 is also metrics\.bot_port: each metrics endpoint needs its own port",
        ),
        (
            "worker_ports = { a = 9465, b = 9465 }",
            r"metrics\.worker_ports\.b: 9465 is also metrics\.worker_ports\.a",
        ),
        ("port = 9464", r"metrics\.port: unknown key \(allowed: bind, bot_port, worker_ports\)"),
    ],
)
def test_bad_values_name_the_file_and_the_key(section: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=r"^bb\.toml: " + expected):
        parse_config(HOSTS + "[metrics]\n" + section + "\n", "bb.toml")


def test_metrics_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match=r"metrics: expected a table"):
        parse_config("metrics = 3\n" + HOSTS)


def test_a_container_may_widen_the_bind_but_only_to_an_address(monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_config(HOSTS + "[metrics]\nbot_port = 9464\n")
    assert ops_metrics.metrics_bind(config) == "127.0.0.1"
    monkeypatch.setenv(ops_metrics.BIND_ENV, "0.0.0.0")
    assert ops_metrics.metrics_bind(config) == "0.0.0.0"
    monkeypatch.setenv(ops_metrics.BIND_ENV, "0.0.0.0; rm -rf /")
    with pytest.raises(BenchbotError, match=r"BENCHBOT_METRICS_BIND='0\.0\.0\.0; rm -rf /' is not an IP address"):
        ops_metrics.metrics_bind(config)
