"""The transport for the machine the worker runs on: asyncio subprocesses and /proc read in-process.

No shell ever sees an argument. Engines are started and signalled by the host-side actuator
(:mod:`workers.host.actuator`), run here with this interpreter exactly as it runs over SSH.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal as signal_module
import sys
from collections.abc import Mapping, Sequence
from typing import BinaryIO

from workers.errors import TransportError
from workers.host.command_text import failure_message, timeout_message
from workers.host.proc_text import (
    LISTENER_SCRIPT,
    ProcStat,
    decode,
    decode_complete_utf8,
    is_dead_state,
    parse_btime,
    parse_cmdline,
    parse_listener_output,
    parse_proc_stat,
    shell_returncode,
)
from workers.host.transport import (
    KILL_AFTER_S,
    QUICK_TIMEOUT_S,
    CommandResult,
    ProcessInfo,
    Transport,
    check_argv,
    check_positive,
)


class LocalTransport(Transport):
    """Commands on this machine, for a GPU host that is the worker's own box (and for demos and tests)."""

    def __init__(self, name: str = "local", env: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{name} (local)", env)
        self.host_python = sys.executable  # the host is this machine: no need to trust PATH's python3

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        check: bool = False,
    ) -> CommandResult:
        items = check_argv(argv)
        check_positive(timeout, "timeout")
        child_env = {**os.environ, **self._merged_env(env)}
        try:
            proc = await asyncio.create_subprocess_exec(
                *items,
                stdin=asyncio.subprocess.PIPE if input else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=child_env,
                # Its own process group, so a timeout can stop its children too; not its own session: on Linux a
                # new session is a new scheduling autogroup, which would shed the caller's nice (the observer's
                # probes, at nice 19, would take the CPU from the bot and Redis as equals).
                process_group=0,
            )
        except (FileNotFoundError, PermissionError) as exc:
            # The statuses a shell or `timeout` gives on an SSH host: 127 not found, 126 not executable.
            status = 127 if isinstance(exc, FileNotFoundError) else 126
            result = CommandResult(items, status, "", f"{items[0]}: {exc.strerror}\n")
            if check:
                raise TransportError(failure_message(self.host_label, result)) from None
            return result
        try:
            out, err = await asyncio.wait_for(proc.communicate(input.encode() if input else None), timeout)
        except TimeoutError:
            await _stop_group(proc)
            raise TransportError(timeout_message(self.host_label, items, timeout)) from None
        except BaseException:
            await _stop_group(proc)  # cancelled: leave nothing running behind us
            raise
        result = CommandResult(items, shell_returncode(proc.returncode), decode(out), decode(err))
        if check and result.returncode != 0:
            raise TransportError(failure_message(self.host_label, result))
        return result

    async def read_log(self, path: str, offset: int = 0, max_bytes: int = 1 << 20) -> tuple[str, int]:
        check_positive(max_bytes, "max_bytes")
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                start = offset if 0 <= offset <= size else 0
                f.seek(start)
                data = f.read(max_bytes)
        except FileNotFoundError:
            return "", offset
        except OSError as exc:
            raise TransportError(f"{self.host_label}: cannot read {path}: {exc.strerror}") from None
        text, used = decode_complete_utf8(data, max_bytes)
        return text, start + used

    async def tail(self, path: str, lines: int = 40) -> list[str]:
        check_positive(lines, "lines")
        try:
            with open(path, "rb") as f:
                return _last_lines(f, lines)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise TransportError(f"{self.host_label}: cannot read {path}: {exc.strerror}") from None

    async def is_alive(self, pid: int) -> bool:
        stat = _read_stat(pid)
        return stat is not None and not is_dead_state(stat.state)

    async def listener_pid(self, port: int) -> int | None:
        # The same /proc probe the SSH transport falls back to, so one implementation is tested everywhere.
        result = await self.run(
            [sys.executable, "-c", LISTENER_SCRIPT, str(int(port))], timeout=QUICK_TIMEOUT_S, check=True
        )
        return parse_listener_output(result.stdout)

    async def process_info(self, pid: int) -> ProcessInfo | None:
        try:
            with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            return None
        stat = _read_stat(pid)
        if stat is None:
            return None
        with open("/proc/stat") as f:
            btime = parse_btime(f.read())
        start = btime + stat.start_ticks / os.sysconf("SC_CLK_TCK")
        return ProcessInfo(pid, stat.pgid, parse_cmdline(cmdline), stat.start_ticks, start)

    async def file_exists(self, path: str) -> bool:
        return os.path.exists(path)

    async def read_file(self, path: str, max_bytes: int = 1 << 20) -> str | None:
        try:
            with open(path, "rb") as f:
                return decode(f.read(max_bytes))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TransportError(f"{self.host_label}: cannot read {path}: {exc.strerror}") from None

    async def write_file(self, path: str, text: str) -> None:
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise TransportError(f"{self.host_label}: cannot write {path}: {exc.strerror}") from None

    async def make_dirs(self, path: str) -> None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise TransportError(f"{self.host_label}: cannot create {path}: {exc.strerror}") from None

    async def remove_file(self, path: str) -> bool:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise TransportError(f"{self.host_label}: cannot remove {path}: {exc.strerror}") from None
        return True


async def _stop_group(proc: asyncio.subprocess.Process) -> None:
    """TERM the command's process group, KILL it after the grace period, and reap the command."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal_module.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), KILL_AFTER_S)
    # Children may linger after the leader died of TERM; KILL the whole group either way.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal_module.SIGKILL)
    await proc.wait()


def _read_stat(pid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return parse_proc_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None


def _last_lines(f: BinaryIO, count: int) -> list[str]:
    """Read backwards in blocks until ``count`` newlines are in hand, so a huge log costs one block."""
    end = f.seek(0, os.SEEK_END)
    data = b""
    pos = end
    while pos > 0 and data.count(b"\n") <= count:
        step = min(1 << 16, pos)
        pos -= step
        f.seek(pos)
        data = f.read(step) + data
    lines = decode(data).splitlines()
    return lines[-count:]
