"""Bridge servants and store failures: a PostgreSQL failure in a BridgeFactory / Bridge operation reaches the client
as the channel's servants answer it (``TRANSIENT``/``COMPLETED_NO`` for an unreachable store, ``PERSIST_STORE`` for
a refused operation), never ``CORBA::UNKNOWN``; the bridge's state is unchanged by the failed operation."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from omniORB import CORBA

from router.bridge.bridge import BridgeFactoryImpl, BridgeImpl
from router.channel.boundary import MINOR_STORE_FAILED, MINOR_STORE_UNAVAILABLE
from router.db.errors import StoreError, StoreUnavailable


class FailingDb:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    @contextmanager
    def unit_of_work(self) -> Iterator[Any]:
        raise self.exc
        yield None  # pragma: no cover


def _bridge(exc: Exception) -> BridgeImpl:
    bridge = BridgeImpl.__new__(BridgeImpl)
    bridge.id, bridge.destroyed, bridge.started = 4, False, True
    bridge._lock = threading.RLock()
    bridge.stop_event = threading.Event()
    bridge.tx_events, bridge.tx_timeout = 0, 0
    bridge.to_jms_direction = True
    bridge.t2_out = None                 # enable_transaction checks the routing transaction support first:
    bridge._check = lambda events: None             # supported here, so that the store write is what fails
    rt = type("Rt", (), {"db": FailingDb(exc)})()
    bridge.factory = type("Factory", (), {"rt": rt})()
    bridge.row = type("Row", (), {"settings": {}})()
    return bridge


def test_every_idl_operation_of_the_bridge_servants_is_behind_the_store_boundary() -> None:
    for cls in (BridgeFactoryImpl, BridgeImpl):
        ops = list(cls._omni_op_d)
        assert ops
        unguarded = [op for op in ops if not getattr(getattr(cls, op), "_store_boundary", False)]
        assert unguarded == [], f"{cls.__name__}: {unguarded}"


def test_store_unavailable_at_stop_is_transient_completed_no_and_the_bridge_stays_started() -> None:
    bridge = _bridge(StoreUnavailable("no connection within 5 s"))
    with pytest.raises(CORBA.TRANSIENT) as err:
        bridge.stop_bridge()
    assert err.value.minor == MINOR_STORE_UNAVAILABLE and err.value.completed == CORBA.COMPLETED_NO
    assert bridge.started and not bridge.stop_event.is_set()


def test_a_refused_store_write_at_enable_transaction_is_persist_store_and_changes_nothing() -> None:
    bridge = _bridge(StoreError("relation does not exist"))
    with pytest.raises(CORBA.PERSIST_STORE) as err:
        bridge.enable_transaction(10, 1000)
    assert err.value.minor == MINOR_STORE_FAILED and err.value.completed == CORBA.COMPLETED_NO
    assert (bridge.tx_events, bridge.tx_timeout) == (0, 0)
