"""Pick a TCP port on 127.0.0.1 for a server that will bind it later (a simulated engine, the embedded host).

One job: a port that stays free between the pick and its use. See :func:`free_local_port` for why
``bind(0)`` is not enough.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ``bind(port 0)`` and outgoing connections (Linux default 32768-60999)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nobody uses right now and that nobody else will be handed next.

    Why not ``bind(0)``: the port is used later (a simulated engine binds it at launch, seconds after the
    pick), and meanwhile any ``bind(0)`` in any process (an HTTP stand-in, a test server) may be handed
    the very same port by the kernel: CI once saw a launch refused because the test's own Slack stand-in
    had taken its engine's port. Ports below the kernel's ephemeral range are never handed out by
    ``bind(0)`` nor used by outgoing connections, so a port picked there stays free until its user binds
    it. A port is handed out once per process; the pick is random so concurrent processes rarely meet.
    """
    low, high = ephemeral_range()
    candidates = range(10_000, low) if low - 10_000 >= 1_000 else range(high + 1, 65_536)
    rng = random.SystemRandom()
    for _ in range(200 if len(candidates) else 0):
        port = rng.choice(candidates)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # a crowded host: fall back to the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
