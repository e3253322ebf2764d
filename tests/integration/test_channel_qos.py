"""QoS and admin properties of the channel (NS 2.5), checked from the outside with standard OMG clients.

Errors: ``UnsupportedQoS`` (naming the property and the Table 2-6 code) for ``set_qos``/``validate_qos``/
``create_channel``; ``CORBA::BAD_QOS`` for bad header QoS on push; ``AdminLimitExceeded`` and ``IMPL_LIMIT`` for
admin limits. After every error the channel must go on serving other clients (:func:`assert_serves`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest

from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin
import TimeBase

from stdclients import (
    Form,
    PushSupplierClient,
    StructuredPushConsumer,
    Style,
    boolean,
    connect_push_consumer,
    event_id,
    long_,
    make_event,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    prop,
    short,
    time_t,
    utc_in,
    wait_until,
)

pytestmark = pytest.mark.integration

S, Q = Form.STRUCTURED, Form.SEQUENCE
PUSH = Style.PUSH
_probe_ids = itertools.count(900_000)


def string_any(text: str) -> Any:
    return CORBA.Any(CORBA.TC_string, text)


def qos_errors(exc: Any) -> dict[str, Any]:
    """name -> code of an UnsupportedQoS / UnsupportedAdmin exception."""
    errs = exc.qos_err if hasattr(exc, "qos_err") else exc.admin_err
    return {e.name: e.code for e in errs}


def assert_unsupported(call: Any, name: str, code: Any | None) -> None:
    """``call()`` raises UnsupportedQoS naming ``name`` (with ``code`` unless None)."""
    with pytest.raises(CosNotification.UnsupportedQoS) as info:
        call()
    errs = qos_errors(info.value)
    assert name in errs, f"UnsupportedQoS does not name {name}: {errs}"
    if code is not None:
        assert errs[name] == code, f"{name}: expected {code}, got {errs[name]}"


def qos_of(obj: Any) -> dict[str, Any]:
    """The effective QoS of a channel, admin or proxy as name -> python value."""
    return {p.name: p.value.value() for p in obj.get_qos()}


def connect_consumer(admin: Any) -> tuple[Any, StructuredPushConsumer]:
    """A connected structured push consumer on ``admin``: (its proxy, its servant)."""
    proxy, _ = obtain_proxy_supplier(admin, S, PUSH)
    servant = StructuredPushConsumer()
    connect_push_consumer(proxy, S, servant)
    return proxy, servant


def connect_supplier(admin: Any) -> PushSupplierClient:
    """A connected structured push supplier on ``admin``."""
    proxy, _ = obtain_proxy_consumer(admin, S, PUSH)
    client = PushSupplierClient(proxy, S)
    client.connect()
    return client


def assert_serves(channel: Any) -> None:
    """A new supplier/consumer pair on the default admins moves three fresh events through ``channel``."""
    _, consumer = connect_consumer(channel.default_consumer_admin)
    supplier = connect_supplier(channel.default_supplier_admin)
    ids = [next(_probe_ids) for _ in range(3)]
    supplier.push_all([make_event(i) for i in ids])
    assert consumer.wait_for(3, 20), "the channel stopped serving after an error"
    assert sorted(consumer.ids()) == ids


MARKER = 2_000_000                   # ids from here on: marker events the tests push themselves (never asserted on)
_markers = itertools.count(MARKER)


def received(servant: StructuredPushConsumer) -> list[int]:
    """The ids ``servant`` received, markers left out."""
    return [i for i in servant.ids() if i < MARKER]


def arrived(servant: StructuredPushConsumer, n: int, timeout: float = 20.0) -> None:
    assert wait_until(lambda: len(received(servant)) >= n, timeout), f"{received(servant)}: fewer than {n} arrived"


def quiet(supplier: PushSupplierClient, *servants: StructuredPushConsumer, timeout: float = 20.0) -> None:
    """Push a marker event after everything else and wait until each of ``servants`` received it: a proxy delivers
    in its queue's order (FIFO among equal priorities), so an event delivered where it should not be (rejected,
    discarded, expired, a duplicate) would have arrived before the marker. A push refused because a
    RejectNewEvents queue has not counted its last delivery yet (IMP_LIMIT) is tried again."""
    marker = next(_markers)

    def pushed() -> bool:
        try:
            supplier.push_one(make_event(marker))
        except CORBA.IMP_LIMIT:
            return False
        return True

    assert wait_until(pushed, timeout), "the marker event was never accepted"
    def got(servant: StructuredPushConsumer) -> Callable[[], bool]:
        return lambda: marker in servant.ids()

    for servant in servants:
        assert wait_until(got(servant), timeout), "the marker event never arrived"


def receive_exactly(servant: StructuredPushConsumer, n: int, supplier: PushSupplierClient,
                    timeout: float = 20.0) -> list[int]:
    """Ids received once ``n`` arrived and then a marker pushed after them (:func:`quiet`): nothing else came."""
    arrived(servant, n, timeout)
    quiet(supplier, servant, timeout=timeout)
    return received(servant)


BAD_CHANNEL_QOS = [
    ("MaximumBatchSize", long_(0), CosNotification.BAD_VALUE),
    ("OrderPolicy", short(42), CosNotification.BAD_VALUE),
    ("DiscardPolicy", short(-3), CosNotification.BAD_VALUE),
    ("Priority", string_any("high"), CosNotification.BAD_TYPE),
    ("NoSuchQoSProperty", long_(1), CosNotification.BAD_PROPERTY),
    ("StartTime", utc_in(10), CosNotification.UNSUPPORTED_PROPERTY),  # per message only (Table 2-5)
]


@pytest.mark.parametrize(("name", "value", "code"), BAD_CHANNEL_QOS, ids=[c[0] for c in BAD_CHANNEL_QOS])
def test_create_channel_rejects_bad_qos(shared_factory: Any, name: str, value: Any, code: Any) -> None:
    before = set(shared_factory.get_all_channels())
    assert_unsupported(lambda: shared_factory.create_channel([prop(name, value)], []), name, code)
    assert set(shared_factory.get_all_channels()) == before, "a channel was created despite UnsupportedQoS"
    channel, _ = shared_factory.create_channel([], [])
    assert_serves(channel)


def test_create_channel_rejects_bad_admin_properties(shared_factory: Any) -> None:
    with pytest.raises(CosNotification.UnsupportedAdmin) as info:
        shared_factory.create_channel([], [prop("MaxQueueLength", string_any("lots"))])
    assert "MaxQueueLength" in qos_errors(info.value)


def test_set_qos_errors_on_channel_admin_and_proxy(shared_factory: Any) -> None:
    channel, _ = shared_factory.create_channel([], [])
    before = qos_of(channel).get("Priority")
    assert_unsupported(lambda: channel.set_qos([prop("Priority", short(5)), prop("OrderPolicy", short(42))]),
                       "OrderPolicy", CosNotification.BAD_VALUE)
    assert qos_of(channel).get("Priority") == before, "set_qos is not atomic: Priority changed despite the error"
    admin = channel.default_consumer_admin
    assert_unsupported(lambda: admin.set_qos([prop("EventReliability", short(CosNotification.Persistent))]),
                       "EventReliability", CosNotification.UNSUPPORTED_PROPERTY)  # channel or message only
    proxy, _ = obtain_proxy_supplier(admin, S, PUSH)
    assert_unsupported(lambda: proxy.set_qos([prop("StopTime", utc_in(10))]),
                       "StopTime", CosNotification.UNSUPPORTED_PROPERTY)  # message only
    assert_unsupported(lambda: proxy.set_qos([prop("DiscardPolicy", short(99))]),
                       "DiscardPolicy", CosNotification.BAD_VALUE)
    assert_unsupported(lambda: proxy.set_qos([prop("Timeout", string_any("soon"))]),
                       "Timeout", CosNotification.BAD_TYPE)
    seq_proxy, _ = obtain_proxy_supplier(admin, Q, PUSH)
    assert_unsupported(lambda: seq_proxy.set_qos([prop("MaximumBatchSize", long_(0))]),
                       "MaximumBatchSize", CosNotification.BAD_VALUE)
    proxy.set_qos([prop("Priority", short(7))])
    assert qos_of(proxy)["Priority"] == 7
    assert qos_of(admin).get("Priority") != 7 or before == 7, "set_qos on a proxy leaked to its admin"
    assert_serves(channel)


def _wrong_values() -> list[Any]:
    """Anys of types that are wrong for every standard header QoS field."""
    return [
        string_any("garbage"),
        CORBA.Any(CORBA.TC_double, 1.5),
        CORBA.Any(CosNotification._tc_EventType, CosNotification.EventType("x", "y")),
        CORBA.Any(CORBA.TC_float, -2.0),
        CORBA.Any(CORBA.TC_null, None),
    ]


BAD_HEADERS = [
    ("Priority", string_any("high")),
    ("EventReliability", CORBA.Any(TimeBase._tc_UtcT, TimeBase.UtcT(0, 0, 0, 0))),
    ("EventReliability", short(7)),
    ("Timeout", string_any("1s")),
    ("StartTime", long_(12)),
    ("StopTime", CORBA.Any(CORBA.TC_boolean, True)),
    ("Priority", short(-32768)),  # below LowestPriority
]


@pytest.mark.parametrize(("name", "value"), BAD_HEADERS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_HEADERS)])
def test_bad_header_qos_raises_bad_qos(shared_factory: Any, name: str, value: Any) -> None:
    channel, _ = shared_factory.create_channel([], [])
    _, consumer = connect_consumer(channel.default_consumer_admin)
    supplier = connect_supplier(channel.default_supplier_admin)
    with pytest.raises(CORBA.BAD_QOS):
        supplier.push_one(make_event(1, extra_header=[prop(name, value)]))
    supplier.push_one(make_event(2))
    assert receive_exactly(consumer, 1, supplier) == [2], "the rejected event was delivered or the good one was not"
    assert_serves(channel)


def test_random_garbage_header_anys_raise_bad_qos(shared_factory: Any) -> None:
    channel, _ = shared_factory.create_channel([], [])
    _, consumer = connect_consumer(channel.default_consumer_admin)
    supplier = connect_supplier(channel.default_supplier_admin)
    seq_proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Q, PUSH)
    seq_supplier = PushSupplierClient(seq_proxy, Q)
    seq_supplier.connect()
    names = ["Priority", "EventReliability", "Timeout", "StartTime", "StopTime"]
    for k, (name, value) in enumerate(itertools.product(names, _wrong_values())):
        client = supplier if k % 2 == 0 else seq_supplier
        with pytest.raises(CORBA.BAD_QOS):
            client.push_one(make_event(k, extra_header=[prop(name, value)]))
    supplier.push_one(make_event(4242))
    assert receive_exactly(consumer, 1, supplier) == [4242]


def test_validate_qos_and_validate_event_qos(shared_factory: Any) -> None:
    channel, _ = shared_factory.create_channel([], [])
    before = qos_of(channel)
    available = channel.validate_qos([prop("OrderPolicy", short(CosNotification.FifoOrder))])
    assert all(r.name != "OrderPolicy" for r in available), "validate_qos must not return requested properties"
    assert qos_of(channel) == before, "validate_qos applied something"
    assert_unsupported(lambda: channel.validate_qos([prop("MaximumBatchSize", long_(0))]),
                       "MaximumBatchSize", CosNotification.BAD_VALUE)
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, S, PUSH)
    available = proxy.validate_event_qos([prop("Priority", short(5)), prop("Timeout", time_t(1))])
    assert all(r.name not in ("Priority", "Timeout") for r in available)
    assert_unsupported(lambda: proxy.validate_event_qos([prop("Priority", string_any("x"))]),
                       "Priority", CosNotification.BAD_TYPE)
    assert_unsupported(lambda: proxy.validate_event_qos([prop("OrderPolicy", short(1))]), "OrderPolicy", None)
    assert_serves(channel)


def test_max_consumers_and_max_suppliers(shared_factory: Any) -> None:
    channel, _ = shared_factory.create_channel([], [prop("MaxConsumers", long_(2)), prop("MaxSuppliers", long_(1))])
    admin_props = {p.name: p.value.value() for p in channel.get_admin()}
    assert admin_props["MaxConsumers"] == 2 and admin_props["MaxSuppliers"] == 1
    cadmin = channel.default_consumer_admin
    first, c1 = connect_consumer(cadmin)
    _, c2 = connect_consumer(cadmin)
    other_admin, _ = channel.new_for_consumers(CosNotifyChannelAdmin.AND_OP)
    for admin in (cadmin, other_admin):  # the limit is the channel's, whichever admin asks
        with pytest.raises(CosNotifyChannelAdmin.AdminLimitExceeded) as info:
            admin.obtain_notification_push_supplier(CosNotifyChannelAdmin.STRUCTURED_EVENT)
        assert info.value.admin_property_err.name == "MaxConsumers"
    supplier = connect_supplier(channel.default_supplier_admin)
    with pytest.raises(CosNotifyChannelAdmin.AdminLimitExceeded) as info:
        channel.default_supplier_admin.obtain_notification_push_consumer(CosNotifyChannelAdmin.STRUCTURED_EVENT)
    assert info.value.admin_property_err.name == "MaxSuppliers"
    supplier.push_all([make_event(i) for i in range(10)])
    arrived(c1, 10)
    arrived(c2, 10)
    quiet(supplier, c1, c2)
    assert received(c1) == list(range(10)) and received(c2) == list(range(10))
    first.disconnect_structured_push_supplier()
    _, c3 = connect_consumer(cadmin)  # room again after a consumer left
    supplier.push_all([make_event(10)])
    assert receive_exactly(c3, 1, supplier) == [10]


def test_max_queue_length_with_reject_new_events(shared_factory: Any) -> None:
    channel, _ = shared_factory.create_channel([], [prop("MaxQueueLength", long_(5)),
                                                    prop("RejectNewEvents", boolean(True))])
    proxy, consumer = connect_consumer(channel.default_consumer_admin)
    proxy.suspend_connection()
    supplier = connect_supplier(channel.default_supplier_admin)
    supplier.push_all([make_event(i) for i in range(5)])
    with pytest.raises(CORBA.IMP_LIMIT):
        supplier.push_one(make_event(5))
    proxy.resume_connection()
    assert sorted(receive_exactly(consumer, 5, supplier)) == list(range(5))
    supplier.push_all([make_event(i) for i in range(6, 9)])  # the queue drained: pushes are accepted again
    assert sorted(receive_exactly(consumer, 8, supplier)) == [0, 1, 2, 3, 4, 6, 7, 8]


@pytest.mark.parametrize(("policy", "kept"), [
    (CosNotification.FifoOrder, list(range(5, 10))),  # Fifo discards the oldest
    (CosNotification.LifoOrder, list(range(0, 5))),  # Lifo discards the newest (the one that overflowed)
], ids=["fifo-drops-oldest", "lifo-drops-newest"])
def test_max_events_per_consumer_discard_policy(shared_factory: Any, policy: int, kept: list[int]) -> None:
    channel, _ = shared_factory.create_channel([prop("OrderPolicy", short(CosNotification.FifoOrder))], [])
    limited, limited_consumer = connect_consumer(channel.default_consumer_admin)
    limited.set_qos([prop("MaxEventsPerConsumer", long_(5)), prop("DiscardPolicy", short(policy))])
    _, free_consumer = connect_consumer(channel.default_consumer_admin)
    limited.suspend_connection()
    supplier = connect_supplier(channel.default_supplier_admin)
    supplier.push_all([make_event(i) for i in range(10)])
    arrived(free_consumer, 10)
    limited.resume_connection()
    arrived(limited_consumer, 5)
    quiet(supplier, free_consumer, limited_consumer)    # pushed once both queues drained: it discards nothing
    assert received(free_consumer) == list(range(10)), "discarding must affect only that consumer"
    assert received(limited_consumer) == kept


def test_timeout_expires_while_suspended(shared_factory: Any) -> None:
    channel, _ = shared_factory.create_channel([prop("OrderPolicy", short(CosNotification.FifoOrder))], [])
    proxy, consumer = connect_consumer(channel.default_consumer_admin)
    proxy.suspend_connection()
    supplier = connect_supplier(channel.default_supplier_admin)
    supplier.push_all([make_event(0, timeout_s=0.5), make_event(1), make_event(2, timeout_s=120)])
    time.sleep(2.0)       # stays: event 0's Timeout (0.5 s) must pass while the proxy is suspended (the QoS at stake)
    proxy.resume_connection()
    assert receive_exactly(consumer, 2, supplier) == [1, 2], "an expired event was delivered (or a live one lost)"
    assert_serves(channel)


def test_start_time_in_the_future_delays_delivery(shared_factory: Any) -> None:
    channel, _ = shared_factory.create_channel([prop("StartTimeSupported", boolean(True))], [])
    _, consumer = connect_consumer(channel.default_consumer_admin)
    supplier = connect_supplier(channel.default_supplier_admin)
    t0 = time.monotonic()
    supplier.push_all([make_event(0, start_in_s=3.0), make_event(1)])
    # not held back: the later event, without a StartTime, is delivered first, alone (no upper bound on when: a
    # loaded machine may be slow, the order is what the spec asks)
    assert consumer.wait_for(1, 10) and [event_id(e) for e in consumer.snapshot()[:1]] == [1], \
        "a later event was held back behind the StartTime event"
    assert consumer.wait_for(2, 15), "the StartTime event never arrived"
    assert [event_id(e) for e in consumer.snapshot()] == [1, 0]
    assert consumer.times[1] - t0 >= 2.9, "delivered before its StartTime"
