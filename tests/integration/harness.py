"""A benchbot host for integration tests: real Redis, real ``benchbot worker`` processes, the simulator.

Usage (sync test; the context manager guarantees cleanup even when the test fails)::

    def test_x(redis_url, tmp_path):
        with BenchbotHost(redis_url, tmp_path) as h:          # 2 workers, local transport
            reply = h.run("alice", "/launch cutlass cudnn")
            terminal, seen = h.wait(reply.job_id)
            assert terminal.type == "succeeded"

or the pytest fixture :func:`bb_host` (one host per test, local transport, default options).

What it builds:

* a config file in ``tmp_path`` with one host (``HOST``) whose engine is ``workers.sim.sglang`` on a
  free port; ``transport="local"``, or SSH to a ``tests/sshd.py`` server on 127.0.0.1 (pass ``ssh=``);
* ``workers`` real ``python -m bot.cli worker --host HOST`` subprocesses (named ``test-worker-N``, the
  name their jobs' ``started`` events carry), their stderr in ``tmp_path/worker-N.log``;
* a :class:`bot.dispatch.Dispatcher` on the same config and Redis (the one every front end uses).

The Redis is the one given (the session's ``redis_url`` fixture); it is flushed on entry, so tests
must not share it concurrently. On exit every worker is stopped (TERM, then KILL) and every
simulated engine on the host's port is killed, wherever it came from.

API: ``BenchbotHost(redis_url, work, *, workers=2, ssh=None, lease_ttl_s=3, launch_timeout_s=30,
sim_startup_s=0.2, cancel_grace_s=5, extra_toml="", env=None, sim_env=None, host_engine="", more_hosts=None)``
(``env``: more variables for the workers, e.g. ``workers.jobs.faults``' pause hook; ``host_engine``: the body
of ``[hosts.HOST.engine]``; ``more_hosts``: more simulated local hosts in the same config, name -> the body
of its ``[hosts.NAME.engine]`` or "", each with its own port in ``.ports`` and its own workers) with
``.run(user, line) -> Reply``,
``.wait(job_id, timeout=60) -> (terminal Event, all Events)``, ``.launch_ok(user, line)`` (run + wait +
assert succeeded), ``.start_worker()``, ``.kill_worker(proc)`` (SIGKILL worker + horse, engines stay),
``.engine_pids(host=HOST)``, ``.worker_logs()``, attributes ``port ports config config_path r dispatcher env
workers``;
``transport_server(kind, dir)`` for ``kind`` in ``TRANSPORTS``; ``first(events, type)``;
``engine_pids(port)`` / ``kill_engines(port)``; the ``bb_host`` fixture. A launch can be made to
start slowly with the sim's own flag: ``/launch cutlass cudnn --sim-startup-s 30``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis

from bot.dispatch import Dispatcher
from bot.replies import Reply
from tests.util import free_port, wait_until
from workers.config import SEED_PRESETS_TOML, Config, load_config
from workers.engines.registry import ENGINE_PACKAGES
from workers.jobs import events

HOST = "gpu-1"
CHANNEL = "C-bench"
SIM_MODULE = "workers.sim.sglang"
#: The simulator's engines, one personality per registered engine (``[hosts.X.engine] kind = "vllm"``).
SIM_MODULES = tuple(f"workers.sim.{kind}" for kind in ENGINE_PACKAGES)
#: The body of ``[hosts.NAME.engine]`` for a simulated vLLM host (``host_engine=`` / ``more_hosts=``).
VLLM_HOST_ENGINE = """kind = "vllm"
command = ["{python}", "-m", "workers.sim.vllm", "serve"]
flags = { "--tensor-parallel-size" = 8, "--quantization" = "modelopt_fp4" }
"""


def host_section(
    name: str,
    port: int,
    work: Path,
    *,
    ssh: Any = None,
    sim_startup_s: float = 0.2,
    sim_env: dict[str, str] | None = None,
    engine_toml: str = "",
    state_dir: Path | None = None,
    log_dir: Path | None = None,
) -> str:
    """One simulated host's ``[hosts.NAME]`` table, and its ``[hosts.NAME.engine]`` when ``engine_toml``
    (that table's body: the keys that replace ``[engine]``'s for this host) is given.

    The simulator's settings go in the host's ``env`` so they reach it over SSH too (sshd does not
    pass the worker's environment on); ``sim_env`` adds more (``BENCHBOT_SIM_SGLANG_VERSION``, ...).
    """
    settings = {
        "BENCHBOT_SIM_STARTUP_S": str(sim_startup_s),
        "BENCHBOT_SIM_STATE_DIR": str(state_dir or work / "sim"),
        **(sim_env or {}),
    }
    env = "env = { " + ", ".join(f'{k} = "{v}"' for k, v in settings.items()) + " }"
    if ssh is None:
        transport = 'transport = "local"'
    else:
        transport = (
            f'transport = "ssh"\nssh_target = "{ssh.host}"\nssh_port = {ssh.port}\n'
            f'ssh_user = "{ssh.username}"\nssh_key = "{ssh.client_key_path}"\n'
            f'ssh_known_hosts = "{ssh.known_hosts_path}"'
        )
    engine = f"\n[hosts.{name}.engine]\n{engine_toml}\n" if engine_toml else ""
    return f"""
[hosts.{name}]
{transport}
port = {port}
gpus = 8
nvidia_smi = ["{{python}}", "-m", "workers.sim.nvidia_smi"]
log_dir = "{log_dir or work / "logs"}"
{env}
description = "simulated 8 x RTX PRO 6000 Blackwell (SM120, PCIe)"
{engine}"""


def host_config_toml(
    port: int,
    work: Path,
    *,
    ssh: Any = None,
    lease_ttl_s: float = 3.0,
    launch_timeout_s: float = 30.0,
    sim_startup_s: float = 0.2,
    cancel_grace_s: float = 5.0,
    extra_toml: str = "",
    sim_env: dict[str, str] | None = None,
    host_engine: str = "",
    more_hosts: Mapping[str, tuple[int, str]] | None = None,
) -> str:
    """The benchbot.toml text: the seed's presets, one simulated host (``HOST``), short limits for tests.

    ``host_engine`` is the body of ``[hosts.HOST.engine]``; ``more_hosts`` adds simulated hosts, local,
    by name: (port, body of its ``[hosts.NAME.engine]``, "" for the default engine), each with its own
    simulator state and log directories.
    """
    hosts = host_section(
        HOST, port, work, ssh=ssh, sim_startup_s=sim_startup_s, sim_env=sim_env, engine_toml=host_engine
    )
    for name, (other_port, engine_toml) in (more_hosts or {}).items():
        hosts += host_section(
            name,
            other_port,
            work,
            sim_startup_s=sim_startup_s,
            engine_toml=engine_toml,
            state_dir=work / f"sim-{name}",
            log_dir=work / f"logs-{name}",
        )
    return f"""
default_host = "{HOST}"

[engine]
kind = "sglang"
command = ["{{python}}", "-m", "{SIM_MODULE}"]
model = "nvidia/Qwen3.5-397B-A17B-NVFP4"
flags = {{ "--tp-size" = 8, "--quantization" = "modelopt_fp4", "--disable-custom-all-reduce" = true }}
launch_timeout_s = {launch_timeout_s}
{hosts}
{SEED_PRESETS_TOML}
[limits]
lease_ttl_s = {lease_ttl_s}
cancel_grace_s = {cancel_grace_s}
# Tests read /status's fresh answer: give it as long as the old blocking ask had (production: 0.6 s).
status_deadline_s = 10
{extra_toml}
"""


#: Where :func:`sim_console_script` writes SGLang's console script stand-in; :func:`engine_pids` knows it so.
SIM_CONSOLE_DIR = "sim-venv"


def sim_console_script(work: Path) -> Path:
    """``work/sim-venv/bin/sglang``: SGLang's console script as pip writes it (``#!<python>``), running the
    simulator (``sglang serve ...``, ``sglang version``). Run, the kernel shows it as ``<python>
    .../bin/sglang serve ...``: a host whose command is this is a real ``sglang serve`` host to benchbot."""
    script = work / SIM_CONSOLE_DIR / "bin" / "sglang"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom workers.sim.sglang import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return script


def serve_host_engine(work: Path) -> str:
    """The body of ``[hosts.HOST.engine]`` for a host that runs ``sglang serve`` (``host_engine=``)."""
    return f'command = ["{sim_console_script(work)}", "serve"]\n'


# ------------------------------------------------------------------ engine processes on the port


def engine_pids(port: int) -> list[int]:
    """Pids of simulated engines (``python -m workers.sim.sglang|vllm ... --port PORT``, ``python
    .../sim-venv/bin/sglang serve ... --port PORT``: :func:`sim_console_script`, or ``python
    .../bin/benchbot sim K ... --port PORT``) from /proc, however
    they were started; the launcher or shell that started one carries the same words but is not counted,
    and neither is a child the engine is starting (between its fork and its exec a child still shows its
    parent's command line, as SGLang's own scheduler processes do while they are spawned)."""
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        module = len(argv) >= 3 and argv[1] == "-m" and argv[2] in SIM_MODULES
        script = len(argv) >= 3 and argv[1].endswith(f"/{SIM_CONSOLE_DIR}/bin/sglang") and argv[2] == "serve"
        documented = len(argv) >= 3 and argv[1].endswith("/bin/benchbot") and argv[2] == "sim"  # benchbot sim K
        if not (module or script or documented):
            continue  # a launcher or shell that merely carries the engine's argv is not the engine
        ports = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--port"}
        ports |= {a.split("=", 1)[1] for a in argv if a.startswith("--port=")}
        if str(port) in ports and _alive_not_zombie(int(entry)):
            found[int(entry)] = _ppid(int(entry))
    return [pid for pid, parent in found.items() if parent not in found]


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _alive_not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def worker_descendants(pid: int, *ports: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), except simulated engines on ``ports``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    engines = {engine for port in ports for engine in engine_pids(port)}
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        if child not in engines:
            found.append(child)
        todo.extend(children.get(child, []))
    return found


def kill_engines(port: int) -> None:
    """SIGKILL every simulated engine on ``port`` and wait until they are gone."""
    for pid in engine_pids(port):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not engine_pids(port), timeout=10, what=f"engines on port {port} to die")


# ------------------------------------------------------------------ the host


class BenchbotHost:
    """One simulated GPU host served by real workers; see the module docstring.

    Attributes: ``port`` (engine port), ``config`` (loaded Config), ``config_path``, ``r`` (Redis
    client), ``dispatcher``, ``env`` (what the workers run with), ``workers`` (Popen list).
    """

    def __init__(
        self,
        redis_url: str,
        work: Path,
        *,
        workers: int = 2,
        ssh: Any = None,
        lease_ttl_s: float = 3.0,
        launch_timeout_s: float = 30.0,
        sim_startup_s: float = 0.2,
        cancel_grace_s: float = 5.0,
        extra_toml: str = "",
        env: dict[str, str] | None = None,
        sim_env: dict[str, str] | None = None,
        host_engine: str = "",
        more_hosts: Mapping[str, str] | None = None,
        config_toml: Callable[[Mapping[str, int]], str] | None = None,
        host_ports: Mapping[str, int] | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.work = Path(work)
        self.n_workers = workers
        #: every host's engine port: ``HOST`` first, then ``more_hosts`` (each gets ``workers`` workers too)
        self.ports = dict(host_ports or {HOST: free_port(), **{name: free_port() for name in more_hosts or {}}})
        self.port = next(iter(self.ports.values()))
        self.config_path = self.work / "benchbot.toml"
        self.config_path.write_text(
            config_toml(self.ports)
            if config_toml is not None
            else host_config_toml(
                self.port,
                self.work,
                ssh=ssh,
                lease_ttl_s=lease_ttl_s,
                launch_timeout_s=launch_timeout_s,
                sim_startup_s=sim_startup_s,
                cancel_grace_s=cancel_grace_s,
                extra_toml=extra_toml,
                sim_env=sim_env,
                host_engine=host_engine,
                more_hosts={name: (self.ports[name], body) for name, body in (more_hosts or {}).items()},
            )
        )
        self.config: Config = load_config(str(self.config_path))
        self.env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "BENCHBOT_CONFIG": str(self.config_path),
            "BENCHBOT_STATE_DIR": str(self.work / "state"),
            "BENCHBOT_SIM_STARTUP_S": str(sim_startup_s),
            "BENCHBOT_SIM_STATE_DIR": str(self.work / "sim"),
            **(env or {}),
        }
        self.r = redis.Redis.from_url(redis_url)
        self.dispatcher = Dispatcher(self.config, self.r, plots_dir=self.work / "plots")
        self.workers: list[subprocess.Popen[bytes]] = []

    # -- lifecycle
    def __enter__(self) -> BenchbotHost:
        self.r.flushdb()
        try:
            for host in self.ports:
                for _ in range(self.n_workers):
                    self.start_worker(host)
            for host in self.ports:
                wait_until(
                    lambda host=host: self.r.exists(f"benchbot:observer:{host}:alive"),
                    timeout=30,
                    what=f"a worker's observer for {host} to come up",
                )
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start_worker(self, host: str = HOST) -> subprocess.Popen[bytes]:
        """Start one more ``benchbot worker --host HOST`` (stderr in ``work/worker-N.log``)."""
        index = len(self.workers) + 1
        with open(self.work / f"worker-{index}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bot.cli", "worker", "--host", host, "--name", f"test-worker-{index}"],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        self.workers.append(proc)
        return proc

    def kill_worker(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        """Signal a worker and its job process (RQ's horse, in a process group of its own), as a crash
        of the box's worker or the OOM killer would; engines it started are left where they are."""
        victims = [proc.pid, *worker_descendants(proc.pid, *self.ports.values())]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        proc.wait(timeout=10)

    def close(self) -> None:
        """Stop every worker (TERM, then KILL) and every engine on the port; idempotent."""
        # RQ's horse runs in a process group of its own: find every job process before the parents go,
        # since a worker that is TERMed mid-job would otherwise wait for its horse (or leave it running).
        horses = [
            pid
            for proc in self.workers
            if proc.poll() is None
            for pid in worker_descendants(proc.pid, *self.ports.values())
        ]
        for pid in horses:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.workers:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.workers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        for port in self.ports.values():
            kill_engines(port)
        self.r.close()

    # -- talking to benchbot
    def run(self, user: str, line: str, channel: str = CHANNEL) -> Reply:
        """One command line through the dispatcher, as Slack/console would send it."""
        return self.dispatcher.handle(user, channel, line)

    def wait(self, job_id: str, timeout: float = 60.0) -> tuple[events.Event, list[events.Event]]:
        """Follow a job to its terminal event: (terminal event, every event of the job, oldest first)."""
        seen = list(events.follow(self.r, job_id, timeout_s=timeout, block_ms=200))
        if not seen or not seen[-1].terminal:
            raise AssertionError(
                f"job {job_id} did not end within {timeout}s; events: "
                f"{[(e.type, e.data.get('message')) for e in seen]}\n{self.worker_logs()}"
            )
        return seen[-1], seen

    def launch_ok(self, user: str, line: str, timeout: float = 60.0) -> tuple[events.Event, list[events.Event]]:
        """Run a job command and assert it succeeded; returns what :meth:`wait` returns."""
        reply = self.run(user, line)
        assert reply.ok and reply.job_id, reply.text
        terminal, seen = self.wait(reply.job_id, timeout)
        assert terminal.type == "succeeded", (terminal.data, self.worker_logs())
        return terminal, seen

    # -- looking at the host
    def engine_pids(self, host: str = HOST) -> list[int]:
        """Live simulated engines on ``host``'s port."""
        return engine_pids(self.ports[host])

    def worker_logs(self, tail: int = 3000) -> str:
        """The end of every worker's stderr, for failure messages."""
        out = []
        for path in sorted(self.work.glob("worker-*.log")):
            out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)


TRANSPORTS = ("local", "asyncssh", "openssh")


@contextlib.contextmanager
def transport_server(kind: str, directory: Path) -> Iterator[Any]:
    """What ``BenchbotHost(ssh=...)`` takes for ``kind`` in :data:`TRANSPORTS`: None for ``local``, else a
    running ``tests/sshd.py`` server on 127.0.0.1 (the test is skipped when OpenSSH cannot run here)."""
    if kind == "local":
        yield None
        return
    from tests import sshd

    directory.mkdir(parents=True, exist_ok=True)
    if kind == "openssh":
        reason = sshd.openssh_unavailable_reason()
        if reason:
            pytest.skip(reason)
        with sshd.openssh_server(directory) as server:
            yield server
    elif kind == "asyncssh":
        with sshd.asyncssh_server(directory) as server:
            yield server
    else:
        raise ValueError(f"unknown transport {kind!r} (one of {TRANSPORTS})")


@pytest.fixture
def bb_host(redis_url: str, tmp_path: Path) -> Iterator[BenchbotHost]:
    """A local simulated host with two workers (lease TTL 3 s, sim start-up 0.2 s)."""
    with BenchbotHost(redis_url, tmp_path) as host:
        yield host


def first(seen: list[events.Event], type_: str) -> events.Event:
    """The first event of ``type_`` in a job's history (AssertionError naming what was there instead)."""
    for event in seen:
        if event.type == type_:
            return event
    raise AssertionError(f"no {type_} event in {[(e.type, e.data.get('message')) for e in seen]}")
