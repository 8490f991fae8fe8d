"""The transport for a GPU host reached over SSH (asyncssh), one lazily (re)opened connection per object.

Every remote command is an argv list joined with ``shlex.quote`` on each part; where shell syntax is
needed (``&``, redirections) it lives in a constant script run as ``sh -c SCRIPT sh ARG...``, so user
text only ever arrives as positional parameters. Three asyncssh/OpenSSH traps shape the code:

- a client-side timeout does not stop the remote command, so every command runs under coreutils
  ``timeout --kill-after=2 N`` (which signals the command's whole process group);
- a background start only returns if nothing keeps the session's stdout/stderr open: the host-side
  actuator (:mod:`workers.host.actuator`) gives the engine ``/dev/null`` and a pipe to its log scrubber;
- OpenSSH ignores signal requests for root sessions, so signals are sent by that actuator, a command.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shlex
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from workers.errors import TransportError
from workers.host.asyncssh_quiet import asyncssh
from workers.host.command_text import describe_argv, failure_message, timeout_message
from workers.host.proc_text import (
    LISTENER_SCRIPT,
    decode,
    decode_complete_utf8,
    is_dead_state,
    parse_btime,
    parse_cmdline,
    parse_listener_output,
    parse_proc_stat,
    parse_ss_pids,
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

# Exit status our scripts use for "no such file", distinct from real failures.
_MISSING = 3

_READ_LOG_SCRIPT = """\
[ -e "$1" ] || exit 3
size=$(wc -c <"$1") || exit 1
start=$2
[ "$size" -ge "$start" ] || start=0
echo "$start"
tail -c "+$((start + 1))" -- "$1" | head -c "$3"
"""

_TAIL_SCRIPT = '[ -e "$1" ] || exit 3\nexec tail -n "$2" -- "$1"\n'
_READ_FILE_SCRIPT = '[ -e "$1" ] || exit 3\nexec head -c "$2" -- "$1"\n'
_WRITE_FILE_SCRIPT = 'cat >"$1"\n'
_REMOVE_SCRIPT = '[ -e "$1" ] || [ -L "$1" ] || exit 3\nexec rm -f -- "$1"\n'
_PROCESS_INFO_SCRIPT = """\
grep '^btime ' /proc/stat && getconf CLK_TCK && base64 -w0 "/proc/$1/cmdline" && echo && cat "/proc/$1/stat"
"""


class SshTransport(Transport):
    """Commands on a remote host over one asyncssh connection, opened on first use and after a drop."""

    def __init__(
        self,
        host: str,
        port: int = 22,
        *,
        username: str | None = None,
        key_path: str | None = None,
        known_hosts: str | None = None,
        insecure_no_host_check: bool = False,
        connect_timeout: float = 10.0,
        keepalive_interval: float = 15.0,
        use_ssh_config: bool = True,
        agent: bool = True,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        target = f"{username}@{host}" if username else host
        if port != 22:
            target += f":{port}"
        super().__init__(f"{name or host} (ssh {target})", env)
        self.host = host
        self.port = port
        self.username = username
        self.key_path = os.path.expanduser(key_path) if key_path else None
        self.known_hosts = os.path.expanduser(known_hosts) if known_hosts else None
        self.insecure_no_host_check = insecure_no_host_check
        self.connect_timeout = connect_timeout
        self.keepalive_interval = keepalive_interval
        self.use_ssh_config = use_ssh_config
        self.agent = agent
        self._conn: asyncssh.SSHClientConnection | None = None
        self._connect_lock: asyncio.Lock | None = None

    # ---- connection ------------------------------------------------------------------------------------

    def _connect_options(self) -> dict[str, Any]:
        """asyncssh.connect keywords; where we pass nothing, asyncssh's defaults (~/.ssh/...) apply."""
        options: dict[str, Any] = {
            "port": self.port,
            "connect_timeout": self.connect_timeout,
            "keepalive_interval": self.keepalive_interval,
        }
        if self.username:
            options["username"] = self.username
        if self.key_path:
            options["client_keys"] = [self.key_path]
        if not self.agent:
            options["agent_path"] = None
        if not self.use_ssh_config:
            options["config"] = None
        if self.insecure_no_host_check:
            options["known_hosts"] = None  # asyncssh: None disables host-key checking
        elif self.known_hosts:
            options["known_hosts"] = self.known_hosts
        return options

    async def _connection(self) -> asyncssh.SSHClientConnection:
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._conn is None or self._conn.is_closed():
                self._conn = None
                try:
                    self._conn = await asyncssh.connect(self.host, **self._connect_options())
                except Exception as exc:
                    raise TransportError(self._connect_error(exc)) from None
            return self._conn

    def _connect_error(self, exc: Exception) -> str:
        """A message naming the host and what to check; never key material."""
        where = f"{self.host}:{self.port}"
        prefix = f"{self.host_label}: cannot connect"
        if isinstance(exc, asyncssh.HostKeyNotVerifiable):
            source = self.known_hosts or "~/.ssh/known_hosts"
            return (
                f"{prefix}: the host key of {where} is not in {source} or does not match it "
                f"(if the host was reinstalled, verify and update it, e.g. `ssh-keyscan -p {self.port} "
                f"{self.host}`)"
            )
        if isinstance(exc, asyncssh.PermissionDenied):
            return f"{prefix}: login refused for {self.username or 'the default user'} (check ssh_user/ssh_key)"
        if isinstance(exc, asyncssh.KeyImportError):
            return f"{prefix}: the SSH key file {self.key_path} could not be loaded (format or passphrase)"
        if isinstance(exc, asyncssh.DisconnectError):
            return f"{prefix}: {where} closed the connection ({exc.reason})"
        if isinstance(exc, TimeoutError):
            return f"{prefix}: {where} did not answer within {self.connect_timeout:g}s"
        if isinstance(exc, ConnectionRefusedError):
            return f"{prefix}: connection refused by {where} (is sshd running on that port?)"
        if isinstance(exc, socket.gaierror):
            return f"{prefix}: unknown host name {self.host!r}"
        if isinstance(exc, FileNotFoundError):
            return f"{prefix}: file not found: {exc.filename}"
        if isinstance(exc, OSError):
            return f"{prefix}: {where}: {exc.strerror or type(exc).__name__}"
        return f"{prefix}: {type(exc).__name__}: {exc}"

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            await conn.wait_closed()

    # ---- commands --------------------------------------------------------------------------------------

    def remote_command(self, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None) -> str:
        """The exact command line sent: `timeout -k 2 N [env K=V ...] argv`, every part quoted."""
        parts = ["timeout", f"--kill-after={KILL_AFTER_S:g}", _seconds(timeout)]
        merged = self._merged_env(env)
        if merged:
            parts += ["env", *(f"{name}={value}" for name, value in merged.items())]
        parts += argv
        return " ".join(shlex.quote(part) for part in parts)

    async def _exec(
        self, argv: tuple[str, ...], timeout: float, env: Mapping[str, str] | None, input: str | None
    ) -> tuple[int, bytes, bytes, float]:
        """Run under remote `timeout`; returns (status, stdout, stderr, seconds). No exit-status policy."""
        command = self.remote_command(argv, timeout, env)
        started = time.monotonic()
        process = await self._open_process(command, bool(input))
        try:
            out, err = await asyncio.wait_for(
                process.communicate(input.encode() if input else None),
                # The remote `timeout` ends the command; this only guards against a hung connection.
                timeout + KILL_AFTER_S + max(self.connect_timeout, 5.0),
            )
        except TimeoutError:
            process.close()
            raise TransportError(
                f"{self.host_label}: no answer for `{describe_argv(argv)}`; the connection may be stuck"
            ) from None
        except (asyncssh.Error, OSError) as exc:
            process.close()
            raise TransportError(
                f"{self.host_label}: connection lost during `{describe_argv(argv)}` ({type(exc).__name__})"
            ) from None
        except BaseException:
            process.close()  # cancelled: the remote `timeout` still bounds the command
            raise
        code = process.returncode
        if code is None:
            raise TransportError(f"{self.host_label}: connection lost during `{describe_argv(argv)}`")
        return shell_returncode(code), out or b"", err or b"", time.monotonic() - started

    async def _open_process(self, command: str, has_input: bool) -> asyncssh.SSHClientProcess[bytes]:
        """Open a session channel; a dead connection is replaced once, safe because nothing ran yet."""
        stdin = asyncssh.PIPE if has_input else asyncssh.DEVNULL
        for attempt in (1, 2):
            conn = await self._connection()
            try:
                return await conn.create_process(command, stdin=stdin, encoding=None)
            except (asyncssh.ChannelOpenError, asyncssh.DisconnectError, OSError) as exc:
                self._conn = None
                conn.close()
                if attempt == 2:
                    raise TransportError(
                        f"{self.host_label}: could not open a session ({type(exc).__name__})"
                    ) from None
        raise AssertionError("unreachable")

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
        code, out, err, elapsed = await self._exec(items, timeout, env, input)
        # `timeout` exits 124 (TERM) or 137 (KILL after the grace) when it stopped the command.
        if code in (124, 137) and elapsed >= timeout:
            raise TransportError(timeout_message(self.host_label, items, timeout))
        result = CommandResult(items, code, decode(out), decode(err))
        if check and code != 0:
            raise TransportError(failure_message(self.host_label, result))
        return result

    async def _script(self, script: str, *args: str, input: str | None = None) -> tuple[int, bytes, bytes]:
        """Run one of our constant scripts with user text as positional parameters only."""
        code, out, err, _ = await self._exec(("sh", "-c", script, "sh", *args), QUICK_TIMEOUT_S, None, input)
        return code, out, err

    async def read_log(self, path: str, offset: int = 0, max_bytes: int = 1 << 20) -> tuple[str, int]:
        check_positive(max_bytes, "max_bytes")
        code, out, err = await self._script(_READ_LOG_SCRIPT, path, str(max(0, int(offset))), str(max_bytes))
        if code == _MISSING:
            return "", offset
        if code != 0:
            raise TransportError(f"{self.host_label}: cannot read {path}: {decode(err).strip()}")
        start_line, _, data = out.partition(b"\n")
        text, used = decode_complete_utf8(data, max_bytes)
        return text, int(start_line) + used

    async def tail(self, path: str, lines: int = 40) -> list[str]:
        check_positive(lines, "lines")
        code, out, err = await self._script(_TAIL_SCRIPT, path, str(int(lines)))
        if code == _MISSING:
            return []
        if code != 0:
            raise TransportError(f"{self.host_label}: cannot read {path}: {decode(err).strip()}")
        return decode(out).splitlines()

    async def is_alive(self, pid: int) -> bool:
        code, out, _, _ = await self._exec(("cat", f"/proc/{int(pid)}/stat"), QUICK_TIMEOUT_S, None, None)
        if code != 0:
            return False
        try:
            return not is_dead_state(parse_proc_stat(decode(out)).state)
        except (ValueError, IndexError):
            return False

    async def listener_pid(self, port: int) -> int | None:
        items = ("ss", "-ltnpH", f"sport = :{int(port)}")
        code, out, _, _ = await self._exec(items, QUICK_TIMEOUT_S, None, None)
        if code == 0:
            return parse_ss_pids(decode(out))
        return await self._listener_pid_from_proc(port)  # no `ss`, or one too old for -H

    async def _listener_pid_from_proc(self, port: int) -> int | None:
        result = await self.run(["python3", "-c", LISTENER_SCRIPT, str(int(port))], timeout=QUICK_TIMEOUT_S)
        if result.returncode != 0:
            raise TransportError(f"{self.host_label}: cannot find who listens on port {port} (needs `ss` or python3)")
        return parse_listener_output(result.stdout)

    async def process_info(self, pid: int) -> ProcessInfo | None:
        code, out, _ = await self._script(_PROCESS_INFO_SCRIPT, str(int(pid)))
        if code != 0:
            return None
        btime_line, tck_line, b64_line, stat_text = decode(out).split("\n", 3)
        try:
            stat = parse_proc_stat(stat_text)
        except (ValueError, IndexError):
            return None
        argv = parse_cmdline(base64.b64decode(b64_line))
        start = parse_btime(btime_line) + stat.start_ticks / int(tck_line)
        return ProcessInfo(int(pid), stat.pgid, argv, stat.start_ticks, start)

    async def file_exists(self, path: str) -> bool:
        code, _, _, _ = await self._exec(("test", "-e", path), QUICK_TIMEOUT_S, None, None)
        return code == 0

    async def read_file(self, path: str, max_bytes: int = 1 << 20) -> str | None:
        code, out, err = await self._script(_READ_FILE_SCRIPT, path, str(int(max_bytes)))
        if code == _MISSING:
            return None
        if code != 0:
            raise TransportError(f"{self.host_label}: cannot read {path}: {decode(err).strip()}")
        return decode(out)

    async def write_file(self, path: str, text: str) -> None:
        code, _, err = await self._script(_WRITE_FILE_SCRIPT, path, input=text)
        if code != 0:
            raise TransportError(f"{self.host_label}: cannot write {path}: {decode(err).strip()}")

    async def make_dirs(self, path: str) -> None:
        await self.run(["mkdir", "-p", "--", path], timeout=QUICK_TIMEOUT_S, check=True)

    async def remove_file(self, path: str) -> bool:
        code, _, err = await self._script(_REMOVE_SCRIPT, path)
        if code == _MISSING:
            return False
        if code != 0:
            raise TransportError(f"{self.host_label}: cannot remove {path}: {decode(err).strip()}")
        return True


def _seconds(timeout: float) -> str:
    """`timeout` takes decimals; never 0, which would mean no limit at all."""
    return f"{max(timeout, 0.001):.3f}".rstrip("0").rstrip(".")
