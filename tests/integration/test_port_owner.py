"""Who owns the engine port, through real workers: a loading engine owns it; a stranger is never signalled.

Real SGLang does not listen while it loads its weights; an engine bound for the port is nevertheless its
owner (issue 11). A process on the port that benchbot cannot identify as an engine is never stopped,
only named (issue 12). Each test puts a real process on the host's port and drives benchbot the way a
person does, then checks from /proc what happened to the process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import BenchbotHost, serve_host_engine
from tests.test_process_table import start_loading_module, start_loading_serve
from tests.util import wait_until
from workers.host.local import LocalTransport
from workers.host.process_table import scan

pytestmark = pytest.mark.slow


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


@pytest.fixture
def host(redis_url: str, tmp_path: Path) -> Iterator[BenchbotHost]:
    with BenchbotHost(redis_url, tmp_path, workers=1) as h:
        yield h


def start_loading_engine(port: int, shape: str = "launch_server", work: Path | None = None) -> subprocess.Popen[str]:
    """An unmanaged engine that is loading (no listener), bound for ``port``: ``python -m
    sglang.launch_server --port PORT``, or (``shape="sglang_serve"``) the console script ``sglang serve m
    --port PORT`` that the kernel shows as ``python .../bin/sglang serve ...``."""
    if shape == "sglang_serve":
        assert work is not None
        proc = start_loading_serve(work / "loading-venv" / "bin", port)
    else:
        assert work is not None
        proc = start_loading_module(work / "fake-sglang", port)
    assert proc.stdout is not None
    proc.stdout.readline()  # its child is up
    return proc


def engines_bound_for(port: int) -> list[int]:
    """Every engine the host's process table holds for ``port``, whatever its entry point."""
    return [e.pid for e in asyncio.run(scan(LocalTransport())).engines_on(port)]


#: An admin for the `/stop HOST force` cases (alice and bob are members: no access list means everyone may).
ADMIN_TOML = '[access]\nadmins = ["root"]\n'

#: The two ways SGLang is started: the host's configured command and the unmanaged loading engine alike.
SHAPES = ("launch_server", "sglang_serve")


@pytest.mark.parametrize("shape", SHAPES)
def test_a_loading_engine_owns_the_port_for_status_launch_bench_and_stop(
    redis_url: str, tmp_path: Path, shape: str
) -> None:
    engine_toml = serve_host_engine(tmp_path) if shape == "sglang_serve" else ""
    with BenchbotHost(redis_url, tmp_path, workers=1, host_engine=engine_toml, extra_toml=ADMIN_TOML) as host:
        _loading_engine_owns_the_port(host, start_loading_engine(host.port, shape, tmp_path))


def _loading_engine_owns_the_port(host: BenchbotHost, engine: subprocess.Popen[str]) -> None:
    try:
        status = host.run("alice", "/status")
        assert "LOADING" in status.text and f"pid {engine.pid}" in status.text, status.text
        assert status.data["hosts"][0]["fresh"]["state"] == "loading"

        launch = host.run("alice", "/launch cutlass cudnn")
        terminal, _ = host.wait(launch.job_id)
        assert terminal.type == "failed" and "is loading" in terminal.data["message"], terminal.data
        assert f"pid {engine.pid}" in terminal.data["message"]
        assert host.engine_pids() == [] and alive(engine.pid)  # no second engine, the first untouched
        assert engines_bound_for(host.port) == [engine.pid]

        bench = host.run("alice", "/bench 1 any")
        terminal, _ = host.wait(bench.job_id)
        assert terminal.type == "failed" and "still loading" in terminal.data["message"], terminal.data

        # issue 39 round 4, item 2: benchbot did not start it and it does not answer SGLang's API (it does not
        # listen at all): a member's /stop names it and touches nothing; only an admin's `force` stops it
        stop = host.run("alice", "/stop")
        terminal, seen = host.wait(stop.job_id)
        assert terminal.type == "failed", terminal.data
        message = terminal.data["message"]
        assert f"pid {engine.pid}" in message and "does not answer SGLang's API" in message, message
        assert f"/stop {host.config.default_host} force" in message and alive(engine.pid)
        assert not any(e.data.get("phase") == "stop" for e in seen)
        denied = host.run("alice", "/stop force")
        assert not denied.ok and "only an admin" in denied.text and alive(engine.pid)
        stop = host.run("root", "/stop force")
        terminal, _ = host.wait(stop.job_id)
        assert terminal.type == "succeeded", terminal.data
        wait_until(lambda: not alive(engine.pid), timeout=20, what="the loading engine to be stopped")
    finally:
        if engine.poll() is None:
            os.killpg(engine.pid, signal.SIGKILL)
        engine.wait()


def test_a_sglang_serve_host_launches_is_probed_observed_and_stopped_like_a_launch_server_host(
    redis_url: str, tmp_path: Path
) -> None:
    """Issue 21 item 4: a host whose command is `sglang serve` (the console script, as pip installs it)."""
    from tests.integration.harness import first
    from workers.jobs import events

    sim_env = {"BENCHBOT_SIM_SGLANG_VERSION": "0.5.23"}
    with BenchbotHost(redis_url, tmp_path, workers=1, host_engine=serve_host_engine(tmp_path), sim_env=sim_env) as h:
        terminal, seen = h.launch_ok("alice", "/launch cutlass cudnn")
        ready = first(seen, events.READY).data
        assert ready["engine"] == {"version": "0.5.23", "checked_against": "recorded"}  # probed: `sglang version`
        config = ready["config"]
        assert config["engine_kind"] == "sglang" and config["managed"] is True
        pid = config["process"]["pid"]
        assert config["process"]["argv"][1:3] == [str(tmp_path / "sim-venv/bin/sglang"), "serve"]
        assert h.engine_pids() == [pid] and engines_bound_for(h.port) == [pid]
        status = h.run("bob", "/status")
        assert status.data["hosts"][0]["fresh"]["state"] == "running" and "engine: sglang 0.5.23" in status.text

        _, seen = h.launch_ok("alice", "/launch cutlass cudnn")  # replaces its own engine
        assert any(e.data.get("phase") == "stop" and f"pid {pid}" in e.data.get("message", "") for e in seen)
        assert not alive(pid)
        stop = h.run("alice", "/stop")
        terminal, _ = h.wait(stop.job_id)
        assert terminal.type == "succeeded", terminal.data
        wait_until(lambda: h.engine_pids() == [], timeout=20, what="the sglang serve engine to be stopped")


def test_a_process_that_is_not_an_engine_is_named_and_never_signalled(host: BenchbotHost) -> None:
    stranger = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(host.port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(
            lambda: "not an engine" in host.run("bob", "/status").text,
            timeout=20,
            what="/status to name the stranger on the port",
        )
        for line in ("/launch cutlass cudnn", "/stop"):
            reply = host.run("alice", line)
            terminal, seen = host.wait(reply.job_id)
            assert terminal.type == "failed", (line, terminal.data)
            message = terminal.data["message"]
            assert f"pid {stranger.pid}" in message and "not an engine" in message and "http.server" in message
            assert not any(e.data.get("phase") == "stop" for e in seen), line  # never even tried
        assert stranger.poll() is None  # still serving: nobody signalled it
        assert host.engine_pids() == []
    finally:
        stranger.kill()
        stranger.wait()


def test_a_stopped_engine_is_not_answering_in_status_not_its_last_healthy_config(
    redis_url: str, tmp_path: Path
) -> None:
    """Issue 25 item 7: a SIGSTOPped engine accepts connections and never answers; the observer waited past
    the bot's patience, so /status said "no worker answered now" and showed the last healthy config."""
    from tests.integration.harness import first
    from workers.jobs import events

    with BenchbotHost(redis_url, tmp_path, workers=1) as h:
        _, seen = h.launch_ok("alice", "/launch cutlass cudnn")
        ready = first(seen, events.READY).data["config"]
        healthy = h.run("alice", "/status")
        assert f"config: {ready['summary']}" in healthy.text, healthy.text
        pgid = ready["process"]["pid"]
        os.killpg(pgid, signal.SIGSTOP)
        try:
            reply = h.run("alice", "/status")
        finally:
            os.killpg(pgid, signal.SIGCONT)
        fresh = reply.data["hosts"][0]["fresh"]
        assert fresh is not None and fresh["state"] == "unresponsive", reply.text
        assert "NOT ANSWERING: pid" in reply.text and "it may be stopped, hung or overloaded" in reply.text
        assert f"config: {ready['summary']}" not in reply.text, reply.text


#: A program that is *not* SGLang yet serves SGLang's whole API: the simulator run from `python3 -c CODE`,
#: whose own argv then carries `-m sglang.launch_server --port P` as mere words (issue 39 round 4, item 1).
IMPOSTOR = (
    "import runpy, sys\n"
    "sys.argv = ['sim', '--model-path', 'm', '--port', sys.argv[-1]]\n"
    "runpy.run_module('workers.sim.sglang', run_name='__main__')\n"
)

#: A sleeper with the right module name: `python -m sglang.launch_server --port P` that serves plain files.
SLEEPER = (
    "import sys, http.server\n"
    "http.server.test(http.server.SimpleHTTPRequestHandler, port=int(sys.argv[-1]), bind='127.0.0.1')\n"
)


def test_an_unmanaged_process_is_stopped_only_when_shown_to_be_the_engine(redis_url: str, tmp_path: Path) -> None:
    """Round 4, items 1 and 2, against real processes on the port: an impostor whose argv only *contains*
    SGLang's entry point (it runs `-c CODE`) answers SGLang's API perfectly and is still not an engine; a
    process whose argv is SGLang's (a fake `sglang.launch_server` module) but which does not answer SGLang's
    API is named, never signalled, by /stop and /launch, until an admin says `force`."""
    from tests.test_process_table import fake_module

    with BenchbotHost(redis_url, tmp_path, workers=1, extra_toml=ADMIN_TOML) as host:
        impostor = subprocess.Popen(
            [sys.executable, "-c", IMPOSTOR, "-m", "sglang.launch_server", "--port", str(host.port)],
            env=host.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_until(
                lambda: host.run("bob", "/status").data["hosts"][0]["fresh"]["state"] == "running",
                timeout=30,
                what="the impostor to answer SGLang's API",
            )
            for line in ("/stop", "/launch cutlass cudnn"):
                terminal, seen = host.wait(host.run("alice", line).job_id)
                assert terminal.type == "failed" and "not an engine" in terminal.data["message"], terminal.data
                assert f"pid {impostor.pid}" in terminal.data["message"]
                assert not any(e.data.get("phase") == "stop" for e in seen) and impostor.poll() is None
        finally:
            os.killpg(impostor.pid, signal.SIGKILL)
            impostor.wait()
        wait_until(lambda: engines_bound_for(host.port) == [], timeout=10, what="the impostor to be gone")

        sleeper = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", "--port", str(host.port)],
            env=fake_module(tmp_path / "fake-sglang", "sglang.launch_server", SLEEPER),
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_until(lambda: engines_bound_for(host.port) == [sleeper.pid], timeout=10, what="the sleeper")
            for line in ("/stop", "/launch cutlass cudnn"):
                terminal, seen = host.wait(host.run("alice", line).job_id)
                message = terminal.data["message"]
                assert terminal.type == "failed" and f"pid {sleeper.pid}" in message, terminal.data
                assert "does not answer SGLang's API" in message and "sglang.launch_server" in message
                assert not any(e.data.get("phase") == "stop" for e in seen) and sleeper.poll() is None
            terminal, _ = host.wait(host.run("root", "/stop force").job_id)
            assert terminal.type == "succeeded", terminal.data
            wait_until(lambda: sleeper.poll() is not None, timeout=20, what="the admin's force to stop it")
        finally:
            if sleeper.poll() is None:
                os.killpg(sleeper.pid, signal.SIGKILL)
            sleeper.wait()
