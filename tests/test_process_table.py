"""workers.host.process_table + observe(): an engine that is still loading owns its port.

Real SGLang binds its port only after loading the weights, so a loading engine is found in the process
table, not among listeners. These tests start real processes whose argv is an engine's (``-m
sglang.launch_server --port N``) but which never listen, with a child holding "GPU memory" the way
SGLang's schedulers do, and observe them through the real LocalTransport.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.util import free_port, wait_until
from workers.engines.sglang.processes import DEFAULT_PORT as SGLANG_DEFAULT_PORT
from workers.host.local import LocalTransport
from workers.host.process_table import (
    engine_kind,
    engine_port,
    parse_compute_apps,
    scan,
)
from workers.observe_port import observe

#: A process that looks like `python -m sglang.launch_server --port N` to ps, starts one child (its
#: "scheduler"), prints the child's pid and then sleeps without ever listening: a loading engine.
LOADING = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(120)\n"
)


def fake_module(root: Path, module: str, body: str) -> dict[str, str]:
    """A module ``module`` (``sglang.launch_server``) under ``root`` whose code is ``body``; the environment
    that lets ``python -m module`` import it. Run so, a process has an engine's argv as CPython reads it
    (``python3 -c CODE -m sglang.launch_server`` would run CODE, and is no engine: issue 39)."""
    package, _, name = module.rpartition(".")
    folder = root.joinpath(*package.split(".")) if package else root
    folder.mkdir(parents=True, exist_ok=True)
    for depth in range(len(package.split(".")) if package else 0):
        (root.joinpath(*package.split(".")[: depth + 1]) / "__init__.py").touch()
    (folder / f"{name}.py").write_text(body)
    return {**os.environ, "PYTHONPATH": str(root)}


def start_loading_module(root: Path, port: int, module: str = "sglang.launch_server") -> subprocess.Popen[str]:
    """A loading ``python -m sglang.launch_server --model-path m --port PORT`` (a fake package of that name
    under ``root``, never listening); its first stdout line is its child's pid."""
    return subprocess.Popen(
        [sys.executable, "-m", module, "--model-path", "m", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=fake_module(root, module, LOADING),
    )


@pytest.fixture
def loading_engine(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """(process, port, child pid) of a fake SGLang that is loading (bound for ``port``, not listening)."""
    port = free_port()
    proc = start_loading_module(tmp_path / "fake-sglang", port)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    try:
        yield proc, port, child
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def console_script(bin_dir: Path, body: str, name: str = "sglang") -> Path:
    """An executable ``bin_dir/name`` that starts with ``#!<this python>``, as pip writes a console script.

    Run as ``bin_dir/sglang serve ...``, the kernel shows it as ``<python> bin_dir/sglang serve ...``:
    the process-table shape of a real ``sglang serve``.
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / name
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def start_loading_serve(bin_dir: Path, port: int) -> subprocess.Popen[str]:
    """A loading ``sglang serve org/model --port PORT`` (the console script's shape, never listening); its
    first stdout line is its child's pid."""
    script = console_script(bin_dir, LOADING)
    proc = subprocess.Popen(
        [str(script), "serve", "org/model", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    return proc


def test_a_loading_sglang_serve_console_script_owns_its_port(tmp_path: Path) -> None:
    port = free_port()
    proc = start_loading_serve(tmp_path / "venv" / "bin", port)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:  # the kernel's shape: interpreter, script, words
            assert f.read().split(b"\0")[:3] == [
                sys.executable.encode(),
                str(tmp_path / "venv/bin/sglang").encode(),
                b"serve",
            ]
        smi = smi_with_apps(tmp_path, {child: 4000})
        seen = asyncio.run(observe(LocalTransport(), host_name="gpu-1", port=port, nvidia_smi=smi, timeout_s=2))
        assert seen.state == "loading" and seen.engine_kind == "sglang" and seen.owner_gpu_mib == 4000
        assert seen.process is not None and seen.process.pid == proc.pid
        # `sglang serve` reads a first plain word as the model, as SGLang's serve command does
        assert seen.launch_args == {"--model-path": "org/model", "--port": str(port)}
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def smi_with_apps(tmp_path: Path, apps: dict[int, int]) -> list[str]:
    """An nvidia-smi stand-in that answers --query-gpu and --query-compute-apps like the real tool."""
    rows = "".join(f"{pid}, {mib}\n" for pid, mib in apps.items())
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "import sys\n"
        "if sys.argv[1].startswith('--query-compute-apps=pid,used_memory'):\n"
        f"    sys.stdout.write({rows!r})\n"
        "elif sys.argv[1].startswith('--query-gpu='):\n"
        "    sys.stdout.write('0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 61000, 97887, 0, 12.0\\n')\n"
        "else:\n"
        "    sys.exit(2)\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return [sys.executable, str(script)]


@pytest.mark.parametrize(
    ("argv", "kind", "port"),
    [
        (["python3", "-m", "sglang.launch_server", "--model-path", "m", "--port", "30001"], "sglang", 30001),
        (["/opt/venv/bin/python", "/opt/venv/lib/python3.11/site-packages/sglang/launch_server.py"], "sglang", 30000),
        (["/opt/venv/bin/sglang", "serve", "--model-path", "m", "--port=31000"], "sglang", 31000),
        (["python", "-m", "workers.sim.sglang", "--port", "43103"], "sglang-sim", 43103),
        (["python3", "-m", "http.server", "30000"], None, SGLANG_DEFAULT_PORT),
        (["sglang::scheduler_TP0"], None, SGLANG_DEFAULT_PORT),
        (["vim", "sglang.launch_server"], None, SGLANG_DEFAULT_PORT),
        # `sglang serve` as the kernel shows the console script running (shebang: interpreter, script, words)
        (["/venv/bin/python3", "/venv/bin/sglang", "serve", "--model-path", "m", "--port", "31001"], "sglang", 31001),
        (["python3", "-u", "-X", "dev", "/opt/sgl/bin/sglang", "serve", "org/m", "--port=31002"], "sglang", 31002),
        (["/usr/local/bin/sglang", "serve", "org/m"], "sglang", SGLANG_DEFAULT_PORT),
        (["/venv/bin/python", "-m", "sglang.cli.main", "serve", "--port", "31003"], "sglang", 31003),
        # ...and what must never read as one: other sub-commands, files named sglang, the word elsewhere
        (["/venv/bin/python3", "/venv/bin/sglang", "version"], None, SGLANG_DEFAULT_PORT),
        (["/venv/bin/python3", "/venv/bin/sglang", "generate", "--port", "1"], None, 1),
        (["python3", "-m", "sglang.cli.main", "generate", "--model-path", "m"], None, SGLANG_DEFAULT_PORT),
        (["vim", "/venv/bin/sglang", "serve"], None, SGLANG_DEFAULT_PORT),
        (["python3", "tools/report.py", "/venv/bin/sglang", "serve"], None, SGLANG_DEFAULT_PORT),
        (["python3", "-c", "print(1)", "/venv/bin/sglang", "serve"], None, SGLANG_DEFAULT_PORT),
        (["grep", "-r", "sglang serve", "/var/log"], None, SGLANG_DEFAULT_PORT),
        (["bash", "-c", "sglang serve --port 31004"], None, SGLANG_DEFAULT_PORT),
        (["/venv/bin/python3", "/venv/bin/sglang-router", "serve"], None, SGLANG_DEFAULT_PORT),
        (["/venv/bin/vllm", "bench", "serve", "--port", "8000"], None, 8000),
    ],
)
def test_engines_are_recognised_from_their_argv(argv: list[str], kind: str | None, port: int) -> None:
    assert engine_kind(argv) == kind
    assert engine_port(argv) == port


#: Issue 39 round 4, item 1: words that merely name an engine's entry point in someone else's argv. CPython
#: runs the first of -c CODE, -m MODULE or a script; what follows is that program's own sys.argv.
NOT_ENGINES = [
    ["python3", "-c", "CODE", "-m", "sglang.launch_server", "--port", "30001"],
    ["python3", "-uc", "CODE", "-m", "sglang.launch_server"],
    ["python3", "my_tool.py", "-m", "sglang.launch_server", "--port", "30001"],
    ["python3", "my_tool.py", "/opt/venv/lib/python3.11/site-packages/sglang/launch_server.py"],
    ["python3", "-c", "CODE", "/x/sglang/launch_server.py"],
    ["vim", "/x/sglang/launch_server.py"],
    ["sh", "-m", "sglang.launch_server"],
    ["python3", "-h", "-m", "sglang.launch_server"],
    ["python3", "-J", "-m", "sglang.launch_server"],
    ["python3", "-c", "CODE", "-m", "vllm.entrypoints.openai.api_server"],
    ["python3", "-c", "CODE", "-m", "vllm.entrypoints.cli.main", "serve", "m"],
    ["python3", "my_tool.py", "/venv/bin/vllm", "serve", "m"],
    ["python3", "-c", "CODE", "-m", "tensorrt_llm.commands.serve", "serve", "m"],
    ["python3", "my_tool.py", "-m", "workers.sim.sglang", "--port", "30001"],
    ["python3", "-c", "CODE", "benchbot", "sim", "sglang"],
    ["python3", "my_tool.py", "/venv/bin/benchbot", "sim", "vllm"],
    ["/venv/bin/python3", "/venv/bin/benchbot", "sim", "nosuchengine"],
    ["/venv/bin/python3", "/venv/bin/benchbot", "status"],
]

#: ...and the real shapes, with the interpreter options CPython takes before them.
ENGINES = [
    (["python3", "-u", "-X", "dev", "-W", "ignore", "-m", "sglang.launch_server"], "sglang"),
    (["python3", "-Xdev", "-um", "sglang.launch_server", "--port", "1"], "sglang"),
    (["python3", "-msglang.launch_server"], "sglang"),
    (["python3", "--check-hash-based-pycs", "never", "-m", "sglang.launch_server"], "sglang"),
    (["python3", "-O", "--", "/x/sglang/launch_server.py"], "sglang"),
    (["python3", "-E", "-m", "vllm.entrypoints.cli.main", "serve", "m"], "vllm"),
    (["/venv/bin/python3", "-s", "/venv/bin/trtllm-serve", "m"], "trtllm"),
    # issue 36 item 7: benchbot's own simulator as the documented console script, as the kernel shows it
    (["/venv/bin/python3", "/venv/bin/benchbot", "sim", "sglang", "--port", "30001"], "sglang-sim"),
    (["/venv/bin/benchbot", "sim", "vllm", "serve", "m"], "vllm-sim"),
    (["python3", "-u", "/venv/bin/benchbot", "sim", "trtllm", "m"], "trtllm-sim"),
]


@pytest.mark.parametrize("argv", NOT_ENGINES)
def test_a_word_in_another_programs_argv_is_no_engine(argv: list[str]) -> None:
    assert engine_kind(argv) is None


@pytest.mark.parametrize(("argv", "kind"), ENGINES)
def test_interpreter_options_are_read_as_cpython_reads_them(argv: list[str], kind: str) -> None:
    assert engine_kind(argv) == kind


def test_a_python_command_that_runs_code_is_no_engine_and_its_port_word_does_not_crash(tmp_path: Path) -> None:
    """A real `python3 -c CODE -m sglang.launch_server --port P` process (and `--port ²` in argv): the
    process table finds no engine, and the scan survives a digit that is not ASCII."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", LOADING, "-m", "sglang.launch_server", "--port", str(port), "--port", "²"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        table = asyncio.run(scan(LocalTransport()))
        assert proc.pid in table.processes and table.processes[proc.pid].argv[:2] == (sys.executable, "-c")
        assert table.engines() == [] or all(e.pid != proc.pid for e in table.engines())
        seen = asyncio.run(observe(LocalTransport(), host_name="h", port=port, nvidia_smi=[], timeout_s=2))
        assert seen.state == "none" and seen.engine_kind is None
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_benchbots_own_simulator_started_as_documented_is_its_engine(tmp_path: Path) -> None:
    """Issue 36 item 7: `benchbot sim sglang ...` runs as `python3 .../bin/benchbot sim sglang ...` (the
    console script by its shebang); the process table reads it as the simulator bound for its port."""
    script = Path(sys.executable).parent / "benchbot"
    port = free_port()
    env = {**os.environ, "BENCHBOT_SIM_STATE_DIR": str(tmp_path / "sim")}
    proc = subprocess.Popen(
        [str(script), "sim", "sglang", "--model-path", "m", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    try:

        def bound() -> list[tuple[int, str, tuple[str, ...]]]:
            table = asyncio.run(scan(LocalTransport()))
            return [(e.pid, e.kind, e.process.argv[1:3]) for e in table.engines_on(port)]

        found = wait_until(bound, timeout=20, what="the simulator in the process table")
        assert found == [(proc.pid, "sglang-sim", (str(script), "sim"))]
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_a_configured_engine_command_is_an_engine_too() -> None:
    command = ("/srv/bin/my-sglang-wrapper", "--profile", "prod")
    assert engine_kind([*command, "--port", "1"], [command]) == "sglang"
    assert engine_kind(["/srv/bin/my-sglang-wrapper"], [command]) is None
    # a Python wrapper as the kernel shows it running by its shebang: the same command after its interpreter
    assert engine_kind(["/usr/bin/python3", "-u", *command, "--port", "1"], [command]) == "sglang"
    assert engine_kind(["/usr/bin/python3", "/elsewhere/my-sglang-wrapper", "--profile", "prod"], [command]) is None
    assert engine_kind(["/usr/bin/python3", "/srv/bin/my-sglang-wrapper", "--profile", "test"], [command]) is None
    assert engine_kind(["vim", *command], [command]) is None
    # a configured Python command: argv must run that very module, as CPython reads both
    module = ("python3", "-m", "mywrap")
    assert engine_kind(["python3", "-m", "mywrap", "--port", "1"], [module]) == "sglang"
    assert engine_kind(["python3", "-c", "CODE", "-m", "mywrap"], [module]) is None
    assert engine_kind(["python3", "-u", "-m", "anything"], [("python3", "-u")]) is None


def test_compute_apps_csv_sums_a_pid_over_gpus() -> None:
    assert parse_compute_apps("101, 4000\n101, 4000\n202, [N/A]\nNo running processes found\n") == {101: 8000, 202: 0}


def test_scan_finds_the_loading_engine_its_child_and_its_user(
    loading_engine: tuple[subprocess.Popen[str], int, int],
) -> None:
    proc, port, child = loading_engine
    table = asyncio.run(scan(LocalTransport()))
    bound = table.engines_on(port)
    assert [e.pid for e in bound] == [proc.pid]
    engine = bound[0]
    assert child in engine.tree and engine.process.user == pwd.getpwuid(os.getuid()).pw_name
    assert engine.process.argv[-2:] == ("--port", str(port))
    assert table.engines_on(port + 1 if port < 65535 else port - 1) == []


def test_observe_reports_a_loading_engine_as_the_owner_with_its_gpu_memory(
    loading_engine: tuple[subprocess.Popen[str], int, int], tmp_path: Path
) -> None:
    proc, port, child = loading_engine
    smi = smi_with_apps(tmp_path, {child: 61000, 999999: 5000})
    seen = asyncio.run(observe(LocalTransport(), host_name="gpu-1", port=port, nvidia_smi=smi, timeout_s=2))
    assert seen.state == "loading" and seen.is_engine and seen.engine_kind == "sglang"
    assert seen.process is not None and seen.process.pid == proc.pid
    assert seen.instance_id == f"gpu-1:{proc.pid}:{seen.process.start_ticks}"
    assert seen.owner_gpu_mib == 61000  # the child's memory counts, the stranger's does not
    assert seen.gpu_processes == {child: 61000, 999999: 5000}
    assert seen.owner_user == pwd.getpwuid(os.getuid()).pw_name
    assert "loading" in seen.detail


def test_a_foreign_listener_is_not_an_engine(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        transport = LocalTransport()
        wait_until(lambda: asyncio.run(transport.listener_pid(port)) == server.pid, what="http.server")
        seen = asyncio.run(observe(transport, host_name="h", port=port, nvidia_smi=[], timeout_s=2))
        assert seen.state == "not_sglang" and not seen.is_engine and seen.process is not None
        assert seen.process.pid == server.pid
    finally:
        server.kill()
        server.wait()


def test_nothing_bound_and_nothing_listening_is_none() -> None:
    seen = asyncio.run(observe(LocalTransport(), host_name="h", port=free_port(), nvidia_smi=[], timeout_s=2))
    assert seen.state == "none" and seen.process is None and seen.engine_kind is None
