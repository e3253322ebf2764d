"""EnableTransaction on a proxy CONSUMER (JMS → channel) is accepted only where a routing transaction can run.

Before: ``set_qos``/``validate_qos`` of EnableTransaction = TRUE succeeded on a push-style proxy consumer, on a pull
proxy consumer whose supplier is not a JMS bridge pull sender of this node and on a node without T2, and the proxy
then pulled (or was pushed to) without a transaction, saying so only in a log line. Now they raise UnsupportedQoS
(UNAVAILABLE_VALUE), exactly as a proxy supplier does (router.channel.txdelivery.check_honoured); a pull proxy
consumer without a supplier yet accepts it, and its ``nsjms status`` shows ``t2_unavailable`` if the supplier it
later gets is not such a bridge.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from omniORB import CORBA

import CosEventChannelAdmin
import CosNotification

from router.channel import consumers as C
from router.channel import proxies as P
from router.channel import qos as Q
from router.channel import t2in
from router.routing.registry import LocalEndpoint, LocalEndpoints

BRIDGE_IOR = "IOR:the-bridge-pull-sender"


class PullSender:
    """A JMS bridge pull sender as the channel finds it in-process (router.bridge.t2in)."""

    def take_in_t2(self, *args: Any) -> Any:
        raise AssertionError("not called here")


class FakeT2:
    def __init__(self) -> None:
        self.registry: dict[str, Any] = {BRIDGE_IOR: PullSender()}

    def local(self, ior: str) -> Any:
        return self.registry.get(ior)

    def register_local(self, ior: str, target: Any) -> None:
        self.registry[ior] = target


class Rt:
    def __init__(self, t2: Any) -> None:
        self.t2 = t2
        self.persisted: list[dict[str, Any]] = []
        self.endpoints = LocalEndpoints()          # no servant of this node behind any reference


def _proxy(cls: type, *, t2: bool = True, ior: str | None = BRIDGE_IOR) -> Any:
    proxy: Any = object.__new__(cls)
    proxy.rt = Rt(FakeT2() if t2 else None)
    proxy.oid, proxy.id = "ch/0/S/0/1", 1
    proxy.style, proxy.form = ("PULL" if "Pull" in cls.__name__ else "PUSH"), (
        "SEQUENCE" if "Sequence" in cls.__name__ else "STRUCTURED")
    proxy.qos = {}
    proxy.qos_target = Q.Target(Q.Level.PROXY_CONSUMER, sequence=proxy.form == "SEQUENCE")
    proxy.admin = type("Admin", (), {"id": 0, "qos": {}})()
    persistent = {CosNotification.EventReliability: CosNotification.Persistent,
                  CosNotification.ConnectionReliability: CosNotification.Persistent}
    proxy.channel = type("Channel", (), {"id": 0, "qos": persistent, "admin_props": {}})()
    proxy.extra = {}
    proxy.connected = ior is not None
    proxy.client, proxy.client_ior = None, ior
    proxy.client_ref = lambda: None
    proxy._lock = threading.RLock()
    proxy._persist_qos = lambda qos: proxy.rt.persisted.append(qos)
    proxy.destroyed, proxy.closing, proxy.suspended = False, False, False
    proxy._update = lambda **cols: None
    proxy.start = lambda: None
    proxy._qos_changed = lambda: None
    proxy.dead_lettered, proxy.last_dead_letter, proxy._t2 = 0, None, None
    return proxy


def _enable(value: bool = True) -> list[Any]:
    return [CosNotification.Property(Q.ENABLE_TRANSACTION, CORBA.Any(CORBA.TC_boolean, value))]


def _refused(proxy: Any) -> None:
    for call in (proxy.validate_qos, proxy.set_qos):
        with pytest.raises(CosNotification.UnsupportedQoS) as err:
            call(_enable())
        assert [(e.name, e.code) for e in err.value.qos_err] == [
            (Q.ENABLE_TRANSACTION, CosNotification.UNAVAILABLE_VALUE)]
    assert proxy.qos.get(Q.ENABLE_TRANSACTION) is None and proxy.rt.persisted == [], "nothing stored"


@pytest.mark.parametrize("cls", [C.StructuredProxyPushConsumerImpl, C.SequenceProxyPushConsumerImpl,
                                 C.ProxyPushConsumerImpl])
def test_a_push_style_proxy_consumer_refuses_enable_transaction(cls: type) -> None:
    proxy = _proxy(cls)
    _refused(proxy)
    proxy.connected, proxy.client_ior = False, None
    _refused(proxy)                               # no supplier yet: still push-style, never a T2
    assert "push-style" in (t2in.unavailable_reason(proxy) or "")


@pytest.mark.parametrize("cls", [C.StructuredProxyPullConsumerImpl, C.SequenceProxyPullConsumerImpl])
def test_a_pull_proxy_consumer_of_another_supplier_refuses_enable_transaction(cls: type) -> None:
    proxy = _proxy(cls, ior="IOR:some-other-pull-supplier")
    _refused(proxy)
    assert t2in.unavailable_reason(proxy) == "its supplier is not a JMS bridge pull sender of this node"


@pytest.mark.parametrize("cls", [C.StructuredProxyPullConsumerImpl, C.SequenceProxyPullConsumerImpl])
def test_a_node_without_t2_refuses_enable_transaction(cls: type) -> None:
    _refused(_proxy(cls, t2=False))
    _refused(_proxy(cls, t2=False, ior=None))


@pytest.mark.parametrize("cls", [C.StructuredProxyPullConsumerImpl, C.SequenceProxyPullConsumerImpl])
def test_the_pull_proxy_of_a_bridge_of_this_node_accepts_enable_transaction(cls: type) -> None:
    proxy = _proxy(cls)
    proxy.validate_qos(_enable())
    proxy.set_qos(_enable())
    assert proxy.qos[Q.ENABLE_TRANSACTION] is True and proxy.rt.persisted
    assert "t2_unavailable" not in proxy.status_extra()
    proxy.set_qos(_enable(False))                 # turning it off is always accepted


def test_a_pull_proxy_without_a_supplier_accepts_it_and_the_status_shows_a_wrong_supplier_later() -> None:
    proxy = _proxy(C.StructuredProxyPullConsumerImpl, ior=None)
    proxy.set_qos(_enable())                      # not connected yet: decided when a supplier connects
    assert proxy.qos[Q.ENABLE_TRANSACTION] is True
    assert "t2_unavailable" not in proxy.status_extra()
    proxy.connected, proxy.client_ior = True, "IOR:some-other-pull-supplier"
    assert proxy.status_extra()["t2_unavailable"] == "its supplier is not a JMS bridge pull sender of this node"
    proxy.client_ior = BRIDGE_IOR
    assert "t2_unavailable" not in proxy.status_extra()


def test_inherited_enable_transaction_on_a_push_proxy_consumer_shows_in_its_status() -> None:
    proxy = _proxy(C.StructuredProxyPushConsumerImpl)
    proxy.admin.qos = {Q.ENABLE_TRANSACTION: True}       # set on its admin: the proxy cannot run a T2
    assert "push-style" in proxy.status_extra()["t2_unavailable"]
    proxy.admin.qos = {}
    assert proxy.status_extra() == {}


def test_a_push_proxy_consumer_that_cannot_honour_its_inherited_enable_transaction_warns_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """docs/qos.md: one WARNING per proxy that inherited TRUE but cannot run a T2 (before: none for this kind)."""
    proxy = _proxy(C.StructuredProxyPushConsumerImpl)
    with caplog.at_level("WARNING", logger="nsjms"):
        C.StructuredProxyPushConsumerImpl.start(proxy)          # EnableTransaction FALSE: nothing to say
        proxy.admin.qos = {Q.ENABLE_TRANSACTION: True}
        C.StructuredProxyPushConsumerImpl.start(proxy)
        C.StructuredProxyPushConsumerImpl.start(proxy)          # a second start (resume): said already
    said = [r.getMessage() for r in caplog.records if "without a routing transaction" in r.getMessage()]
    assert len(said) == 1 and "push-style" in said[0]


def test_the_servant_behind_the_suppliers_reference_is_found_and_registered() -> None:
    proxy = _proxy(C.StructuredProxyPullConsumerImpl, ior="IOR:another-spelling")
    sender = PullSender()
    proxy.rt.endpoints = LocalEndpoints(lambda ref: sender)     # the bridge registered its pull sender
    proxy.rt.endpoints.add(sender, LocalEndpoint(inbound=sender))
    assert t2in.local_target(proxy) is sender
    assert proxy.rt.t2.local("IOR:another-spelling") is sender
    proxy.set_qos(_enable())


# ---------------------------------------------------------------------------- set on the proxy, then a client connects
class Ref(CORBA.Object):
    """A client reference as the proxy's ``_connect`` sees it; ``rt.ior`` gives its IOR."""

    def __init__(self, ior: str) -> None:
        self.ior = ior


def _unconnected(cls: type) -> Any:
    proxy = _proxy(cls, ior=None)
    proxy.rt.ior = lambda ref: ref.ior
    return proxy


@pytest.mark.parametrize("cls", [C.StructuredProxyPullConsumerImpl, C.SequenceProxyPullConsumerImpl])
def test_enable_transaction_set_on_a_pull_proxy_refuses_a_supplier_that_cannot_take_part(cls: type) -> None:
    """Review finding (the product rule: never accepted and then ignored): EnableTransaction = TRUE set on a pull
    proxy consumer before it had a supplier was accepted, and a supplier that is not a JMS bridge of this node then
    connected and was pulled without a transaction. Now that connect raises CosEventChannelAdmin::TypeError (the
    proxy cannot work with that supplier) and nothing is connected."""
    proxy = _unconnected(cls)
    proxy.set_qos(_enable())
    with pytest.raises(CosEventChannelAdmin.TypeError):
        proxy._connect(Ref("IOR:some-other-pull-supplier"), required=True)
    assert not proxy.connected and proxy.client_ior is None
    proxy._connect(Ref(BRIDGE_IOR), required=True)       # the bridge of this node can
    assert proxy.connected and proxy.client_ior == BRIDGE_IOR


def test_enable_transaction_turned_off_again_accepts_any_supplier() -> None:
    proxy = _unconnected(C.StructuredProxyPullConsumerImpl)
    proxy.set_qos(_enable())
    proxy.set_qos(_enable(False))
    proxy._connect(Ref("IOR:some-other-pull-supplier"), required=True)
    assert proxy.connected


def test_inherited_enable_transaction_does_not_refuse_a_supplier() -> None:
    """Set on the admin or channel (the spec's default for its proxies, NJI Table 2-10 scope P, A, C): accepted; a
    proxy that cannot run a T2 shows ``t2_unavailable`` in its status instead (test above)."""
    proxy = _unconnected(C.StructuredProxyPullConsumerImpl)
    proxy.qos = {Q.ENABLE_TRANSACTION: True}               # inherited when the proxy was created
    proxy._connect(Ref("IOR:some-other-pull-supplier"), required=True)
    assert proxy.connected


def test_enable_transaction_set_on_a_push_proxy_supplier_refuses_a_consumer_that_is_no_bridge() -> None:
    proxy = _unconnected(P.StructuredProxyPushSupplierImpl)
    proxy.qos_target = Q.Target(Q.Level.PROXY_SUPPLIER, sequence=False)
    proxy.rt.t2.registry["IOR:bridge-endpoint"] = object()
    proxy.set_qos(_enable())
    with pytest.raises(CosEventChannelAdmin.TypeError):
        proxy._connect(Ref("IOR:an-ordinary-consumer"), required=True)
    assert not proxy.connected
    proxy._connect(Ref("IOR:bridge-endpoint"), required=True)
    assert proxy.connected


# ------------------------------------------------ TRUE set on a proxy that already inherited TRUE (review finding)
def _refused_over_inherited(proxy: Any) -> None:
    """EnableTransaction TRUE inherited (copied in from the admin or channel when the proxy was made); setting it
    on the proxy itself is checked like any other TRUE: refused, and the proxy's own flag stays unset."""
    proxy.qos = {Q.ENABLE_TRANSACTION: True}
    for call in (proxy.validate_qos, proxy.set_qos):
        with pytest.raises(CosNotification.UnsupportedQoS) as err:
            call(_enable())
        assert [(e.name, e.code) for e in err.value.qos_err] == [
            (Q.ENABLE_TRANSACTION, CosNotification.UNAVAILABLE_VALUE)]
    assert not proxy.extra.get(P.OWN_ENABLE_TRANSACTION) and proxy.rt.persisted == [], "nothing stored"


@pytest.mark.parametrize("cls", [C.StructuredProxyPushConsumerImpl, C.SequenceProxyPushConsumerImpl,
                                 C.ProxyPushConsumerImpl])
def test_true_set_over_an_inherited_true_on_a_push_proxy_consumer_is_refused_at_set_qos(cls: type) -> None:
    """Before: accepted (the check returned early on the inherited TRUE), the own flag set, and the supplier's
    ``connect_*_push_supplier`` then raised CosEventChannelAdmin::TypeError, which that operation does not declare
    (UNKNOWN at an omniORB client). Now set_qos refuses it (UnsupportedQoS, UNAVAILABLE_VALUE) and a supplier
    connects."""
    proxy = _unconnected(cls)
    _refused_over_inherited(proxy)
    proxy._connect(Ref("IOR:some-push-supplier"), required=False)
    assert proxy.connected


@pytest.mark.parametrize("cls", [P.StructuredProxyPullSupplierImpl, P.SequenceProxyPullSupplierImpl,
                                 P.ProxyPullSupplierImpl])
def test_true_set_over_an_inherited_true_on_a_pull_proxy_supplier_is_refused(cls: type) -> None:
    """Before: accepted, and the pull proxy supplier then served its consumer without a T2 (accept and ignore)."""
    proxy = _unconnected(cls)
    proxy.qos_target = Q.Target(Q.Level.PROXY_SUPPLIER, sequence=proxy.form == "SEQUENCE")
    _refused_over_inherited(proxy)


def test_true_set_over_an_inherited_true_on_a_pull_proxy_consumer_of_another_supplier_is_refused() -> None:
    proxy = _proxy(C.StructuredProxyPullConsumerImpl, ior="IOR:some-other-pull-supplier")
    _refused_over_inherited(proxy)


def test_true_set_over_an_inherited_true_where_a_t2_can_run_becomes_the_proxys_own() -> None:
    proxy = _unconnected(C.StructuredProxyPullConsumerImpl)
    proxy.qos = {Q.ENABLE_TRANSACTION: True}
    proxy.set_qos(_enable())
    assert proxy.extra[P.OWN_ENABLE_TRANSACTION] is True
    proxy.set_qos(_enable())                       # already its own: nothing more to check
    with pytest.raises(CosEventChannelAdmin.TypeError):
        proxy._connect(Ref("IOR:some-other-pull-supplier"), required=True)


def test_other_qos_on_a_proxy_that_inherited_true_it_cannot_run_is_accepted() -> None:
    """A request that leaves EnableTransaction alone keeps the inherited TRUE (``t2_unavailable`` in the status)."""
    proxy = _proxy(C.StructuredProxyPushConsumerImpl)
    proxy.qos = {Q.ENABLE_TRANSACTION: True}
    proxy.set_qos([CosNotification.Property(CosNotification.Priority, CORBA.Any(CORBA.TC_short, 3))])
    assert proxy.qos[CosNotification.Priority] == 3 and proxy.qos[Q.ENABLE_TRANSACTION] is True


@pytest.mark.parametrize("cls", [C.StructuredProxyPushConsumerImpl, P.StructuredProxyPullSupplierImpl])
def test_a_connect_that_does_not_declare_type_error_never_raises_it(cls: type) -> None:
    """An own TRUE stored before this check existed: the connect of a push proxy consumer or a pull proxy
    supplier (no TypeError in its signature) does not raise CosEventChannelAdmin::TypeError."""
    proxy = _unconnected(cls)
    proxy.qos, proxy.extra = {Q.ENABLE_TRANSACTION: True}, {P.OWN_ENABLE_TRANSACTION: True}
    proxy._connect(Ref("IOR:some-client"), required=False)
    assert proxy.connected
