"""How benchbot stops an engine it did not start, on a real process tree (checked from /proc).

The transports' fenced signals are tested in ``tests/test_transport.py``; the job paths end to end in
``tests/integration/test_jobs.py``. Here ``stop_engine`` runs through the local transport and asyncssh's
server against real processes.
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
from workers.errors import EngineError
from workers.host.engine_stop import stop_engine
from workers.host.local import LocalTransport
from workers.host.transport import HostFence, Transport

PY = sys.executable


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
    transport: Transport, tmp_path: Path
) -> None:
    out = tmp_path / "engine.out"
    # sh leads the group; the engine and a neighbour (`sleep`) are its children, in its group.
    shell = subprocess.Popen(
        ["sh", "-c", f'"$0" -c "$1" >"{out}" & sleep 300 & wait', PY, ENGINE_SCRIPT], start_new_session=True
    )
    try:
        child = int(wait_until(lambda: out.exists() and out.read_text().strip(), 15, what="the engine's child"))
        engine = next(
            int(p)
            for p in Path(f"/proc/{shell.pid}/task/{shell.pid}/children").read_text().split()
            if Path(f"/proc/{p}/cmdline").read_bytes().startswith(PY.encode())
        )
        neighbours = [
            int(p) for p in Path(f"/proc/{shell.pid}/task/{shell.pid}/children").read_text().split() if int(p) != engine
        ]
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
