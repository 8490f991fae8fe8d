"""SGLang's internal ports: with DP attention the engine waits for ``--port + 233`` and the next few to be free.

``PortArgs.init_new`` (0.5.9 server_args.py L5650-5693; 0.5.23 L818-887) derives ``dist_init_port``
from the HTTP port and checks each internal port with ``wait_port_available``: 30 tries (0.1 s apart
in 0.5.9, 1 s apart in 0.5.23), logging ``port N is in use. Waiting for i seconds for NAME to be
available. ...`` every fifth try after the tenth, then ``ValueError: NAME at N is not available in 30
seconds.`` A port freed in time is simply used: the wait line is recoverable, not a failure. (0.5.9
has a bug here: when it cannot find the process holding the port it logs a warning and then fails
on ``None.pid``; the simulator does the same.)
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workers.engines.contract import Contract, parse_version
from workers.sim import texts

ZMQ_TCP_PORT_DELTA = 233


@dataclass(frozen=True)
class Holder:
    """The process listening on a port, as psutil would describe it."""

    pid: int
    name: str
    cmdline: list[str]
    status: str


class InternalPortError(Exception):
    """The launcher dies on an internal port: ``exc_line`` is the traceback's last line."""

    def __init__(self, exc_line: str, logged: list[str]) -> None:
        super().__init__(exc_line)
        self.exc_line = exc_line
        self.logged = logged


def internal_ports(http_port: int) -> list[tuple[str, int]]:
    """The DP-attention ports checked in order (the random nccl port is left out)."""
    dist = http_port + ZMQ_TCP_PORT_DELTA
    base = dist + 1
    return [
        ("dist_init_port", dist),
        ("port_base", base),
        ("detokenizer_port", base + 1),
        ("rpc_port", base + 2),
        ("metrics_ipc_name", base + 3),
        ("scheduler_input_port", base + 4),
    ]


def is_port_available(port: int) -> bool:
    """SGLang's check: can this process bind and listen on ``("", port)``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", port))
            s.listen(1)
            return True
        except OSError:
            return False


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def find_holder(port: int) -> Holder | None:
    """The process listening on ``port`` (from /proc), or None when it cannot be seen."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    stat = (entry / "stat").read_text()
                    state = stat.rsplit(")", 1)[1].split()[0]
                    status = {"R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped", "Z": "zombie"}.get(
                        state, "sleeping"
                    )
                    cmdline = [p for p in (entry / "cmdline").read_bytes().decode(errors="replace").split("\0") if p]
                    name = (entry / "comm").read_text().strip()
                    return Holder(int(entry.name), name, cmdline, status)
        except OSError:
            continue
    return None


async def wait_internal_ports(
    contract: Contract, http_port: int, log: Callable[[str], None], stop: asyncio.Event
) -> None:
    """Wait like ``wait_port_available`` for each internal port; raise :class:`InternalPortError` on timeout."""
    new = parse_version(contract.version) >= (0, 5, 15)
    pause = 1.0 if new else 0.1
    tries = int(os.environ.get("SGLANG_WAIT_PORT_TIMEOUT", "30")) if new else 30
    for name, port in internal_ports(http_port):
        error_message = f"{name} at {port} is not available" if new else ""
        for i in range(tries):
            if stop.is_set():
                return
            if is_port_available(port):
                break
            if i > 10 and i % 5 == 0:
                holder = find_holder(port)
                if holder is None:
                    log(texts.say(contract, "internal_port_owner_unknown", port=port))
                    if not new:  # 0.5.9 goes on to read `process.pid` from None
                        raise InternalPortError("AttributeError: 'NoneType' object has no attribute 'pid'", [])
                else:
                    error_message = texts.say(
                        contract,
                        "internal_port_used_by",
                        port_name=name,
                        pid=holder.pid,
                        **{
                            "process.name()": holder.name,
                            "process.cmdline()": holder.cmdline,
                            "process.status()": holder.status,
                        },
                    )
                    log(
                        texts.say(
                            contract, "internal_port_wait", port=port, i=i, port_name=name, error_message=error_message
                        )
                    )
            await asyncio.sleep(pause)
        else:
            ports = dict(internal_ports(http_port))
            logged = texts.say(
                contract,
                "internal_port_in_use",
                dist_init_port=ports["dist_init_port"],
                port_base=ports["port_base"],
                detokenizer_port=ports["detokenizer_port"],
                nccl_port=0,
                scheduler_input_port=ports["scheduler_input_port"],
            )
            raise InternalPortError(
                "ValueError: "
                + texts.say(
                    contract,
                    "internal_port_timeout",
                    port_name=name,
                    port=port,
                    timeout_s=tries,
                    error_message=error_message,
                ),
                [logged],
            )
