"""Soak: many users, many hosts, real workers, a seeded fault schedule; then the history is checked.

N simulated hosts (SGLang and vLLM personalities, local transport), W real ``benchbot worker`` processes
(several per host), U users sending a seeded random mix of ``/launch``, ``/bench``, ``/eval``, ``/stop``,
``/cancel``, ``/sweep`` and ``/status`` through the real dispatcher (:class:`bot.dispatch.Dispatcher`), until
``--jobs`` jobs were accepted, while a seeded schedule injects ``--faults`` faults (its kinds:
:data:`FAULT_KINDS`). Then every job is waited for, and the history is written as JSONL and checked by
``bench/history_check.py``. The history is what the product and the simulated hosts wrote, never what
this script guesses: each job's own events (``workers/jobs/events.py``), each host's effect journal (every
fenced claim, spawn, signal and unlink, with the fence it carried: ``workers/jobs/effects.py``), the
simulated hosts' ledger (every engine started, signalled and exited, every request it got:
``workers/sim/ledger.py``), the stored runs, every reply text, each ``/status`` answer with the host's
truth (the live simulated engines) read just before and after it, and the faults with their times.

    .venv/bin/python bench/soak.py --jobs 100 --users 8 --hosts 3 --workers 5 --faults 10 --seed 1
    .venv/bin/python bench/soak.py --jobs 1000 --users 20 --hosts 8 --workers 12 --faults 50 --seed 1

Prints one JSON object: the seed, the fault schedule (each fault's kind, target and time), the figures
(jobs per minute, p99 queue wait, faults by kind, how long it took) and each property's result.
Exit status 1 when any property has a violation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.sentinel_set import SentinelSet
    from bench.slow_link import SlowLink

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import history_check  # noqa: E402
from bench.soak_proc import _stat, descendants, live_engines  # noqa: E402

#: What the schedule draws from: the local faults, a Sentinel failover (Redis is then a Sentinel set: a primary, a
#: replica, three sentinels) and a host's wall clock stepped (``bench/stepped_clock``).
FAULT_KINDS = (
    "worker_kill",
    "horse_kill",
    "worker_stop",
    "engine_kill",
    "engine_freeze",
    "redis_restart",
    "sentinel_failover",
    "clock_step",
)
#: Faults drawn only when asked for (``--kinds``): a slow network needs ``--ssh-hosts``.
MORE_KINDS = ("slow_network",)
TTL_S = 3.0
#: How long the sentinels wait before calling the primary down: longer than a ``redis_restart`` takes (its 0.2-2 s
#: down plus the AOF's load), so a restart stays a restart and only ``sentinel_failover`` fails over.
SENTINEL_DOWN_AFTER_MS = 4000
STEPPED_CLOCK_DIR = ROOT / "bench" / "stepped_clock"
CHANNEL = "C-soak"
BENCH = "1 in=32 out=8 n=4 warmup=0"
VLLM_ENGINE = """kind = "vllm"
command = ["{python}", "-m", "workers.sim.vllm", "serve"]
flags = { "--tensor-parallel-size" = 8, "--quantization" = "modelopt_fp4" }
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config_toml(work: Path, ports: dict[str, int], links: dict[str, SlowLink] | None = None) -> str:
    """The soak's benchbot.toml: the seed presets, one simulated local host per port (even ones SGLang,
    odd ones vLLM), each with its own state and log dirs, the simulator's ledger on, and a wall clock the
    ``clock_step`` fault can step (``bench/stepped_clock`` first on the host programs' ``PYTHONPATH``)."""
    from workers.config import SEED_PRESETS_TOML
    from workers.host.transport import FENCE_FILE_PREFIX

    hosts = ""
    for i, (name, port) in enumerate(ports.items()):
        logs = work / f"logs-{name}"
        env = {
            "BENCHBOT_SIM_STARTUP_S": "0.2",
            "BENCHBOT_SIM_STATE_DIR": str(work / f"sim-{name}"),
            "BENCHBOT_SIM_LEDGER": str(work / "ledger.jsonl"),
            "BENCHBOT_SIM_FENCE_FILE": f"{logs}/{FENCE_FILE_PREFIX}{port}",
            "BENCHBOT_SIM_CLOCK_FILE": str(clock_file(work, name)),
            "PYTHONPATH": f"{STEPPED_CLOCK_DIR}:{ROOT}",
        }
        transport = links[name].toml() if name in (links or {}) else 'transport = "local"\n'
        hosts += (
            f"\n[hosts.{name}]\n{transport}\nport = {port}\ngpus = 8\n"
            f'nvidia_smi = ["{{python}}", "-m", "workers.sim.nvidia_smi"]\nlog_dir = "{logs}"\n'
            "env = { " + ", ".join(f'{k} = "{v}"' for k, v in env.items()) + " }\n"
        )
        if i % 2:
            hosts += f"[hosts.{name}.engine]\n{VLLM_ENGINE}"
    return f"""
default_host = "{next(iter(ports))}"

[engine]
kind = "sglang"
command = ["{{python}}", "-m", "workers.sim.sglang"]
model = "nvidia/Qwen3.5-397B-A17B-NVFP4"
flags = {{ "--tp-size" = 8, "--quantization" = "modelopt_fp4", "--disable-custom-all-reduce" = true }}
launch_timeout_s = 30
{hosts}
{SEED_PRESETS_TOML}
[limits]
lease_ttl_s = {TTL_S}
cancel_grace_s = 2
max_queued_per_user = 10000
status_deadline_s = 2
"""


def clock_file(work: Path, host: str) -> Path:
    """Where host ``host``'s clock offset lives (seconds; what ``bench/stepped_clock`` adds to its wall clock)."""
    return work / f"clock-{host}"


def boot_to_wall() -> float:
    """This box's wall clock minus its boot clock: maps the actuator's ``window_boot`` onto the history's clock
    (every simulated host is this box, whose own clock the soak never steps)."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


class ClockWatch:
    """This box's :func:`boot_to_wall`, sampled while the soak runs; every change is kept, with when it came.

    The soak never steps this box's clock, but the box's VM can be paused and resumed (a snapshot) or NTP can
    step it: in the long soak of 2026-12-07 the offset moved 23.6 s mid-run (the kernel logged "crng reseeded
    due to virtual machine fork"), and the one offset the header held mapped the first 15 minutes of lock
    windows 23.6 s late: 452 false violations. The checker maps each window with the offset of its time."""

    PERIOD_S = 0.2
    #: A change smaller than this is the two clock reads' own jitter.
    NOISE_S = 0.005

    def __init__(self) -> None:
        boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        self.samples: list[tuple[float, float]] = [(boot, time.time() - boot)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="clock-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.PERIOD_S):
            boot = time.clock_gettime(time.CLOCK_BOOTTIME)
            offset = time.time() - boot
            if abs(offset - self.samples[-1][1]) > self.NOISE_S:
                self.samples.append((boot, offset))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def records(self) -> list[dict[str, object]]:
        """One ``clock`` record per offset the box had: from ``boot`` (its boot clock) on, wall = boot + offset."""
        return [{"src": "clock", "boot": boot, "boot_to_wall": offset} for boot, offset in self.samples]


# ---- the soak ------------------------------------------------------------------------------------------


@dataclass
class Soak:
    args: argparse.Namespace
    work: Path
    rng: random.Random
    ports: dict[str, int] = field(default_factory=dict)
    workers: dict[str, tuple[str, subprocess.Popen[bytes]]] = field(default_factory=dict)
    history: list[dict[str, object]] = field(default_factory=list)
    jobs: dict[str, tuple[str, str]] = field(default_factory=dict)  # job -> (user, host)
    faults: list[dict[str, object]] = field(default_factory=list)
    stopped: list[int] = field(default_factory=list)  # pids under SIGSTOP, for the cleanup
    starts: dict[str, int] = field(default_factory=dict)  # how often each worker was (re)started
    links: dict[str, SlowLink] = field(default_factory=dict)  # the SSH hosts' slow links
    lock: threading.Lock = field(default_factory=threading.Lock)
    clock: ClockWatch = field(default_factory=ClockWatch)

    def __post_init__(self) -> None:
        from bot.dispatch import Dispatcher
        from workers import redis_conn
        from workers.config import load_config

        self.redis_dir = self.work / "redis"
        self.sentinels: SentinelSet | None = None
        if "sentinel_failover" in self.args.kinds:
            from bench.sentinel_set import start_sentinel_set

            self.sentinels = start_sentinel_set(
                self.work / "sentinel-set", down_after_ms=SENTINEL_DOWN_AFTER_MS, persist=True
            )
            self.url = self.sentinels.url
        else:
            sock = redis_conn.start_redis_server(
                self.redis_dir, appendonly=True, extra_args=["--appendfsync", "always"]
            )
            self.url = f"unix://{sock}"
        self.ports = {f"soak-{i + 1}": _free_port() for i in range(self.args.hosts)}
        if self.args.ssh_hosts:
            from bench.slow_link import SlowLink

            for name in list(self.ports)[-self.args.ssh_hosts :]:
                self.links[name] = SlowLink(self.work / f"ssh-{name}").start()
        path = self.work / "benchbot.toml"
        path.write_text(config_toml(self.work, self.ports, self.links))
        self.config = load_config(str(path))
        self.env = {
            **os.environ,
            "REDIS_URL": self.url,
            "BENCHBOT_CONFIG": str(path),
            "BENCHBOT_STATE_DIR": str(self.work / "state"),
            "BENCHBOT_SIM_STATE_DIR": str(self.work / "sim"),
            "PYTHONPATH": str(ROOT),
        }
        for host in self.ports:
            clock_file(self.work, host).write_text("0\n")
        self.r = redis_conn.connect(self.url, socket_timeout=10)
        self.dispatcher = Dispatcher(self.config, self.r, plots_dir=self.work / "plots")

    # -- workers
    def start_worker(self, name: str, host: str) -> None:
        """Start (or restart) worker ``name``; RQ remembers a dead worker's name a while, so a restart is ``name.N``."""
        self.starts[name] = lives = self.starts.get(name, -1) + 1
        with open(self.work / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bot.cli", "worker", "--host", host, "--name", f"{name}.{lives}"],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
                cwd=ROOT,
            )
        self.workers[name] = (host, proc)

    def start_workers(self) -> None:
        from workers import keys

        hosts = list(self.ports)
        for k in range(max(self.args.workers, len(hosts))):
            self.start_worker(f"soak-w{k + 1}", hosts[k % len(hosts)])
        deadline = time.monotonic() + 60
        while not all(self.r.exists(keys.observer_alive(h)) for h in hosts):
            if time.monotonic() > deadline:
                raise RuntimeError("the workers' observers did not come up")
            time.sleep(0.1)

    # -- talking to benchbot
    def say(self, user: str, line: str) -> object:
        """One command through the dispatcher; its reply (or the error it raised) goes into the history."""
        began = time.time()
        try:
            reply = self.dispatcher.handle(user, CHANNEL, line)
        except Exception as exc:  # Redis restarting: the user saw an error, nothing was accepted
            self.history.append({"src": "reply", "ts": began, "user": user, "line": line, "error": repr(exc)})
            return None
        record = {
            "src": "reply",
            "ts": began,
            "user": user,
            "line": line,
            "ok": reply.ok,
            "kind": reply.kind,
            "text": reply.text,
            "job": reply.job_id,
        }
        self.history.append(record)
        return reply

    def status(self, user: str, host: str) -> None:
        before = live_engines(self.ports)[host]
        began = time.time()
        try:
            reply = self.dispatcher.handle(user, CHANNEL, f"/status {host}")
        except Exception as exc:
            self.history.append({"src": "reply", "ts": began, "user": user, "line": "/status", "error": repr(exc)})
            return
        after = live_engines(self.ports)[host]
        views = reply.data.get("hosts") if isinstance(reply.data, dict) else None
        view = views[0] if isinstance(views, list) and views else None
        seen = (view.get("fresh") or view.get("last")) if isinstance(view, dict) else None
        self.history.append(
            {
                "src": "status",
                "ts": began,
                "ended": time.time(),
                "host": host,
                "user": user,
                "text": reply.text,
                "view": view,
                # when the observation began looking: with the ledger's engine_start/exit, which engine it could see
                "observed_at": seen.get("observed_at") if isinstance(seen, dict) else None,
                "truth_before": before,
                "truth_after": after,
            }
        )

    def command(self, user: str) -> str | None:
        """A random command line for ``user`` (None: a /status, asked and recorded here)."""
        host = self.rng.choice(list(self.ports))
        roll = self.rng.random()
        if roll < 0.22:
            then = self.rng.choice(["", f" then bench {BENCH}"])
            return f"/launch cutlass cudnn on {host}{then}"
        if roll < 0.47:
            return f"/bench {BENCH} on {host}" + self.rng.choice(["", " any"])
        if roll < 0.57:
            return f"/eval n=4 on {host}" + self.rng.choice(["", " any"])
        if roll < 0.67:
            return f"/stop {host}"
        if roll < 0.72:
            return f"/sweep cutlass cudnn, cutlass fp4-cutlass bench {BENCH} on {host}"
        if roll < 0.85:
            mine = [j for j, (u, _) in self.jobs.items() if u == user] or list(self.jobs)
            return f"/cancel {self.rng.choice(mine[-5:])}" if mine else None
        self.status(user, host)
        return None

    def in_flight(self) -> int:
        from workers.jobs import events

        with contextlib.suppress(Exception):
            return sum(1 for j in list(self.jobs)[-60:] if not events.is_terminal(self.r, j))
        return 0

    def drive(self) -> None:
        users = [f"user{u:02d}" for u in range(self.args.users)]
        schedule = fault_schedule(self.rng, self.args.jobs, self.args.faults, self.args.kinds)
        self.schedule = schedule
        cap = max(4, 2 * len(self.ports))
        while len(self.jobs) < self.args.jobs:
            while schedule and schedule[0][0] <= len(self.jobs):
                self.inject(schedule.pop(0)[1])
            if self.in_flight() >= cap:
                time.sleep(0.2)
                continue
            user = self.rng.choice(users)
            line = self.command(user)
            if line is None:
                continue
            reply = self.say(user, line)
            job = getattr(reply, "job_id", None)
            if job:
                self.jobs[str(job)] = (user, line.rsplit(" on ", 1)[-1].split()[0] if " on " in line else "")

    # -- faults
    def inject(self, kind: str) -> None:
        t = time.time()
        target = getattr(self, f"_fault_{kind}")()
        more = target if isinstance(target, dict) else {"target": target}
        self.faults.append({"src": "fault", "kind": kind, "ts": t, **more})

    def _worker(self) -> tuple[str, str, subprocess.Popen[bytes]]:
        name = self.rng.choice(sorted(self.workers))
        host, proc = self.workers[name]
        return name, host, proc

    def _fault_worker_kill(self) -> str:
        name, host, proc = self._worker()
        engines = {pid for pids in live_engines(self.ports).values() for pid in pids}
        for pid in [proc.pid, *descendants(proc.pid)]:
            if pid not in engines:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=10)
        self.start_worker(name, host)
        return f"{name} ({host}) and its horse"

    def _horses(self, proc: subprocess.Popen[bytes]) -> list[int]:
        """The worker's job processes (RQ's horse), not its observer: a horse runs ``rq`` work in its own group."""
        return [p for p in descendants(proc.pid) if os.getpgid(p) != proc.pid] if proc.poll() is None else []

    def _fault_horse_kill(self) -> str:
        name, _, proc = self._worker()
        with contextlib.suppress(ProcessLookupError):
            horses = self._horses(proc)
            for pid in horses:
                os.kill(pid, signal.SIGKILL)
            return f"{name}'s horse {horses}" if horses else f"{name}: no job running"
        return f"{name}: gone"

    def _pause(self, pids: list[int], seconds: float) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                self.stopped.append(pid)

        def wake() -> None:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

        threading.Timer(seconds, wake).start()

    def _fault_worker_stop(self) -> str:
        name, host, proc = self._worker()
        seconds = round(self.rng.uniform(1.0, 2.5 * TTL_S), 2)
        self._pause([proc.pid, *descendants(proc.pid)], seconds)
        return f"{name} ({host}) and its horse, {seconds} s"

    def _engine(self) -> tuple[str, int] | None:
        live = [(h, p) for h, pids in live_engines(self.ports).items() for p in pids]
        return self.rng.choice(live) if live else None

    def _fault_engine_kill(self) -> str:
        found = self._engine()
        if found is None:
            return "no engine running"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(found[1], signal.SIGKILL)
        return f"engine {found[1]} on {found[0]}"

    def _fault_engine_freeze(self) -> str | dict[str, object]:
        found = self._engine()
        if found is None:
            return "no engine running"
        seconds = round(self.rng.uniform(1.0, 6.0), 2)
        self._pause([found[1], *descendants(found[1])], seconds)
        return {"target": f"engine {found[1]} on {found[0]}, {seconds} s", "pid": found[1], "seconds": seconds}

    def _fault_slow_network(self) -> str:
        if not self.links:
            return "no SSH host (--ssh-hosts)"
        name = self.rng.choice(sorted(self.links))
        link = self.links[name]
        delay, seconds = round(self.rng.uniform(0.05, 0.5), 2), round(self.rng.uniform(2.0, 8.0), 1)
        link.delay_s = delay

        def heal() -> None:
            link.delay_s = 0.0

        threading.Timer(seconds, heal).start()
        return f"SSH to {name} delayed {delay} s a chunk for {seconds} s"

    def _fault_clock_step(self) -> dict[str, object]:
        """Step one host's wall clock forward or back by 1-60 min; an NTP-like step puts it right 3-15 s later."""
        host = self.rng.choice(sorted(self.ports))
        step = round(self.rng.choice((-1, 1)) * self.rng.uniform(60.0, 3600.0), 1)
        seconds = round(self.rng.uniform(3.0, 15.0), 1)
        path = clock_file(self.work, host)
        path.write_text(f"{step}\n")
        threading.Timer(seconds, lambda: path.write_text("0\n")).start()
        return {"target": f"{host}'s wall clock stepped {step:+} s for {seconds} s", "host": host, "step_s": step,
                "seconds": seconds}  # fmt: skip

    def _fault_sentinel_failover(self) -> str:
        """SIGKILL the Sentinel set's primary; once the sentinels promote the replica, start the dead one again as
        the new primary's replica (so a later failover has one to promote)."""
        s = self.sentinels
        if s is None:
            return "no Sentinel set"
        primary = s.primary_now()
        if primary is None:
            return "the sentinels agree on no primary"
        other = s.replica_port if primary == s.primary_port else s.primary_port
        pid = s.kill_node(primary)
        killed = time.monotonic()
        try:
            from bench.polling import poll_until

            poll_until(lambda: s.primary_now() == other, timeout=60, interval=0.05, what="the promotion")
        except TimeoutError:
            s.restart_node(primary)
            return f"primary {primary} (pid {pid}) SIGKILLed; no promotion within 60 s: started again"
        promoted_s = round(time.monotonic() - killed, 2)
        s.restart_node(primary, replica_of=other)
        return (
            f"primary {primary} (pid {pid}) SIGKILLed, replica {other} promoted after {promoted_s} s, "
            f"{primary} back as its replica"
        )

    def _fault_redis_restart(self) -> str:
        from workers import redis_conn

        if self.sentinels is not None:  # the Sentinel set's primary, killed and started again from its AOF
            s = self.sentinels
            port = s.primary_now()
            if port is None:
                return "the sentinels agree on no primary"
            pid = s.kill_node(port)
            down = round(self.rng.uniform(0.2, 2.0), 2)
            time.sleep(down)
            s.restart_node(port)
            return f"primary {port} (pid {pid}) SIGKILLed, restarted from its AOF after {down} s"
        pid = int((self.redis_dir / "redis.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and _stat(pid)[0] not in ("Z", "X") and time.monotonic() < deadline:
            time.sleep(0.05)
        down = round(self.rng.uniform(0.2, 2.0), 2)
        time.sleep(down)
        redis_conn.start_redis_server(self.redis_dir, appendonly=True, extra_args=["--appendfsync", "always"])
        return f"redis pid {pid} SIGKILLed, restarted from its AOF after {down} s"

    # -- the end
    def wait_all(self, timeout_s: float) -> None:
        from workers import keys
        from workers.jobs import events

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                last = int(self.r.get(keys.JOB_SEQ) or 0)
                if all(events.is_terminal(self.r, str(j)) for j in range(1, last + 1)):
                    return
            time.sleep(0.5)

    def collect(self) -> list[dict[str, object]]:
        from workers import keys, observer
        from workers.jobs import effects, eta, events
        from workers.results import store

        out: list[dict[str, object]] = [
            {
                "src": "soak",
                "seed": self.args.seed,
                "hosts": self.ports,
                "ttl_s": TTL_S,
                "users": self.args.users,
                "redis": "sentinel" if self.sentinels is not None else "standalone",
                "boot_to_wall": self.clock.samples[0][1],
            }
        ]
        out += self.clock.records()
        last = int(self.r.get(keys.JOB_SEQ) or 0)
        for j in range(1, last + 1):
            for e in events.job_events(self.r, str(j)):
                out.append({"src": "event", "job": e.job, "type": str(e.type), "ts": e.ts, "data": e.data})
        for host in self.ports:
            out += [{"src": "effect", **e} for e in effects.host_effects(self.r, host)]
        ledger = self.work / "ledger.jsonl"
        by_port = {p: h for h, p in self.ports.items()}
        pid_port: dict[int, int] = {}
        if ledger.exists():
            for line in ledger.read_text().splitlines():
                fact = json.loads(line)
                if fact["ev"] == "engine_start":
                    pid_port[fact["pid"]] = fact["port"]
                out.append({"src": "sim", "host": by_port.get(pid_port.get(fact["pid"], -1)), **fact})
        out += [{"src": "run", **run.to_dict()} for run in store.list_runs(self.r, n=100_000)]
        out += self.history + self.faults
        out.append({"src": "durations", "mean_held_s": eta.mean_held_s(self.r), "ts": time.time()})
        live = live_engines(self.ports)
        for host in self.ports:
            record = observer.launched_record(self.r, host)
            out.append(
                {
                    "src": "final",
                    "host": host,
                    "engines": live[host],
                    "launched": record.to_dict() if record is not None else None,
                }
            )
        return out

    def close(self) -> None:
        from workers import redis_conn

        for pid in self.stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for _, proc in self.workers.values():
            for pid in [proc.pid, *descendants(proc.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for pids in live_engines(self.ports).values():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        self.clock.stop()
        self.r.close()
        if self.sentinels is not None:
            self.sentinels.stop()
        else:
            redis_conn.stop_redis_server(self.redis_dir)
        for link in self.links.values():
            link.stop()


def fault_schedule(rng: random.Random, jobs: int, faults: int, kinds: tuple[str, ...]) -> list[tuple[int, str]]:
    """``faults`` faults at seeded points of the run (after how many accepted jobs), kinds in turn from a
    shuffled cycle so every kind comes up once ``faults`` >= the number of kinds."""
    order = list(kinds)
    rng.shuffle(order)
    points = sorted(rng.randint(1, max(1, jobs - 1)) for _ in range(faults))
    return [(at, order[i % len(order)]) for i, at in enumerate(points)]


def figures(history: list[dict[str, object]], began: float, ended: float) -> dict[str, object]:
    """Jobs per minute, queue wait (queued -> started) p50/p99, faults by kind, how long it took."""
    queued: dict[str, float] = {}
    started: dict[str, float] = {}
    ends = 0
    for h in history:
        if h.get("src") != "event":
            continue
        job, ts = str(h["job"]), float(h["ts"])  # type: ignore[arg-type]
        if h["type"] == "queued":
            queued[job] = ts
        elif h["type"] == "started":
            started.setdefault(job, ts)
        elif h["type"] in ("succeeded", "failed", "cancelled"):
            ends += 1
    waits = sorted(started[j] - queued[j] for j in started if j in queued)
    pct = lambda q: round(waits[min(len(waits) - 1, int(q * (len(waits) - 1) + 0.5))], 2) if waits else None  # noqa: E731
    minutes = max(1e-9, (ended - began) / 60)
    return {
        "took_s": round(ended - began, 1),
        "jobs_queued": len(queued),
        "jobs_ended": ends,
        "jobs_per_minute": round(ends / minutes, 1),
        "queue_wait_s": {"p50": pct(0.5), "p99": pct(0.99), "max": round(waits[-1], 2) if waits else None},
        "faults_by_kind": dict(Counter(str(h["kind"]) for h in history if h.get("src") == "fault")),
    }


def run(args: argparse.Namespace) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="bb-soak-"))
    soak = Soak(args, work, random.Random(args.seed))
    began = time.time()
    try:
        soak.start_workers()
        soak.drive()
        soak.wait_all(args.drain_s)
        for pid in soak.stopped:  # a freeze still pending must not outlive the run
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        soak.wait_all(args.drain_s)
        for host in soak.ports:  # the morning after: one more job per host, which cleans up what a dead launch left
            soak.say("user00", f"/bench {BENCH} on {host} any")
        soak.wait_all(args.drain_s)
        ended = time.time()
        history = soak.collect()
    finally:
        soak.close()
    out = Path(args.history) if args.history else work / "history.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for h in history:
            f.write(json.dumps(h, default=str) + "\n")
    results = history_check.check(history)
    result: dict[str, object] = {
        "schema": 1,
        "bench": "soak",
        "seed": args.seed,
        "size": {"jobs": args.jobs, "users": args.users, "hosts": args.hosts, "workers": args.workers},
        "fault_kinds": list(args.kinds),
        "faults": [{k: v for k, v in f.items() if k != "src"} for f in soak.faults],
        "figures": figures(history, began, ended),
        "properties": {p.name: p.to_dict() for p in results},
        "violations": sum(len(p.counter_examples) for p in results),
        "history": str(out),
        "cpus": os.cpu_count(),
    }
    if not args.history and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
        result["history"] = None
    return result


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100, help="accepted jobs to send")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--workers", type=int, default=5)
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ssh-hosts", type=int, default=0, help="the last K hosts are SSH hosts behind a slow link")
    parser.add_argument("--kinds", default=",".join(FAULT_KINDS), help="fault kinds to draw from")
    parser.add_argument("--drain-s", type=float, default=120.0, help="how long to wait for the last jobs")
    parser.add_argument("--history", default="", help="where to write the history JSONL (kept)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, ledger)")
    args = parser.parse_args(argv)
    args.kinds = tuple(k for k in args.kinds.split(",") if k)
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout` or CI stopping us: clean up as on Ctrl-C
    unknown = set(args.kinds) - set(FAULT_KINDS) - set(MORE_KINDS)
    if unknown:
        parser.error(f"unknown fault kinds {sorted(unknown)} (known: {', '.join(FAULT_KINDS + MORE_KINDS)})")
    if "slow_network" in args.kinds and not 0 < args.ssh_hosts <= args.hosts:
        parser.error("slow_network needs --ssh-hosts K (1 <= K <= --hosts)")
    result = run(args)
    print(json.dumps(result, indent=2, default=str))
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
