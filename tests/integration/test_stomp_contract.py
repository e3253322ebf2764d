"""The transport contract (tests/unit/test_transport_contract.py) against a real ActiveMQ over STOMP.

Most tests use the session ``broker_url``; the outage tests restart a private broker of their own, so the shared
one is never disturbed.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from router.jms.transport import Transport, open_transport
from router.node.services import EmbeddedActiveMQ, free_port
from tests.unit.test_transport_contract import Make, TransportContract

pytestmark = pytest.mark.integration


def _factory(url: str, opened: list[Transport]) -> Make:
    def make(**opts: Any) -> Transport:
        opts.setdefault("receipt_timeout", 20.0)
        t = open_transport(url, **opts)
        t.connect(retry=True)          # a just-closed client id can linger on the broker for a moment
        opened.append(t)
        return t
    return make


@pytest.fixture(scope="module")
def private_broker() -> Iterator[EmbeddedActiveMQ]:
    base = Path(tempfile.mkdtemp(prefix="nsjms-stomp-outage-"))
    broker = EmbeddedActiveMQ(base, free_port(), free_port(), die_with_parent=True)
    try:
        broker.start()
    except Exception as exc:  # noqa: BLE001 - any start failure fails the test with its reason
        shutil.rmtree(base, ignore_errors=True)
        pytest.fail(f"cannot start a private ActiveMQ: {exc}", pytrace=False)
    yield broker
    broker.stop()
    shutil.rmtree(base, ignore_errors=True)


class TestStompContract(TransportContract):
    quiet = 1.0

    @pytest.fixture
    def make(self, broker_url: str) -> Iterator[Make]:
        opened: list[Transport] = []
        yield _factory(broker_url, opened)
        for t in opened:
            t.close()

    @pytest.fixture
    def outage(self, private_broker: EmbeddedActiveMQ) -> Iterator[tuple[Make, Callable[[], None]]]:
        opened: list[Transport] = []

        def restart() -> None:
            private_broker.stop()
            private_broker.start()
        yield _factory(private_broker.url, opened), restart
        for t in opened:
            t.close()

    def test_close_hears_no_disconnected_when_the_broker_drops_the_socket_first(self, make: Make) -> None:
        """close() sends DISCONNECT and ActiveMQ, once it has answered, closes the socket: when the receiver thread
        sees that close before close() marks the transport closed, the end is still planned (the state callback
        hears CLOSED, never DISCONNECTED: a bridge would count it as a broker outage). The race is forced: the
        goodbye returns only after the receiver has seen the broker's close."""
        from router.jms.transport import ConnectionState
        states: list[ConnectionState] = []
        t = make(on_state=states.append)
        goodbye = t._say_goodbye  # type: ignore[attr-defined]

        def goodbye_then_broker_close() -> None:
            goodbye()
            book = t._book  # type: ignore[attr-defined]
            deadline = time.monotonic() + 30
            while book.connected and time.monotonic() < deadline:     # the broker's close, seen by the receiver
                time.sleep(0.01)
            assert not book.connected, "ActiveMQ closes the socket after its DISCONNECT receipt"
            t._inbox.put((0, "state", "mark"))  # type: ignore[attr-defined]  # behind whatever the loss queued
            while "mark" not in states and time.monotonic() < deadline:
                time.sleep(0.01)
            states.remove("mark")  # type: ignore[arg-type]
        t._say_goodbye = goodbye_then_broker_close  # type: ignore[attr-defined]
        t.close()
        assert ConnectionState.DISCONNECTED not in states and states[-1] == ConnectionState.CLOSED
