"""Issue 29: with PostgreSQL's ``max_prepared_transactions = 0`` every T2 rolled back for ever while the bridge
showed ``[active]``. ``nsjms serve`` refuses such a server at start; ``enable_transaction`` refuses too (a server
restarted with 0 since), with the setting named in the log."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from idl.generated import BridgeTransactionMgmt as BTM
from router.bridge.bridge import BridgeImpl


class _Db:
    def __init__(self, value: int) -> None:
        self.value = value

    @contextmanager
    def unit_of_work(self) -> Iterator[Any]:
        value = self.value

        class _Conn:
            def execute(self, sql: str) -> Any:
                assert "max_prepared_transactions" in sql
                return type("Cursor", (), {"fetchone": lambda _self: (value,)})()

        yield _Conn()


def _bridge(value: int, validated: list[Any]) -> BridgeImpl:
    bridge = BridgeImpl.__new__(BridgeImpl)
    bridge.id = 5
    bridge.to_jms_direction = True
    bridge.t2_out = object()
    bridge.factory = type("Factory", (), {"rt": type("Rt", (), {"db": _Db(value)})()})()
    bridge.rt = bridge.factory.rt
    proxy = type("Proxy", (), {"validate_qos": lambda _self, props: validated.append(props)})()
    bridge._proxy_servant = lambda: proxy  # type: ignore[method-assign]
    bridge._lock = threading.RLock()
    return bridge


def test_enable_transaction_is_refused_when_postgres_cannot_prepare(caplog: pytest.LogCaptureFixture) -> None:
    validated: list[Any] = []
    with caplog.at_level(logging.WARNING), pytest.raises(BTM.UnsupportedTransaction):
        _bridge(0, validated)._check(10)
    assert "max_prepared_transactions is 0" in caplog.text and validated == []


def test_enable_transaction_goes_on_when_postgres_can_prepare() -> None:
    validated: list[Any] = []
    _bridge(64, validated)._check(10)
    assert len(validated) == 1
