"""Local and SSH transports keep the same promises; each test runs against every kind that is here.

The SSH kinds are real servers on 127.0.0.1 (asyncssh's own, and OpenSSH's sshd when installed), so
every "remote" process is also a local one: the tests check outcomes through /proc directly, not
through the transport under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import asyncssh
import pytest

from tests.sshd import (
    AsyncsshServer,
    OpensshServer,
    SshTestServer,
    asyncssh_server,
    openssh_server,
    openssh_unavailable_reason,
)
from tests.util import free_port, wait_until
from workers.errors import LeaseLostError, StaleFenceError, TransportError
from workers.host.connect import open_transport
from workers.host.local import LocalTransport
from workers.host.ssh import SshTransport
from workers.host.transport import (
    ENGINE_BASE_ENV,
    ENGINE_BASE_ENV_PREFIXES,
    HostFence,
    SpawnedProcess,
    Transport,
)

PY = sys.executable
MakeTransport = Callable[..., Transport]

# Text that a shell would act on; it must arrive as plain argv items and never run.
HOSTILE_TEMPLATES = [
    "a b",
    "semi;colon; touch {canary}",
    "$(touch {canary})",
    "`touch {canary}`",
    "'single' quotes",
    '"double" quotes',
    "new\nline",
    "*",
    "back\\slash",
    "",
    "-dash",
    "&& touch {canary}",
    "| touch {canary}",
    "$HOME ${PATH}",
    "~",
    "tab\there",
    "unicodé ✓",
    ">redirect",
]
PRINT_ARGV = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ.get('BB_VALUE'), os.getcwd()]))"


# ---- fixtures --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def asyncssh_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AsyncsshServer]:
    with asyncssh_server(tmp_path_factory.mktemp("asyncssh")) as server:
        yield server


@pytest.fixture(scope="module")
def openssh_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpensshServer]:
    reason = openssh_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with openssh_server(tmp_path_factory.mktemp("openssh")) as server:
        yield server


@pytest.fixture(params=["local", "asyncssh", "openssh"])
def make_transport(request: pytest.FixtureRequest) -> MakeTransport:
    """A factory (a fresh, unconnected transport per call) for each kind of transport."""
    if request.param == "local":
        return lambda **kw: LocalTransport(name="box", **kw)
    server: SshTestServer = request.getfixturevalue(f"{request.param}_srv")
    return server.transport


@pytest.fixture(params=["asyncssh", "openssh"])
def ssh_srv(request: pytest.FixtureRequest) -> SshTestServer:
    return request.getfixturevalue(f"{request.param}_srv")


# ---- oracles that do not go through the transport ---------------------------------------------------------


def alive(pid: int) -> bool:
    """Exists and is not a zombie, read straight from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in {"Z", "X"}


def kill_group(pgid: int) -> None:
    """Test cleanup: nothing we started may outlive the test."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def accepts(port: int) -> bool:
    """Something listens on 127.0.0.1:port."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def proc_stat(pid: int) -> tuple[str, int, int, int]:
    """(state, ppid, pgid, start ticks) straight from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return rest[0], int(rest[1]), int(rest[2]), int(rest[19])


def session_members(sid: int) -> list[int]:
    """Live pids of a session, from /proc (the engine and the log scrubber beside it)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and alive(int(entry)):
            with contextlib.suppress(OSError, ValueError):
                if os.getsid(int(entry)) == sid:
                    found.append(int(entry))
    return found


async def claimed(t: Transport, directory: Path, token: int = 1) -> HostFence:
    """Claim the host for ``token`` (what a job does first) and return the fence."""
    fence = HostFence.for_port(str(directory), 4242, token)
    await t.claim_host(fence)
    return fence


async def spawn(t: Transport, argv: list[str], log_path: str, fence_dir: Path, **kw: Any) -> SpawnedProcess:
    """Claim with token 1 and start argv detached, as a job does."""
    return await t.spawn_engine(argv, log_path=log_path, fence=await claimed(t, fence_dir), **kw)


def unused_pid() -> int:
    """A pid that just finished and was reaped (pids are not reused this fast)."""
    probe = subprocess.Popen(["true"])
    probe.wait()
    return probe.pid


# ---- run ---------------------------------------------------------------------------------------------------


def test_run_returns_output_and_status_without_raising(make_transport: MakeTransport) -> None:
    async def scenario() -> None:
        async with make_transport() as t:
            result = await t.run(
                [PY, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"], timeout=20
            )
            assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
            assert not result.ok
            assert (await t.run(["true"], timeout=20)).ok

    asyncio.run(scenario())


def test_run_feeds_input_and_applies_host_then_call_env(make_transport: MakeTransport) -> None:
    async def scenario() -> None:
        async with make_transport(env={"BB_HOST": "from host", "BB_BOTH": "host"}) as t:
            echoed = await t.run(["cat"], timeout=20, input="line one\nline two ✓\n")
            assert echoed.stdout == "line one\nline two ✓\n"
            assert (await t.run(["cat"], timeout=20)).stdout == ""  # no input: EOF at once, no hang
            env = await t.run(
                [
                    PY,
                    "-c",
                    "import json, os; print(json.dumps([os.environ.get(k) for k in "
                    "('BB_HOST', 'BB_BOTH', 'BB_CALL')]))",
                ],
                timeout=20,
                env={"BB_BOTH": "call", "BB_CALL": "x y"},
            )
            assert json.loads(env.stdout) == ["from host", "call", "x y"]

    asyncio.run(scenario())


def test_check_true_raises_a_friendly_error_with_status_and_stderr(make_transport: MakeTransport) -> None:
    async def scenario() -> None:
        async with make_transport() as t:
            with pytest.raises(TransportError) as caught:
                await t.run(["sh", "-c", "echo disk is full >&2; exit 7"], timeout=20, check=True)
            message = str(caught.value)
            assert "status 7" in message and "disk is full" in message and t.host_label in message

    asyncio.run(scenario())


def test_missing_program_exits_127(make_transport: MakeTransport) -> None:
    async def scenario() -> None:
        async with make_transport() as t:
            result = await t.run(["benchbot-no-such-program"], timeout=20)
            assert result.returncode == 127
            with pytest.raises(TransportError, match="status 127"):
                await t.run(["benchbot-no-such-program"], timeout=20, check=True)

    asyncio.run(scenario())


def test_timeout_stops_the_command_and_its_children(make_transport: MakeTransport, tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    script = 'echo $$ > "$1"; sleep 60 & echo $! >> "$1"; wait'

    async def scenario() -> float:
        async with make_transport() as t:
            started = time.monotonic()
            with pytest.raises(TransportError, match=r"did not finish within 0\.5s"):
                await t.run(["sh", "-c", script, "sh", str(pids_file)], timeout=0.5)
            return time.monotonic() - started

    elapsed = asyncio.run(scenario())
    pids = [int(p) for p in pids_file.read_text().split()]
    try:
        assert len(pids) == 2
        wait_until(lambda: not any(alive(p) for p in pids), timeout=5, what="timed-out command to be gone")
        assert elapsed < 5
    finally:
        for pid in pids:
            kill_group(pid)


def test_a_local_command_keeps_the_callers_session_and_nice_in_its_own_group() -> None:
    """A new session is a new scheduling autogroup on Linux, which sheds the caller's nice: the observer's
    probes (nice 19) then took the CPU from the bot and Redis as equals, and /status of 50 hosts took 1.5 s
    instead of 0.65. Its own process group is kept (a timeout stops its children: the test above)."""
    script = "import os; print(os.getsid(0), os.getpgid(0), os.getpid(), os.nice(0))"

    async def scenario() -> str:
        return (await LocalTransport().run([sys.executable, "-c", script], timeout=30, check=True)).stdout

    sid, pgid, pid, nice = (int(word) for word in asyncio.run(scenario()).split())
    assert sid == os.getsid(0)  # the caller's session, so the caller's autogroup
    assert pgid == pid != os.getpgid(0)  # its own group
    assert nice == os.nice(0)


# ---- quoting -----------------------------------------------------------------------------------------------


def test_hostile_arguments_and_env_arrive_verbatim_and_run_nothing(
    make_transport: MakeTransport, tmp_path: Path
) -> None:
    canary = tmp_path / "CANARY"
    hostile = [s.replace("{canary}", str(canary)) for s in HOSTILE_TEMPLATES]
    env_value = f"$(touch {canary}); `touch {canary}` 'q' \"d\"\n* ~"
    odd_dir = tmp_path / "dir with $(touch CANARY) `touch CANARY` 'q' ;*"
    odd_dir.mkdir()
    log_path = str(odd_dir / "log `touch x`.txt")

    async def scenario() -> list[Any]:
        async with make_transport() as t:
            result = await t.run(
                [PY, "-c", PRINT_ARGV, *hostile], timeout=20, env={"BB_VALUE": env_value}, input=f"$(touch {canary})"
            )
            assert json.loads(result.stdout)[:2] == [hostile, env_value]
            spawned = await spawn(
                t, [PY, "-c", PRINT_ARGV, *hostile], log_path, tmp_path, env={"BB_VALUE": env_value}, cwd=str(odd_dir)
            )
            assert spawned.log_path == log_path
            await asyncio.to_thread(wait_until, lambda: not session_members(spawned.pid), 10)
            assert await t.wait_log_written(spawned, 0.1)
            text, _ = await t.read_log(log_path)
            return json.loads(text)

    from_log = asyncio.run(scenario())
    assert from_log == [hostile, env_value, str(odd_dir)]
    assert not canary.exists()
    for where in (tmp_path, odd_dir, Path.cwd(), Path.home()):
        assert not (where / "CANARY").exists() and not (where / "x").exists()


def test_remote_command_quotes_every_part() -> None:
    t = SshTransport("gpu-1", env={"BB_A": "$(id)"})
    argv = ["prog", "a b", "$(touch /tmp/x)", "`y`", "'", "\n", ""]
    command = t.remote_command(argv, 2.5, {"BB_B": "; rm -rf /"})
    assert shlex.split(command) == ["timeout", "--kill-after=2", "2.5", "env", "BB_A=$(id)", "BB_B=; rm -rf /", *argv]


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        ([], None),
        ("echo hi", None),
        (["-rf"], None),
        (["A=B", "x"], None),
        (["echo", "nul\0byte"], None),
        (["echo"], {"BAD NAME": "x"}),
        (["echo"], {"A;touch": "x"}),
        (["echo"], {"1ABC": "x"}),
        (["echo"], {"OK": "nul\0"}),
    ],
)
def test_bad_commands_and_env_names_are_refused_before_running(
    make_transport: MakeTransport, argv: Any, env: Any
) -> None:
    async def scenario() -> None:
        async with make_transport() as t:
            with pytest.raises(TransportError):
                await t.run(argv, timeout=5, env=env)

    asyncio.run(scenario())


# ---- detached processes -----------------------------------------------------------------------------------


def test_spawn_engine_returns_fast_and_outlives_the_transport(make_transport: MakeTransport, tmp_path: Path) -> None:
    log_path = str(tmp_path / "logs" / "engine.log")  # the directory does not exist yet
    argv = [PY, "-c", "import time; print('ready', flush=True); time.sleep(60)"]

    async def start() -> tuple[Any, HostFence, float]:
        async with make_transport() as t:
            fence = await claimed(t, tmp_path / "fence")  # connect and claim first: measure the spawn alone
            started = time.monotonic()
            spawned = await t.spawn_engine(argv, log_path=log_path, fence=fence)
            return spawned, fence, time.monotonic() - started

    spawned, fence, elapsed = asyncio.run(start())
    try:
        assert elapsed < 3, "a detached start must not wait for the process"
        assert spawned.pid == spawned.pgid == os.getpgid(spawned.pid) == os.getsid(spawned.pid)
        assert spawned.start_ticks == proc_stat(spawned.pid)[3] > 0
        assert alive(spawned.pid), "the process must survive the transport closing"

        async def watch() -> None:
            async with make_transport() as t:
                assert await t.is_alive(spawned.pid)
                await asyncio.to_thread(wait_until, lambda: Path(log_path).read_text() == "ready\n", 10)
                assert await t.read_log(log_path) == ("ready\n", 6)
                result = await t.signal_process(spawned.pid, spawned.start_ticks, "TERM", group=True, fence=fence)
                assert result.sent, result
                await asyncio.to_thread(
                    wait_until,
                    lambda: not session_members(spawned.pid),
                    10,
                    what="the engine and its log scrubber to end",
                )
                assert not await t.is_alive(spawned.pid)

        asyncio.run(watch())
    finally:
        kill_group(spawned.pgid)


def test_spawn_of_a_missing_program_is_a_friendly_error(make_transport: MakeTransport, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with make_transport() as t:
            with pytest.raises(TransportError, match=r"cannot start .benchbot-no-such-program.: No such file"):
                await spawn(t, ["benchbot-no-such-program"], str(tmp_path / "log"), tmp_path)

    asyncio.run(scenario())


def test_signal_reaches_the_group_only_when_asked_and_pgid_is_pid(
    make_transport: MakeTransport, tmp_path: Path
) -> None:
    log_path = str(tmp_path / "group.log")
    # A leader that starts a child (same group) and reports the child's pid.
    leader = "import subprocess, time; c = subprocess.Popen(['sleep', '60']); print(c.pid, flush=True); time.sleep(60)"

    async def scenario() -> None:
        async with make_transport() as t:
            fence = await claimed(t, tmp_path)
            spawned = await t.spawn_engine([PY, "-c", leader], log_path=log_path, fence=fence)
            try:
                text = await asyncio.to_thread(wait_until, lambda: Path(log_path).read_text().strip(), 10)
                child = int(text)
                child_ticks = proc_stat(child)[3]
                assert os.getpgid(child) == spawned.pgid
                assert await t.process_descendants(spawned.pid, spawned.start_ticks) == [(child, child_ticks)]
                # the child does not lead a group: asking for "its" group is refused, nothing is sent
                refused = await t.signal_process(child, child_ticks, "KILL", group=True, fence=fence)
                assert (refused.outcome, refused.reason) == ("refused", "not_group_leader")
                # without group: the pid alone (the leader and the rest of its group live on)
                assert (await t.signal_process(child, child_ticks, "KILL", fence=fence)).sent
                await asyncio.to_thread(wait_until, lambda: not alive(child), 10)
                assert alive(spawned.pid) and len(session_members(spawned.pid)) == 2  # leader + scrubber
                # a gone process is reported gone, not signalled
                gone = await t.signal_process(child, child_ticks, "KILL", fence=fence)
                assert gone.outcome == "gone"
                # asked for, on the leader: the whole group (the scrubber outlives TERM, then sees EOF)
                assert (await t.signal_process(spawned.pid, spawned.start_ticks, "TERM", group=True, fence=fence)).sent
                await asyncio.to_thread(
                    wait_until, lambda: not session_members(spawned.pid), 10, what="the whole session to end"
                )
                for bad in (0, 1, -1, -spawned.pgid):
                    with pytest.raises(TransportError, match="refusing"):
                        await t.signal_process(bad, 0, fence=fence)
                with pytest.raises(TransportError, match="unknown signal"):
                    await t.signal_process(spawned.pid, spawned.start_ticks, "TERM; touch x", fence=fence)
            finally:
                kill_group(spawned.pgid)

    asyncio.run(scenario())


def test_a_wrong_start_tick_refuses_the_signal(make_transport: MakeTransport, tmp_path: Path) -> None:
    """The pid was reused (same pid, another start): the host refuses to signal it."""

    async def scenario() -> None:
        async with make_transport() as t:
            fence = await claimed(t, tmp_path)
            spawned = await t.spawn_engine(
                [PY, "-c", "import time; time.sleep(60)"], log_path=str(tmp_path / "l.log"), fence=fence
            )
            try:
                for group in (False, True):
                    result = await t.signal_process(
                        spawned.pid, spawned.start_ticks + 1, "KILL", group=group, fence=fence
                    )
                    assert (result.outcome, result.reason) == ("refused", "reused")
                    assert "another process" in result.detail
                time.sleep(0.3)  # not a synchronisation: the time a KILL sent by mistake would need to land
                assert alive(spawned.pid)
            finally:
                kill_group(spawned.pgid)

    asyncio.run(scenario())


def test_a_stale_fence_refuses_spawn_signal_and_cleanup_and_touches_nothing(
    make_transport: MakeTransport, tmp_path: Path
) -> None:
    """A job paused past its lease resumes after a newer job claimed the host: the host itself says no."""
    canary = tmp_path / "SPAWNED"

    async def scenario() -> None:
        async with make_transport() as t:
            newer = await claimed(t, tmp_path, token=5)
            running = await t.spawn_engine(
                [PY, "-c", "import time; time.sleep(60)"], log_path=str(tmp_path / "newer.log"), fence=newer
            )
            try:
                stale = HostFence.for_port(str(tmp_path), 4242, 4)
                with pytest.raises(StaleFenceError, match="stale fence") as caught:
                    await t.claim_host(stale)
                assert isinstance(caught.value, LeaseLostError)
                with pytest.raises(StaleFenceError, match="holds 5"):
                    await t.spawn_engine(
                        [PY, "-c", f"open({str(canary)!r}, 'w')"],
                        log_path=str(tmp_path / "stale.log"),
                        fence=stale,
                        private_options={"api-key": "sk-stale"},
                    )
                for group in (False, True):
                    with pytest.raises(StaleFenceError):
                        await t.signal_process(running.pid, running.start_ticks, "KILL", group=group, fence=stale)
                with pytest.raises(StaleFenceError):
                    await t.remove_engine_config(stale)
                time.sleep(0.5)  # not a synchronisation: the time a process started by mistake would need
                assert not canary.exists() and not (tmp_path / "stale.log").exists()
                assert not Path(stale.engine_config_path).exists()
                assert alive(running.pid)
                assert Path(newer.path).read_text() == "5\n"
                # a token never claimed is refused too, even a higher one
                with pytest.raises(TransportError, match="never claimed"):
                    await t.spawn_engine(
                        ["true"], log_path=str(tmp_path / "x.log"), fence=HostFence.for_port(str(tmp_path), 4242, 6)
                    )
                # the newer job itself still acts
                assert (await t.signal_process(running.pid, running.start_ticks, "KILL", fence=newer)).sent
            finally:
                kill_group(running.pgid)

    asyncio.run(scenario())
    assert oct(Path(tmp_path / ".benchbot-fence-4242").stat().st_mode & 0o777) == "0o600"


def test_an_expired_fence_is_refused_by_the_host_though_nobody_claimed_since(
    make_transport: MakeTransport, tmp_path: Path
) -> None:
    """Issue 25 item 1: the token is still the newest, but its lease deadline has passed: no spawn, no signal.

    The deadline is the worker's monotonic instant; the transport maps it onto the host's boot clock with
    what the claim answered, and the host compares under its lock.
    """
    canary = tmp_path / "SPAWNED"
    deadline = [time.monotonic() + 60]

    async def scenario() -> None:
        async with make_transport() as t:
            fence = HostFence.for_port(str(tmp_path), 4242, 3, deadline=lambda: deadline[0])
            with pytest.raises(StaleFenceError, match="not claimed through this connection"):
                await t.spawn_engine(["true"], log_path=str(tmp_path / "early.log"), fence=fence)
            await t.claim_host(fence)
            running = await t.spawn_engine(
                [PY, "-c", "import time; time.sleep(60)"], log_path=str(tmp_path / "live.log"), fence=fence
            )
            try:
                deadline[0] = time.monotonic() - 0.05  # the lease's proof ran out a moment ago
                with pytest.raises(StaleFenceError, match="expired") as caught:
                    await t.spawn_engine(
                        [PY, "-c", f"open({str(canary)!r}, 'w')"], log_path=str(tmp_path / "late.log"), fence=fence
                    )
                assert isinstance(caught.value, LeaseLostError)
                with pytest.raises(StaleFenceError, match="expired"):
                    await t.signal_process(running.pid, running.start_ticks, "KILL", fence=fence)
                with pytest.raises(StaleFenceError, match="expired"):
                    await t.remove_engine_config(fence)
                time.sleep(0.5)  # not a synchronisation: the time a process started by mistake would need
                assert not canary.exists() and not (tmp_path / "late.log").exists()
                assert alive(running.pid)
                assert Path(fence.path).read_text() == "3\n"  # nobody claimed since: the deadline alone refused
                # a deadline mapped in another boot is refused too
                request = {"op": "unlink", "fence": {**t.fence_request(fence), "until": 1e12, "boot": "x"}}
                with pytest.raises(StaleFenceError, match="rebooted"):
                    await t.actuate({**request, "path": fence.engine_config_path})
                deadline[0] = time.monotonic() + 60  # a renewal proved it again: the same token acts
                assert (await t.signal_process(running.pid, running.start_ticks, "KILL", fence=fence)).sent
            finally:
                kill_group(running.pgid)

    asyncio.run(scenario())


def test_engine_env_is_the_basics_and_what_was_named(
    make_transport: MakeTransport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's (and the SSH login's) secrets never reach the engine: only basics and named variables."""
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-canary-never-in-the-engine")
    monkeypatch.setenv("REDIS_URL", "redis://:canary-pass@127.0.0.1:1/0")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    log_path = tmp_path / "env.log"

    async def scenario() -> dict[str, str]:
        async with make_transport(env={"BB_HOST": "host value"}) as t:
            spawned = await spawn(
                t,
                [PY, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                str(log_path),
                tmp_path,
                env={"BB_NAMED": "named value"},
            )
            await asyncio.to_thread(wait_until, lambda: not alive(spawned.pid), 10)
            assert await t.wait_log_written(spawned, 10)
            return json.loads(log_path.read_text())

    env = asyncio.run(scenario())
    assert env["BB_HOST"] == "host value" and env["BB_NAMED"] == "named value"
    extra = {k for k in env if k not in ENGINE_BASE_ENV and not k.startswith(ENGINE_BASE_ENV_PREFIXES)}
    assert extra == {"BB_HOST", "BB_NAMED"}, extra
    assert "PATH" in env and "HOME" in env
    assert "SLACK_BOT_TOKEN" not in env and "REDIS_URL" not in env


def test_engine_log_and_private_config_are_0600_and_secrets_are_scrubbed(
    make_transport: MakeTransport, tmp_path: Path
) -> None:
    key, hf = "sk-canary-key-7f3a", "hf_canary_token_0042"
    log_path = tmp_path / "engine.log"
    log_path.write_text("an older log, world-readable\n")
    log_path.chmod(0o644)
    # It prints what SGLang prints at start-up (server_args with the key), reads its --config file, waits.
    engine = (
        "import json, os, sys, time; cfg = json.load(open(sys.argv[2])); hf = os.environ['HF']; "
        "print(f'server_args=ServerArgs(model_path=m, api_key={cfg[\"api-key\"]!r}, x={hf})'); "
        "print('--api-key other-secret-value --hf-token', hf, 'Bearer abc.def', flush=True); "
        "time.sleep(60)"
    )

    async def scenario() -> None:
        async with make_transport() as t:
            fence = await claimed(t, tmp_path)
            config = Path(fence.engine_config_path)
            spawned = await t.spawn_engine(
                [PY, "-c", engine, "--config", fence.engine_config_path],
                log_path=str(log_path),
                fence=fence,
                env={"HF": hf},
                private_options={"api-key": key},
                secrets=[hf],
            )
            try:
                assert oct(config.stat().st_mode & 0o777) == "0o600"
                assert json.loads(config.read_text()) == {"api-key": key}
                text = await asyncio.to_thread(
                    wait_until, lambda: "Bearer" in log_path.read_text() and log_path.read_text(), 10
                )
                assert oct(log_path.stat().st_mode & 0o777) == "0o600"
                assert "older log" not in text
                assert "api_key='REDACTED'" in text and "--api-key REDACTED" in text and "Bearer REDACTED" in text
                assert key not in text and hf not in text and "other-secret-value" not in text
                assert "abc.def" not in text
                members = session_members(spawned.pid)
                assert len(members) == 2  # the engine and its scrubber, one session
                scrubber = next(p for p in members if p != spawned.pid)
                cmdline = Path(f"/proc/{scrubber}/cmdline").read_bytes().decode()
                assert "sglang" not in cmdline.lower() and key not in cmdline
                assert proc_stat(scrubber)[2] == spawned.pid  # in the engine's group: a group KILL ends it
                assert await t.remove_engine_config(fence) and not config.exists()
                assert not await t.remove_engine_config(fence)
            finally:
                kill_group(spawned.pgid)

    asyncio.run(scenario())
    assert key not in log_path.read_text()


def test_a_private_config_under_home_reaches_the_engine_as_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """log_dir = "~/bb": the engine (with another cwd) gets the file's real path, not one it cannot open."""
    monkeypatch.setenv("HOME", str(tmp_path))
    log_path = tmp_path / "bb" / "engine.log"

    async def scenario() -> None:
        async with LocalTransport(name="box") as t:
            fence = HostFence.for_port("~/bb", 4242, 1)
            await t.claim_host(fence)
            spawned = await t.spawn_engine(
                [
                    PY,
                    "-c",
                    "import sys; print(sys.argv[1:], open(sys.argv[2]).read())",
                    "--config",
                    fence.engine_config_path,
                ],
                log_path="~/bb/engine.log",
                fence=fence,
                cwd="/",
                private_options={"api-key": "sk-home-key"},
            )
            assert spawned.log_path == str(log_path)
            await asyncio.to_thread(wait_until, lambda: not alive(spawned.pid), 10)
            assert await t.wait_log_written(spawned, 10)

    asyncio.run(scenario())
    real = tmp_path / "bb" / ".benchbot-fence-4242-engine.yaml"
    assert log_path.read_text() == f"['--config', '{real}'] {{\"api-key\": \"REDACTED\"}}\n"


def test_claim_removes_a_private_config_a_dead_job_left(make_transport: MakeTransport, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with make_transport() as t:
            old = await claimed(t, tmp_path, token=1)
            Path(old.engine_config_path).write_text('{"api-key": "sk-left-behind"}')
            await claimed(t, tmp_path, token=2)
            assert not Path(old.engine_config_path).exists()

    asyncio.run(scenario())


def test_actuator_source_never_names_the_engine() -> None:
    """The log scrubber's code is part of it and shows in `ps`: `ps | grep sglang` must not count it."""
    from workers.host.transport import ACTUATOR_SCRIPT

    assert "sglang" not in ACTUATOR_SCRIPT.lower()


def test_is_alive_counts_a_zombie_as_dead(make_transport: MakeTransport) -> None:
    zombie = subprocess.Popen(["true"])  # not waited for: it stays a zombie until we reap it
    try:
        wait_until(lambda: not alive(zombie.pid) and os.path.exists(f"/proc/{zombie.pid}"), 5)

        async def scenario() -> None:
            async with make_transport() as t:
                assert await t.is_alive(os.getpid())
                assert not await t.is_alive(zombie.pid)
                assert not await t.is_alive(unused_pid())

        asyncio.run(scenario())
    finally:
        zombie.wait()


def test_process_info_reports_argv_group_and_start_time(make_transport: MakeTransport, tmp_path: Path) -> None:
    argv = [PY, "-c", "import time; time.sleep(60)", "two words", "", "ünï"]

    async def scenario() -> None:
        async with make_transport() as t:
            before = time.time()
            spawned = await spawn(t, argv, str(tmp_path / "info.log"), tmp_path)
            try:
                info = await t.process_info(spawned.pid)
                assert info is not None
                assert (info.pid, info.pgid, info.argv) == (spawned.pid, spawned.pid, tuple(argv))
                assert info.start_ticks == spawned.start_ticks > 0
                # btime has 1 s resolution; allow for it and a slow machine.
                assert before - 2 <= info.start_time <= time.time() + 2
                assert await t.process_info(unused_pid()) is None
            finally:
                kill_group(spawned.pgid)

    asyncio.run(scenario())


# ---- listeners ---------------------------------------------------------------------------------------------


def test_listener_pid_finds_a_real_http_server(make_transport: MakeTransport, tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [PY, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: accepts(port), 10, what="http.server")

        async def scenario() -> None:
            async with make_transport() as t:
                assert await t.listener_pid(port) == server.pid
                assert await t.listener_pid(free_port()) is None

        asyncio.run(scenario())
    finally:
        server.kill()
        server.wait()


def test_listener_pid_sees_ipv6_listeners(make_transport: MakeTransport) -> None:
    try:
        sock = socket.socket(socket.AF_INET6)
        sock.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with sock:
        sock.listen()
        port = sock.getsockname()[1]

        async def scenario() -> int | None:
            async with make_transport() as t:
                return await t.listener_pid(port)

        assert asyncio.run(scenario()) == os.getpid()


def test_ssh_listener_fallback_without_ss_reads_proc(ssh_srv: SshTestServer) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]

        async def scenario() -> tuple[int | None, int | None]:
            async with ssh_srv.transport() as t:
                # The path taken on hosts without `ss` (or with one too old for -H).
                return await t._listener_pid_from_proc(port), await t._listener_pid_from_proc(free_port())

        assert asyncio.run(scenario()) == (os.getpid(), None)


# ---- logs and files ----------------------------------------------------------------------------------------


def test_read_log_follows_appends_truncation_and_split_characters(
    make_transport: MakeTransport, tmp_path: Path
) -> None:
    log = tmp_path / "engine.log"

    async def scenario() -> None:
        async with make_transport() as t:
            assert await t.read_log(str(log), 5) == ("", 5)  # not there yet
            log.write_bytes(b"first\n")
            assert await t.read_log(str(log)) == ("first\n", 6)
            with log.open("ab") as f:
                f.write("second ✓\n".encode())
            text, offset = await t.read_log(str(log), 6)
            assert (text, offset) == ("second ✓\n", log.stat().st_size)
            assert await t.read_log(str(log), offset) == ("", offset)
            # "✓" is 3 bytes: a read that ends inside it leaves it for the next call.
            cut = 6 + len("second ")
            assert await t.read_log(str(log), 6, max_bytes=len("second ") + 1) == ("second ", cut)
            assert await t.read_log(str(log), cut, max_bytes=100) == ("✓\n", offset)
            log.write_bytes(b"new run\n")  # truncated by a relaunch: start again from 0
            assert await t.read_log(str(log), offset) == ("new run\n", 8)

    asyncio.run(scenario())


def test_tail_returns_the_last_lines(make_transport: MakeTransport, tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text("".join(f"line {i}\n" for i in range(20000)))

    async def scenario() -> None:
        async with make_transport() as t:
            assert await t.tail(str(log), 3) == ["line 19997", "line 19998", "line 19999"]
            assert len(await t.tail(str(log))) == 40
            assert await t.tail(str(tmp_path / "missing.log")) == []

    asyncio.run(scenario())


def test_file_helpers_round_trip_odd_paths(make_transport: MakeTransport, tmp_path: Path) -> None:
    directory = tmp_path / "a b" / "$(touch CANARY)" / "c"
    path = str(directory / "pid file;*")

    async def scenario() -> None:
        async with make_transport() as t:
            assert not await t.file_exists(str(directory))
            await t.make_dirs(str(directory))
            assert await t.file_exists(str(directory))
            assert await t.read_file(path) is None
            await t.write_file(path, "1234\n✓ 'q'\n")
            assert await t.read_file(path) == "1234\n✓ 'q'\n"
            await t.write_file(path, "")
            assert await t.read_file(path) == ""
            assert await t.remove_file(path) is True
            assert await t.remove_file(path) is False
            assert not await t.file_exists(path)

    asyncio.run(scenario())
    # A relative `touch CANARY` would land in the command's cwd: ours, or the SSH login directory.
    assert not any(p.name == "CANARY" for p in tmp_path.rglob("*"))
    assert not Path("CANARY").exists() and not (Path.home() / "CANARY").exists()


# ---- SSH specifics -----------------------------------------------------------------------------------------


def test_unknown_host_key_is_refused_unless_explicitly_disabled(ssh_srv: SshTestServer, tmp_path: Path) -> None:
    wrong = tmp_path / "known_hosts"
    other = asyncssh.generate_private_key("ssh-ed25519")
    wrong.write_bytes(f"[127.0.0.1]:{ssh_srv.port} ".encode() + other.export_public_key())

    async def scenario() -> str:
        async with ssh_srv.transport(known_hosts=str(wrong)) as t:
            with pytest.raises(TransportError) as caught:
                await t.run(["true"], timeout=10)
        async with ssh_srv.transport(known_hosts=str(wrong), insecure_no_host_check=True) as t:
            assert (await t.run(["echo", "ok"], timeout=10)).stdout == "ok\n"
        return str(caught.value)

    message = asyncio.run(scenario())
    assert "host key" in message and f"127.0.0.1:{ssh_srv.port}" in message
    assert "PRIVATE" not in message


def test_connection_refused_names_the_host() -> None:
    port = free_port()

    async def scenario() -> str:
        async with SshTransport(
            "127.0.0.1",
            port,
            name="gpu-9",
            known_hosts=os.devnull,
            use_ssh_config=False,
            agent=False,
            connect_timeout=5,
        ) as t:
            with pytest.raises(TransportError) as caught:
                await t.run(["true"], timeout=5)
            return str(caught.value)

    message = asyncio.run(scenario())
    assert "gpu-9" in message and f"127.0.0.1:{port}" in message and "refused" in message


def test_reconnects_after_the_server_drops_the_connection(asyncssh_srv: AsyncsshServer) -> None:
    async def scenario() -> None:
        async with asyncssh_srv.transport() as t:
            assert (await t.run(["echo", "one"], timeout=10)).stdout == "one\n"
            await asyncio.to_thread(asyncssh_srv.drop_connections)
            assert (await t.run(["echo", "two"], timeout=10)).stdout == "two\n"

    asyncio.run(scenario())


def test_open_transport_follows_the_host_config(asyncssh_srv: AsyncsshServer) -> None:
    local_host = SimpleNamespace(
        name="box",
        transport="local",
        ssh_target=None,
        ssh_port=None,
        ssh_user=None,
        ssh_key=None,
        ssh_known_hosts=None,
        ssh_insecure_no_host_check=False,
        env={"BB_HOST_ENV": "L"},
    )
    ssh_host = asyncssh_srv.host_config("gpu-1", env={"BB_HOST_ENV": "S"})

    async def scenario() -> list[str]:
        seen = []
        for host in (local_host, ssh_host):
            async with open_transport(host) as t:
                assert t.host_label.startswith(host.name)
                result = await t.run(["printenv", "BB_HOST_ENV"], timeout=10)
                seen.append(result.stdout.strip())
        return seen

    assert asyncio.run(scenario()) == ["L", "S"]
    assert isinstance(open_transport(ssh_host), SshTransport)
    expected = f"gpu-1 (ssh {asyncssh_srv.username}@127.0.0.1:{asyncssh_srv.port})"
    assert open_transport(ssh_host).host_label == expected
    with pytest.raises(TransportError, match="unknown transport"):
        open_transport(SimpleNamespace(**{**vars(local_host), "transport": "telnet"}))
    with pytest.raises(TransportError, match="no ssh_target"):
        open_transport(SimpleNamespace(**{**vars(ssh_host), "ssh_target": None}))


def test_error_messages_never_show_secret_flag_values():
    from workers.host.command_text import describe_argv
    from workers.secrets import REDACTED

    text = describe_argv(
        ["python3", "-m", "sglang.launch_server", "--api-key", "sk-live-123", "--hf-token=hf_x", "--port", "30000"],
        limit=1000,
    )
    assert "sk-live-123" not in text and "hf_x" not in text
    assert f"--api-key {REDACTED}" in text and f"--hf-token={REDACTED}" in text and "--port 30000" in text
