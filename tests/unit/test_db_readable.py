"""``router.db.database._readable``: the poll of an idle pooled connection's socket (no round trip) that tells
whether the server already said goodbye. It must work for any descriptor: ``select.select`` refused one >= 1024
(FD_SETSIZE), so every statement of a node with many open sockets paid a check round trip."""

from __future__ import annotations

import os
import resource
import socket
from collections.abc import Iterator

import pytest

from router.db.database import _readable

HIGH_FD = 1500


class _Conn:
    """The one thing ``_readable`` asks of a connection: its socket's descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd


@pytest.fixture
def high_pair() -> Iterator[tuple[int, socket.socket]]:
    """A connected socket pair whose near end is descriptor ``HIGH_FD`` (the soft limit raised for it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= HIGH_FD:
        assert hard == resource.RLIM_INFINITY or hard > HIGH_FD, f"the hard fd limit {hard} is too low"
        resource.setrlimit(resource.RLIMIT_NOFILE, (HIGH_FD + 1, hard))
    near, far = socket.socketpair()
    try:
        os.dup2(near.fileno(), HIGH_FD)
        yield HIGH_FD, far
    finally:
        os.close(HIGH_FD)
        near.close()
        far.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_quiet_socket_above_fd_setsize_is_not_readable(high_pair: tuple[int, socket.socket]) -> None:
    fd, _far = high_pair
    assert not _readable(_Conn(fd))  # type: ignore[arg-type]      # before: True (select's ValueError)


def test_a_socket_above_fd_setsize_with_a_goodbye_waiting_is_readable(high_pair: tuple[int, socket.socket]) -> None:
    fd, far = high_pair
    far.sendall(b"E")
    assert _readable(_Conn(fd))  # type: ignore[arg-type]


def test_a_socket_above_fd_setsize_closed_by_the_peer_is_readable(high_pair: tuple[int, socket.socket]) -> None:
    fd, far = high_pair
    far.close()
    assert _readable(_Conn(fd))  # type: ignore[arg-type]


def test_a_quiet_low_socket_is_not_readable() -> None:
    near, far = socket.socketpair()
    with near, far:
        assert not _readable(_Conn(near.fileno()))  # type: ignore[arg-type]
        far.sendall(b"E")
        assert _readable(_Conn(near.fileno()))  # type: ignore[arg-type]
