"""A third engine needs its folder and one registry line, nothing else (issue 21): the toy engine proves it.

``tests/fixtures/engines/toy`` is an engine folder as ``CONTRIBUTING.md`` describes one (``ENGINE`` in its
``__init__``, a recogniser, a version probe, a driver, packaged presets), for ToyServe
(``tests/fixtures/engines/toyserve.py``), a tiny HTTP server that looks like neither SGLang nor vLLM: its own
default port, ``--version`` text, ready line, ``/toy/info`` and ``/toy/generate``, failure text. The only
other thing the tests add is the registry line, as ``BENCHBOT_ENGINES=toy=toy`` (the environment's form of a
line in ``workers.engines.registry.ENGINE_PACKAGES``, so real worker processes see it too). Then the toy is
recognised in a real process table, its launch compiles from a config naming ``kind = "toy"`` alone, its
readiness, smoke test, diagnosis and observation go through its driver, and a real worker launches, reports
and stops it. Generic code that still asked "is this SGLang?" would fail one of these.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.integration.harness import BenchbotHost
from tests.util import free_port, wait_until
from workers.config import DEFAULT_COMMANDS, ConfigError, parse_config
from workers.engines import registry
from workers.engines.contract import ENGINE_NAMES
from workers.engines.diagnosis import Diagnosis
from workers.engines.probe import parse_version_output, version_argv
from workers.engines.processes import engine_kind, engine_port
from workers.engines.readiness import ReadyResult
from workers.host.local import LocalTransport
from workers.host.process_table import scan
from workers.observation import ObservedState
from workers.observe_port import observe
from workers.presets import build_launch

ENGINES = Path(__file__).resolve().parent / "fixtures" / "engines"
TOYSERVE = ENGINES / "toyserve.py"
LINE = "toy=toy"


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The registry line, and the folder where Python finds it; yields the env a worker process needs."""
    monkeypatch.syspath_prepend(str(ENGINES))
    monkeypatch.setenv(registry.EXTRA_ENGINES_ENV, LINE)
    yield {registry.EXTRA_ENGINES_ENV: LINE, "PYTHONPATH": os.pathsep.join([str(ENGINES), os.getcwd()])}


def toyserve_pids(port: int) -> list[int]:
    """Live ToyServe servers bound for ``port`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if len(argv) > 1 and argv[1] == str(TOYSERVE) and str(port) in argv and state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


@contextlib.contextmanager
def toyserve(log: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """ToyServe started as a worker would start it, its output in ``log``."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(TOYSERVE), *args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def toy_config(port: int, work: Path, extra: str = "") -> str:
    """A config whose one host runs the toy engine: its kind and model only (command and presets are the
    folder's)."""
    return f"""
default_host = "toy-1"

[engine]
kind = "toy"
model = "toy/model-1"
launch_timeout_s = 30

[hosts.toy-1]
transport = "local"
port = {port}
gpus = 8
nvidia_smi = ["{{python}}", "-m", "workers.sim.nvidia_smi"]
log_dir = "{work / "logs"}"
env = {{ BENCHBOT_SIM_STATE_DIR = "{work / "sim"}" }}

[limits]
lease_ttl_s = 3
status_deadline_s = 10
{extra}
"""


# ------------------------------------------------------------------ the registry line is all it takes


def test_the_toy_engine_exists_only_through_its_registry_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ENGINES))
    monkeypatch.delenv(registry.EXTRA_ENGINES_ENV, raising=False)
    assert "toy" not in registry.kinds()
    with pytest.raises(ConfigError, match="'toy' is not supported"):
        registry.engine("toy")
    monkeypatch.setenv(registry.EXTRA_ENGINES_ENV, LINE)
    assert registry.kinds()[-1] == "toy"
    assert registry.engine("toy-sim").name == "ToyServe"
    assert ENGINE_NAMES["toy"] == "ToyServe" and registry.display_name("toy") == "ToyServe"
    assert DEFAULT_COMMANDS["toy"] == (sys.executable, str(TOYSERVE))
    assert registry.DEFAULT_PORTS["toy"] == 7010
    assert "toyserve" in registry.process_needles()
    assert registry.driver_for("toy").kind == "toy"


@pytest.mark.parametrize("line", ["toy", "Toy=toy", "toy=toy,=x"])
def test_a_malformed_registry_line_is_one_clear_sentence_not_a_traceback(line: str) -> None:
    """A fresh process: the CLI's imports and its parser both ask the registry, before any config is read."""
    argv = [sys.executable, "-m", "bot.cli", "config", "check"]
    done = subprocess.run(argv, env={**os.environ, registry.EXTRA_ENGINES_ENV: line}, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("benchbot: BENCHBOT_ENGINES: "), done.stderr
    assert "is not kind=package" in done.stderr and "Traceback" not in done.stderr


def test_a_plugin_that_raises_on_import_is_refused_in_one_sentence_naming_it(tmp_path: Path) -> None:
    """Issue 39 round 4, item 7: a plug-in raising anything but ImportError crashed `benchbot worker`."""
    package = tmp_path / "broken_engine"
    package.mkdir()
    (package / "__init__.py").write_text('raise RuntimeError("boom at import")\n')
    env = {**os.environ, registry.EXTRA_ENGINES_ENV: "broken=broken_engine", "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "bot.cli", "worker"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("benchbot: ")]  # (asyncssh may warn too)
    assert "Traceback" not in done.stderr and len(said) == 1, done.stderr
    assert "plug-in package broken_engine failed while it was imported (RuntimeError: boom at import)" in said[0]


def test_a_registry_line_naming_a_missing_package_says_so_and_hides_no_other_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(registry.EXTRA_ENGINES_ENV, "toy=no_such_engine_package")
    with pytest.raises(ConfigError, match="engine kind 'toy': its package no_such_engine_package cannot be imported"):
        registry.engine("toy")
    monkeypatch.setenv(registry.EXTRA_ENGINES_ENV, "not a line")
    assert registry.engine("vllm").kind == "vllm"  # this repository's engines need no word of the environment


def test_toyserve_processes_are_recognised_by_the_toy_folder(toy: Mapping[str, str]) -> None:
    server = [sys.executable, str(TOYSERVE), "m", "--port", "7123"]
    assert engine_kind(server) == "toy"
    assert engine_port(server, "toy") == 7123
    assert engine_port(server[:3], "toy") == 7010  # the folder's default port, not SGLang's 30000
    assert engine_kind([sys.executable, str(TOYSERVE), "--version"]) is None  # a version probe, not a server
    assert engine_kind(["vim", str(TOYSERVE)]) is None
    assert engine_kind(["python3", "-m", "workers.sim.toy", "--port", "1"]) == "toy-sim"  # the sim convention
    assert version_argv([sys.executable, str(TOYSERVE)]) == [sys.executable, str(TOYSERVE), "--version"]
    out = subprocess.run(version_argv([sys.executable, str(TOYSERVE)]) or [], capture_output=True, text=True)
    assert parse_version_output(out.stdout) == "1.2.3"


def test_a_loading_toyserve_owns_its_port_in_the_process_table(toy: Mapping[str, str], tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "toy.log"
    with toyserve(log, "toy/model-1", "--port", str(port), "--load-s", "60") as proc:
        wait_until(lambda: "loading" in log.read_text(), what="ToyServe to start loading")
        table = asyncio.run(scan(LocalTransport()))
        bound = table.engines_on(port)
        assert [(e.pid, e.kind) for e in bound] == [(proc.pid, "toy")]
        seen = asyncio.run(
            observe(LocalTransport(), host_name="t", port=port, nvidia_smi=(), driver=registry.driver_for("toy"))
        )
        assert seen.state == ObservedState.LOADING and seen.engine_kind == "toy"
        assert seen.launch_args == {"--port": str(port), "--load-s": "60", "--model": "toy/model-1"}


# ------------------------------------------------------------------ config and launch


def test_a_toy_host_compiles_its_launch_from_the_folder(toy: Mapping[str, str], tmp_path: Path) -> None:
    config = parse_config(toy_config(31999, tmp_path))
    host = config.host("toy-1")
    assert host.engine.kind == "toy" and host.engine.command == (sys.executable, str(TOYSERVE))
    assert sorted(config.presets_for(host.engine.preset_set)) == ["broken", "fast", "slow"]
    spec = build_launch(config, host, ["fast"])
    assert spec.argv == (
        sys.executable,
        str(TOYSERVE),
        "toy/model-1",  # the driver's positional
        "--host",
        "127.0.0.1",
        "--port",
        "31999",
        "--speed",
        "fast",
    )
    own = parse_config(toy_config(31999, tmp_path, '[engines.toy.presets.turbo]\nflags = { "--speed" = "turbo" }'))
    assert list(own.presets_for("toy")) == ["turbo"]  # a config's table replaces the packaged one
    with pytest.raises(ConfigError, match="not a device toy runs on"):
        parse_config(toy_config(31999, tmp_path).replace('kind = "toy"', 'kind = "toy"\ndevice = "cpu"'))


# ------------------------------------------------------------------ readiness, diagnosis, observation


async def _wait(port: int, proc: subprocess.Popen[bytes], log: Path) -> ReadyResult | Diagnosis:
    """The toy driver's readiness wait on a started ToyServe, its log read as a worker reads it."""
    offset = 0

    async def alive() -> bool:
        return proc.poll() is None

    async def read() -> str:
        nonlocal offset
        data = log.read_bytes()[offset:]
        offset += len(data)
        return data.decode(errors="replace")

    return await registry.driver_for("toy").wait_ready(
        f"http://127.0.0.1:{port}",
        deadline_s=20,
        is_alive=alive,
        read_new_log=read,
        api_key=None,
        gate=None,
        foreign_listener=None,
        contract=None,
    )


def test_toy_readiness_smoke_and_observation_go_through_its_driver(toy: Mapping[str, str], tmp_path: Path) -> None:
    port = free_port()
    driver = registry.driver_for("toy")
    log = tmp_path / "toy.log"
    with toyserve(log, "toy/model-1", "--host", "127.0.0.1", "--port", str(port), "--speed", "fast") as proc:
        ready = asyncio.run(_wait(port, proc, log))
        assert isinstance(ready, ReadyResult) and ready.saw_ready_line, ready  # the toy's own ready line
        smoke = asyncio.run(driver.smoke_test(f"http://127.0.0.1:{port}", None))
        assert smoke.ok and "Paris" in smoke.text
        seen = asyncio.run(observe(LocalTransport(), host_name="t", port=port, nvidia_smi=(), driver=driver))
        assert seen.state == ObservedState.RUNNING and seen.engine_kind == "toy"
        assert seen.server is not None and seen.server.version == "1.2.3"
        assert seen.summary == "ToyServe at fast speed" and seen.fingerprint


def test_a_failed_toy_start_is_diagnosed_by_the_toy_rules(toy: Mapping[str, str], tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "toy.log"
    with toyserve(log, "toy/model-1", "--port", str(port), "--fail", "oom") as proc:
        found = asyncio.run(_wait(port, proc, log))
    assert isinstance(found, Diagnosis), found
    assert found.category == "oom" and found.summary.startswith("ToyServe ran out of toy memory")
    silent = registry.driver_for("toy").diagnose("toyserve: bye\n", exited=True, timed_out=False, contract=None)
    assert silent.category == "crashed" and silent.summary.startswith("ToyServe exited")


# ------------------------------------------------------------------ a real worker


@pytest.mark.slow
def test_a_real_worker_launches_observes_and_stops_a_toy_host(
    toy: Mapping[str, str], redis_url: str, tmp_path: Path
) -> None:
    with BenchbotHost(
        redis_url,
        tmp_path,
        workers=1,
        env=dict(toy),
        host_ports={"toy-1": free_port()},
        config_toml=lambda ports: toy_config(ports["toy-1"], tmp_path),
    ) as h:
        port = h.ports["toy-1"]
        try:
            _, seen = h.launch_ok("alice", "/launch fast")
            ready = next(e for e in seen if e.type == "ready").data
            assert ready["launch"]["argv"][:3] == [sys.executable, str(TOYSERVE), "toy/model-1"]
            assert ready["engine"] == {"version": "1.2.3", "checked_against": "none"} and ready["diff"] == [], ready
            config = ready["config"]
            assert config["state"] == "running" and config["engine_kind"] == "toy"
            assert config["summary"] == "ToyServe at fast speed"
            (pid,) = toyserve_pids(port)

            status = h.run("bob", "/status")
            assert status.ok, status.text
            assert "ToyServe at fast speed" in status.text and "engine: toy 1.2.3, model toy/model-1" in status.text

            stop = h.run("alice", "/stop")
            stopped, _ = h.wait(stop.job_id)
            assert stopped.type == "succeeded", stopped.data
            assert "stopped ToyServe at fast speed" in stopped.data["message"]
            wait_until(lambda: not toyserve_pids(port), timeout=10, what="ToyServe to be gone")

            failed = h.run("alice", "/launch broken")
            terminal, _ = h.wait(failed.job_id)
            assert terminal.type == "failed", terminal.data
            assert "ToyServe ran out of toy memory" in str(terminal.data), terminal.data
            assert pid not in toyserve_pids(port) and not toyserve_pids(port)
        finally:
            for pid in toyserve_pids(port):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
