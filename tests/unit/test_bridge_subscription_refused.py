"""Issue 29: a subscription the broker refused (an ERROR frame: a selector, an authorization) showed the bridge as
``[active]`` while the push loop re-subscribed every few hundred milliseconds. Now the refusal is the bridge's state
(``[inactive] started, the broker refuses its subscription``) and the loop backs off up to a minute."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from router.bridge import flows as F
from router.bridge import jmsin
from router.cli.bridge import bridge_state
from router.jms.transport import BrokerError, TransportError


class _Bridge:
    id = 3

    def __init__(self) -> None:
        self.problems: list[Exception] = []
        self.reconnects = 0

    def note_broker_problem(self, exc: Exception) -> None:
        self.problems.append(exc)

    def reconnect_source(self) -> None:
        self.reconnects += 1


def _flow(subscribe: Any) -> F.JmsToChannel:
    dlq = F.DeadLetter(lambda: None, 3)  # type: ignore[arg-type,return-value]
    return F.JmsToChannel(_Bridge(), None, lambda m: m, dlq, subscribe)  # type: ignore[arg-type]


def test_a_refused_subscribe_is_recorded_until_one_works() -> None:
    answers: list[Any] = [BrokerError("javax.jms.InvalidSelectorException: bad"), "subscription"]

    def subscribe() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    flow = _flow(subscribe)
    with pytest.raises(BrokerError):
        flow.ensure_subscribed()
    assert flow.subscription_refused == "broker error: javax.jms.InvalidSelectorException: bad"
    assert flow.ensure_subscribed() == "subscription" and flow.subscription_refused is None


def test_the_state_names_the_refusal() -> None:
    row = {"state": "inactive", "started": True, "reason": "subscription refused"}
    assert bridge_state(row) == ("[inactive] started, the broker refuses its subscription (last error says why); "
                                 "retrying with back-off")


def test_the_push_loop_backs_off_to_a_minute_while_the_broker_refuses() -> None:
    flow = _flow(lambda: None)
    flow.subscription_refused = "broker error: refused"
    waits: list[float] = []

    class _Stop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(float(timeout or 0))
            if len(waits) >= 20:
                self.set()
            return self.is_set()

    loop = jmsin.PushSenderLoop(flow, None, False, lambda: 1, lambda: 0.0, False, _Stop())  # type: ignore[arg-type]

    def refused_round() -> None:
        raise TransportError("refused")

    loop._round = refused_round  # type: ignore[method-assign]
    loop.run()
    assert max(waits) == jmsin.REFUSED_MAX_BACKOFF and waits == sorted(waits)
    flow.subscription_refused = None            # a connection problem alone: the usual 5 s cap
    waits.clear()
    loop.stop = _Stop()
    loop.run()
    assert max(waits) == jmsin.MAX_BACKOFF
