"""Start a sim server as a real subprocess and wait until it serves: for tests, the demo and scripts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from workers.engines.contract import load_contract
from workers.errors import EngineError
from workers.sim.args import DEFAULT_SGLANG_VERSION

READY_LINE = load_contract("sglang", DEFAULT_SGLANG_VERSION).ready_line or "The server is fired up and ready to roll!"

DEFAULT_MODEL = "nvidia/Qwen3.5-397B-A17B-NVFP4"

#: The seed's baseline SGLang launch as simulator argv (NVFP4 on TP8, flashinfer's cutlass MoE and cudnn FP4
#: GEMM, triton attention, an FP8 KV cache): the known-good server tests and ``bench/`` scripts start.
BASELINE_ARGS: tuple[str, ...] = (
    "--model-path",
    DEFAULT_MODEL,
    "--tp-size",
    "8",
    "--quantization",
    "modelopt_fp4",
    "--moe-runner-backend",
    "flashinfer_cutlass",
    "--fp4-gemm-backend",
    "flashinfer_cudnn",
    "--disable-custom-all-reduce",
    "--attention-backend",
    "triton",
    "--kv-cache-dtype",
    "fp8_e4m3",
)


class SimProcess:
    """A running ``python -m workers.sim.sglang``; a context manager that kills it (and its group) on exit."""

    def __init__(self, proc: subprocess.Popen, port: int, host: str, log_path: Path, owns_log: bool = False) -> None:
        self.owns_log = owns_log  # a temp log we created is removed on __exit__
        self.proc = proc
        self.port = port
        self.host = host
        self.log_path = log_path

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def health(self) -> int | None:
        """HTTP status of ``/health`` (None when nothing answers: the server is still loading, or gone)."""
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=2) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, OSError):
            return None

    def wait_ready(self, timeout: float = 30.0) -> SimProcess:
        """Block until /health is 200 and the ready line is logged; EngineError if it dies or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_text()[-2000:]
                raise EngineError(f"sim server exited with code {self.proc.returncode} before it was ready:\n{tail}")
            if self.health() == 200 and READY_LINE in self.log_text():
                return self
            time.sleep(0.02)
        raise EngineError(f"sim server on port {self.port} not ready after {timeout}s")

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (clean shutdown, unregisters), then SIGKILL if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        return self.proc.returncode

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if self.owns_log:
            self.log_path.unlink(missing_ok=True)


def spawn_sim(
    port: int,
    *args: str,
    env: dict[str, str] | None = None,
    log_path: str | os.PathLike[str] | None = None,
    startup_s: float = 0.0,
    host: str = "127.0.0.1",
    python: str = sys.executable,
    load_s: float | None = None,
) -> SimProcess:
    """Start the server without waiting. Adds ``--port``/``--host``/``--sim-startup-s`` unless ``args`` has
    them (and ``--sim-load-s`` when ``load_s`` is given), and ``--model-path <Qwen3.5 NVFP4> --tp-size 8``
    when no model is given; stdout+stderr go to ``log_path`` (a temp file by default)."""
    argv = list(args)
    if not any(a in ("--model-path", "--model") or a.startswith(("--model-path=", "--model=")) for a in argv):
        argv = ["--model-path", DEFAULT_MODEL, *argv]
        if not any(a.startswith(("--tp", "--tensor-parallel-size")) for a in argv):
            argv += ["--tp-size", "8"]  # the default model needs all 8 GPUs
    if "--port" not in argv:
        argv += ["--port", str(port)]
    if "--host" not in argv:
        argv += ["--host", host]
    if not any(a.startswith("--sim-startup-s") for a in argv):
        argv += ["--sim-startup-s", str(startup_s)]
    if load_s is not None and not any(a.startswith("--sim-load-s") for a in argv):
        argv += ["--sim-load-s", str(load_s)]
    owns_log = log_path is None
    if log_path is None:
        import tempfile

        fd, name = tempfile.mkstemp(prefix=f"sim-{port}-", suffix=".log")
        os.close(fd)
        log_path = name
    full_env = dict(os.environ)
    full_env.update(env or {})
    root = str(Path(__file__).resolve().parents[2])
    full_env["PYTHONPATH"] = root + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
    path = Path(log_path)
    with path.open("ab") as log:
        proc = subprocess.Popen(
            [python, "-m", "workers.sim.sglang", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=root,
            start_new_session=True,
        )
    return SimProcess(proc, port, host, path, owns_log)


def start_sim(
    port: int,
    *args: str,
    env: dict[str, str] | None = None,
    log_path: str | os.PathLike[str] | None = None,
    startup_s: float = 0.0,
    timeout: float = 30.0,
    host: str = "127.0.0.1",
    load_s: float | None = None,
) -> SimProcess:
    """Start the server and wait until it is ready (use as ``with start_sim(port, ...) as sim:``)."""
    sim = spawn_sim(port, *args, env=env, log_path=log_path, startup_s=startup_s, host=host, load_s=load_s)
    try:
        return sim.wait_ready(timeout)
    except BaseException:
        sim.stop()
        raise
