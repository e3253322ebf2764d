"""tests/portcheck.py: NSJMS_TEST_SERVICES=auto with an engine in another network namespace fails at once."""

from __future__ import annotations

import socket

from portcheck import listening_ports, unpublished_problem

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000
"""
TCP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue
   0: 00000000000000000000000001000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 0 0 0
"""


def test_listening_ports_reads_listen_entries_only() -> None:
    assert listening_ports([TCP, TCP6]) == {8080, 80}


def test_a_port_published_elsewhere_is_reported_at_once() -> None:
    naps: list[float] = []
    why = unpublished_problem(5432, timeout=1.0, tables=lambda: [TCP], sleep=naps.append)
    assert why is not None and "127.0.0.1:5432 has no listener in this network namespace" in why
    assert "NSJMS_TEST_SERVICES=local" in why and sum(naps) <= 1.2


def test_a_listening_port_passes() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert unpublished_problem(sock.getsockname()[1], timeout=1.0) is None
