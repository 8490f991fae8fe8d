"""Which port owners benchbot may stop, and how it stops an engine it did not start (real processes).

The transports' fenced signals are tested in ``tests/test_transport.py``; the job paths end to end in
``tests/integration/test_jobs.py``. Here: the identification rule, and ``stop_engine`` on a real
process tree through the local transport and asyncssh's server (checked from /proc, not through it).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sshd import AsyncsshServer, asyncssh_server
from tests.util import wait_until
from workers.config import EMBEDDED_TOML, parse_config
from workers.engine_stop import ENGINE, OTHER, OURS, looks_like_engine_argv, owner_kind, stop_engine
from workers.errors import EngineError
from workers.transport import HostFence, Transport
from workers.transport_local import LocalTransport

PY = sys.executable
CONFIG = parse_config(EMBEDDED_TOML, "embedded")


@pytest.mark.parametrize(("argv", "command", "expected"), [
    (["/venv/bin/python3.11", "-m", "sglang.launch_server", "--port", "1"], ["python3", "-m", "sglang.launch_server"],
     True),
    (["python", "-m", "sglang.launch_server", "--tp", "8"], ["my-wrapper"], True),
    (["/usr/bin/python3", "/venv/bin/sglang", "serve", "--model-path", "m"], ["python3", "-m", "x"], True),
    (["/opt/bin/serve-model", "--port", "1"], ["serve-model"], True),
    (["python3", "/opt/bin/serve-model"], ["/opt/bin/serve-model"], True),
    ([PY, "-m", "workers.sim.sglang", "--port", "1"], [PY, "-m", "workers.sim.sglang"], True),
    (["python3", "-m", "http.server", "30000"], ["python3", "-m", "sglang.launch_server"], False),
    (["postgres", "-D", "/var/lib/pg"], ["python3", "-m", "sglang.launch_server"], False),
    (["python3", "-c", "print('sglang.launch_server')"], ["python3", "-m", "sglang.launch_server"], False),
    ([], ["python3"], False),
])
def test_an_engine_is_recognised_by_its_command_not_by_a_word_in_it(argv: list[str], command: list[str],
                                                                   expected: bool) -> None:
    assert looks_like_engine_argv(argv, command) is expected


def test_owner_kind_trusts_our_launch_record_then_the_server_then_the_argv() -> None:
    http_server = {"pid": 9, "argv": ["python3", "-m", "http.server"]}
    assert owner_kind(CONFIG, {"managed": True, "state": "unresponsive", "process": http_server}) == OURS
    assert owner_kind(CONFIG, {"managed": False, "state": "running", "process": http_server}) == ENGINE
    assert owner_kind(CONFIG, {"managed": False, "state": "not_sglang", "process": http_server}) == OTHER
    assert owner_kind(CONFIG, {"managed": False, "state": "starting", "process": http_server}) == OTHER
    sim = {"pid": 9, "argv": [PY, "-m", "workers.sim.sglang", "--port", "1"]}
    assert owner_kind(CONFIG, {"managed": False, "state": "unresponsive", "process": sim}) == ENGINE


# ---- stop_engine on real processes -----------------------------------------------------------------------

# "Their" engine: not a group leader (a shell they ran leads the group), with a child that outlives it.
ENGINE_SCRIPT = """\
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
print(child.pid, flush=True)
time.sleep(300)
"""


@pytest.fixture(scope="module")
def asyncssh_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AsyncsshServer]:
    with asyncssh_server(tmp_path_factory.mktemp("asyncssh")) as server:
        yield server


@pytest.fixture(params=["local", "asyncssh"])
def transport(request: pytest.FixtureRequest) -> Transport:
    if request.param == "local":
        return LocalTransport(name="box")
    return request.getfixturevalue("asyncssh_srv").transport()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def test_an_unmanaged_engine_gets_signals_to_its_pid_and_its_leftover_children_follow(
        transport: Transport, tmp_path: Path) -> None:
    out = tmp_path / "engine.out"
    # sh leads the group; the engine and a neighbour (`sleep`) are its children, in its group.
    shell = subprocess.Popen(["sh", "-c", f'"$0" -c "$1" >"{out}" & sleep 300 & wait', PY, ENGINE_SCRIPT],
                             start_new_session=True)
    try:
        child = int(wait_until(lambda: out.exists() and out.read_text().strip(), 15, what="the engine's child"))
        engine = next(int(p) for p in Path(f"/proc/{shell.pid}/task/{shell.pid}/children").read_text().split()
                      if Path(f"/proc/{p}/cmdline").read_bytes().startswith(PY.encode()))
        neighbours = [int(p) for p in Path(f"/proc/{shell.pid}/task/{shell.pid}/children").read_text().split()
                      if int(p) != engine]
        assert os.getpgid(engine) == shell.pid != engine and neighbours

        async def scenario() -> str:
            async with transport as t:
                fence = HostFence.for_port(str(tmp_path), 7, 3)
                await t.claim_host(fence)
                with pytest.raises(EngineError, match="does not lead its own process group"):
                    await stop_engine(t, fence, engine, _ticks(engine), group=True, grace_s=5)
                return await stop_engine(t, fence, engine, _ticks(engine), group=False, grace_s=5)

        how = asyncio.run(scenario())
        assert how.startswith("stopped") and "1 child process outlived it and was stopped too" in how, how
        assert not _alive(engine) and not _alive(child)
        assert shell.poll() is None and all(_alive(p) for p in neighbours), "its process group was signalled"
    finally:
        os.killpg(shell.pid, 9)
        shell.wait(10)
