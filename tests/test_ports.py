"""A picked port must stay free until its user binds it: no ``bind(0)`` elsewhere may be handed it."""

from __future__ import annotations

import socket

from workers import ports


def test_picked_ports_are_outside_the_kernels_ephemeral_range_and_never_repeat() -> None:
    low, high = ports.ephemeral_range()
    picked = [ports.free_local_port() for _ in range(50)]
    assert len(set(picked)) == len(picked)
    assert all(not low <= p <= high for p in picked), (low, high, picked)
    # what bind(0) hands out (the way test servers and stand-ins get a port) is inside the range
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert low <= s.getsockname()[1] <= high


def test_a_port_someone_listens_on_is_never_picked(monkeypatch) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", ports.free_local_port()))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        # force every random draw onto the taken port first: the picker must skip it
        draws = iter([taken] * 5)
        monkeypatch.setattr(ports.random.SystemRandom, "choice", lambda self, seq: next(draws, 12_345))
        ports._handed_out.discard(12_345)
        got = ports.free_local_port()
        assert got != taken
    finally:
        holder.close()
