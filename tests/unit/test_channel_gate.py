"""router/channel/gate.py: a hand-off closes a channel's gate and waits for the routes in flight."""

from __future__ import annotations

import threading

import pytest

from omniORB import CORBA

from router.channel.gate import Gate


def test_close_waits_for_the_routes_in_flight_and_refuses_new_ones_with_transient() -> None:
    gate = Gate()
    inside, leave = threading.Event(), threading.Event()

    def route() -> None:
        with gate.passing():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=route)
    t.start()
    assert inside.wait(10)
    assert gate.close(0.05) is False, "a route is still in flight"
    with pytest.raises(CORBA.TRANSIENT) as refused, gate.passing():
        pass
    assert refused.value.completed == CORBA.COMPLETED_NO, "nothing was stored: the client may push it again"
    leave.set()
    t.join(10)
    assert gate.close(1.0) is True
