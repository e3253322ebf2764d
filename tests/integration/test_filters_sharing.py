"""Subscription and offer sharing (NS 2.6): suppliers learn what consumers want, consumers what is offered."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin
import CosNotifyComm
import CosNotifyComm__POA
import CosNotifyFilter

from stdclients import StructuredPushConsumer, wait_until

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0
QUIET_S = 1.0


def et(d: str, t: str) -> Any:
    return CosNotification.EventType(d, t)


def pairs(types: Any) -> list[tuple[str, str]]:
    return sorted((t.domain_name, t.type_name) for t in types)


class Changes:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[list[tuple[str, str]], list[tuple[str, str]]]] = []

    def record(self, added: Any, removed: Any) -> None:
        with self.lock:
            self.calls.append((pairs(added), pairs(removed)))


class SubscribingSupplier(CosNotifyComm__POA.StructuredPushSupplier, Changes):
    def __init__(self, refuse: bool = False) -> None:
        Changes.__init__(self)
        self.refuse = refuse

    def subscription_change(self, added: Any, removed: Any) -> None:
        if self.refuse:
            raise CORBA.NO_IMPLEMENT(0, CORBA.COMPLETED_NO)
        self.record(added, removed)

    def disconnect_structured_push_supplier(self) -> None:
        pass


class PublishedConsumer(StructuredPushConsumer, Changes):
    def __init__(self) -> None:
        StructuredPushConsumer.__init__(self)
        Changes.__init__(self)

    def offer_change(self, added: Any, removed: Any) -> None:
        self.record(added, removed)


def supplier_proxy(channel: Any, servant: Any) -> Any:
    p, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(
        CosNotifyChannelAdmin.STRUCTURED_EVENT)
    p = p._narrow(CosNotifyChannelAdmin.StructuredProxyPushConsumer)
    p.connect_structured_push_supplier(servant._this())
    return p


def consumer_proxy(admin: Any, servant: Any) -> Any:
    p, _ = admin.obtain_notification_push_supplier(CosNotifyChannelAdmin.STRUCTURED_EVENT)
    p = p._narrow(CosNotifyChannelAdmin.StructuredProxyPushSupplier)
    p.connect_structured_push_consumer(servant._this())
    return p


def test_suppliers_learn_subscriptions_from_filters_and_direct_calls(factory: Any) -> None:
    channel, _ = factory.create_channel([], [])
    supplier, refusing = SubscribingSupplier(), SubscribingSupplier(refuse=True)
    sp = supplier_proxy(channel, supplier)
    supplier_proxy(channel, refusing)                            # NO_IMPLEMENT is tolerated
    assert list(sp.obtain_subscription_types(CosNotifyChannelAdmin.ALL_NOW_UPDATES_ON)) == []
    admin = channel._get_default_consumer_admin()
    proxy = consumer_proxy(admin, StructuredPushConsumer())
    flt = channel._get_default_filter_factory().create_filter("EXTENDED_TCL")
    flt.add_constraints([CosNotifyFilter.ConstraintExp([et("Telecom", "Alarm")], "TRUE")])
    fid = proxy.add_filter(flt)
    assert wait_until(lambda: supplier.calls == [([("Telecom", "Alarm")], [])], TIMEOUT_S), supplier.calls
    flt.add_constraints([CosNotifyFilter.ConstraintExp([], "$x == 1")])     # all types: %ALL
    assert wait_until(lambda: len(supplier.calls) == 2, TIMEOUT_S)
    assert supplier.calls[1] == ([("", "%ALL")], [])
    admin.subscription_change([et("Road", "Closed")], [])
    assert wait_until(lambda: len(supplier.calls) == 3, TIMEOUT_S)
    assert supplier.calls[2] == ([("Road", "Closed")], [])
    proxy.remove_filter(fid)
    assert wait_until(lambda: len(supplier.calls) == 4, TIMEOUT_S)
    assert supplier.calls[3] == ([], [("", "%ALL"), ("Telecom", "Alarm")])
    assert pairs(sp.obtain_subscription_types(CosNotifyChannelAdmin.ALL_NOW_UPDATES_OFF)) == [("Road", "Closed")]
    admin.subscription_change([et("Sea", "Storm")], [])
    time.sleep(QUIET_S)
    assert len(supplier.calls) == 4, "updates were turned off"
    assert list(sp.obtain_subscription_types(CosNotifyChannelAdmin.NONE_NOW_UPDATES_ON)) == []
    admin.subscription_change([], [et("Sea", "Storm")])
    assert wait_until(lambda: len(supplier.calls) == 5, TIMEOUT_S)
    assert supplier.calls[4] == ([], [("Sea", "Storm")])


def test_consumers_learn_offers(factory: Any) -> None:
    channel, _ = factory.create_channel([], [])
    consumer = PublishedConsumer()
    proxy = consumer_proxy(channel._get_default_consumer_admin(), consumer)
    sp = supplier_proxy(channel, SubscribingSupplier())
    sp.offer_change([et("Telecom", "Alarm"), et("Telecom", "Clear")], [])
    assert wait_until(lambda: consumer.calls == [([("Telecom", "Alarm"), ("Telecom", "Clear")], [])], TIMEOUT_S)
    snapshot = proxy.obtain_offered_types(CosNotifyChannelAdmin.ALL_NOW_UPDATES_OFF)
    assert pairs(snapshot) == [("Telecom", "Alarm"), ("Telecom", "Clear")]
    sp.offer_change([], [et("Telecom", "Clear")])
    time.sleep(QUIET_S)
    assert len(consumer.calls) == 1
    with pytest.raises(CosNotifyComm.InvalidEventType):
        sp.offer_change([et("bad\x01", "x")], [])
