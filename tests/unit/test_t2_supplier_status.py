"""Every kind of connected proxy supplier whose EnableTransaction is TRUE but that delivers without a routing
transaction says so in ``nsjms status`` (``t2_unavailable`` with the reason), as docs/qos.md promises.

Before: only the plain push proxy suppliers did. A pull proxy supplier and an acknowledging proxy supplier (push
or pull) that inherited TRUE from their admin or channel (or hold a stored TRUE from an older version) delivered
without a transaction and their status said nothing about it.
"""

from __future__ import annotations

from typing import Any

import pytest

from router.channel import ack as A
from router.channel import proxies as P
from router.channel import qos as Q
from router.routing.registry import LocalEndpoints


class FakeT2:
    def local(self, ior: str) -> Any:
        return None


class Rt:
    t2 = FakeT2()

    endpoints = LocalEndpoints()                   # no servant of this node behind any reference


def _supplier(cls: type, *, enable: bool = True, connected: bool = True) -> Any:
    proxy: Any = object.__new__(cls)
    proxy.rt = Rt()
    proxy.oid, proxy.style = "ch/0/A/0/1", "PULL" if "Pull" in cls.__name__ else "PUSH"
    proxy.qos = {Q.ENABLE_TRANSACTION: enable}
    proxy.extra = {}
    proxy.connected = connected
    proxy.client, proxy.client_ior = None, "IOR:some-ordinary-client" if connected else None
    proxy.dead_lettered, proxy.last_dead_letter = 0, None
    if issubclass(cls, A._AckSupplierMixin):
        proxy.ack = A.AckState()
    return proxy


@pytest.mark.parametrize(("cls", "why"), [
    (P.StructuredProxyPullSupplierImpl, "pull proxy supplier"),
    (P.SequenceProxyPullSupplierImpl, "pull proxy supplier"),
    (A.StructuredProxyPushSupplierAckImpl, "acknowledging"),
    (A.SequenceProxyPushSupplierAckImpl, "acknowledging"),
    (A.StructuredProxyPullSupplierAckImpl, "pull proxy supplier"),
    (P.StructuredProxyPushSupplierImpl, "not a bridge endpoint"),
])
def test_a_connected_supplier_that_cannot_run_its_inherited_t2_shows_why(cls: type, why: str) -> None:
    status = _supplier(cls).status_extra()
    assert why in status["t2_unavailable"]


@pytest.mark.parametrize("cls", [P.StructuredProxyPullSupplierImpl, A.StructuredProxyPushSupplierAckImpl])
def test_nothing_is_shown_without_enable_transaction_or_before_a_client_connects(cls: type) -> None:
    assert "t2_unavailable" not in _supplier(cls, enable=False).status_extra()
    assert "t2_unavailable" not in _supplier(cls, connected=False).status_extra()


@pytest.mark.parametrize("cls", [P.StructuredProxyPullSupplierImpl, A.StructuredProxyPullSupplierAckImpl])
def test_a_pull_supplier_warns_once_when_it_starts_without_its_t2(cls: type,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    proxy = _supplier(cls)
    proxy.destroyed = False
    with caplog.at_level("WARNING", logger="nsjms"):
        proxy.start()
        proxy.start()
    said = [r.getMessage() for r in caplog.records if "delivering without a routing transaction" in r.getMessage()]
    assert len(said) == 1 and "pull proxy supplier" in said[0]
