"""router/cluster/release.py: what a hand-off's stop leaves running is waited on again at the next pass, and the
channel is released only once it has ended (review of this session: a route still in flight was kept as text, a
later pass found no thread of that name, and the channel was released with the accept still running: its event
reached PostgreSQL after the new owner had loaded the channel)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from router.channel.gate import Gate
from router.cluster.release import stop_channel, wait_pending


def test_an_accept_in_flight_at_the_stop_is_waited_on_again_until_it_ends() -> None:
    gate = Gate()
    channel = SimpleNamespace(gate=gate, consumer_admins={}, supplier_admins={}, oid=b"ch/7", destroyed=False)
    deactivated: list[Any] = []
    factory = SimpleNamespace(channels={7: channel}, rt=SimpleNamespace(deactivate=deactivated.append),
                              forget=lambda cid: None)
    bridges = SimpleNamespace(bridges={})
    inside, leave = threading.Event(), threading.Event()

    def route() -> None:
        with gate.passing():
            inside.set()
            leave.wait(30)

    t = threading.Thread(target=route)
    t.start()
    try:
        assert inside.wait(10)
        left = stop_channel(factory, bridges, 7, [], 0.05, lambda p, timeout: True)
        assert [p.label for p in left] == ["channel 7: accepts in flight"]
        again = wait_pending(left, time.monotonic() + 0.05)
        assert [p.label for p in again] == ["channel 7: accepts in flight"], "still running: not released"
        leave.set()
        assert wait_pending(again, time.monotonic() + 10) == [], "ended: the release may go on"
    finally:
        leave.set()
        t.join(10)


def test_a_phase_two_not_ended_at_the_stop_is_waited_on_again() -> None:
    done = threading.Event()
    supplier = SimpleNamespace(oid=b"p/1", _lock=threading.Lock(), closing=False, stop_event=threading.Event(),
                               _wake=lambda: None)
    admin = SimpleNamespace(proxies={1: supplier}, oid=b"a/1")
    channel = SimpleNamespace(gate=Gate(), consumer_admins={0: admin}, supplier_admins={}, oid=b"ch/7",
                              destroyed=False)
    factory = SimpleNamespace(channels={7: channel}, rt=SimpleNamespace(deactivate=lambda oid: None),
                              forget=lambda cid: None)
    left = stop_channel(factory, SimpleNamespace(bridges={}), 7, [], 0.05, lambda p, timeout: done.wait(timeout))
    assert [p.label for p in left] == ["proxy b'p/1': phase two of its routing transactions"]
    assert len(wait_pending(left, time.monotonic() + 0.05)) == 1
    done.set()
    assert wait_pending(left, time.monotonic() + 1) == []
