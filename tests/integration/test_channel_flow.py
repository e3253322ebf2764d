"""Event flow, ordering, navigation and connection rules of the channel, driven by standard OMG clients only.

Every flow moves ``N_EVENTS`` events and checks each arrives exactly once, with its content intact (see
``stdclients.event_id``), in the order the channel's OrderPolicy demands.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from omniORB import CORBA

import CosEventChannelAdmin
import CosNotification
import CosNotifyChannelAdmin

from stdclients import (
    AnyPushConsumer,
    Form,
    PullConsumerClient,
    PushSupplierClient,
    SequencePushConsumer,
    StructuredPushConsumer,
    Style,
    connect_pull_supplier,
    connect_push_consumer,
    event_id,
    long_,
    make_any,
    make_event,
    make_item,
    make_pull_supplier,
    make_push_consumer,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    prop,
    short,
    time_t,
    wait_until,
)

pytestmark = pytest.mark.integration

N_EVENTS = 1000
FLOW_TIMEOUT_S = 120.0
MARKER_ID = 999_999  # the event sent after the others to show that nothing more arrives

A, S, Q = Form.ANY, Form.STRUCTURED, Form.SEQUENCE
PUSH, PULL = Style.PUSH, Style.PULL

# (supplier form, supplier style) -> (consumer form, consumer style). Every proxy kind appears on both sides,
# plus the Table 2-2 translations Any->Structured and Structured->Any for both styles.
FLOWS = [
    ((A, PUSH), (A, PUSH)),
    ((S, PUSH), (S, PUSH)),
    ((Q, PUSH), (Q, PUSH)),
    ((A, PULL), (S, PULL)),
    ((S, PULL), (A, PULL)),
    ((Q, PULL), (Q, PULL)),
    ((S, PUSH), (A, PUSH)),
    ((A, PUSH), (S, PUSH)),
    ((Q, PUSH), (A, PULL)),
    ((A, PULL), (Q, PUSH)),
]


def queued(server: Any, pid: int) -> int | None:
    """Events queued for proxy supplier ``pid`` in the node's ``status.json`` (None until it shows that proxy)."""
    try:
        data = json.loads((server.state_dir / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    for channel in data.get("channels", []):
        for proxy in channel.get("proxy_suppliers", []):
            if proxy["id"] == pid:
                return int(proxy["queued"])
    return None


def fifo_channel(factory: Any, order: int = CosNotification.FifoOrder) -> Any:
    """A new channel whose proxies order their queues by ``order``."""
    channel, _ = factory.create_channel([prop("OrderPolicy", short(order))], [])
    return channel


class ConsumerEnd:
    """The consumer side of a flow: a push consumer servant or a pulling client, behind one interface."""

    def __init__(self, channel: Any, form: Form, style: Style) -> None:
        self.form, self.style = form, style
        self.proxy, self.pid = obtain_proxy_supplier(channel.default_consumer_admin, form, style)
        if style is Style.PUSH:
            self.servant: Any = make_push_consumer(form)
            connect_push_consumer(self.proxy, form, self.servant)
        else:
            self.client = PullConsumerClient(self.proxy, form)
            self.client.connect()
            self.pulled: list[Any] = []

    def receive(self, n: int, marker: Callable[[], int], timeout: float = FLOW_TIMEOUT_S) -> list[Any]:
        """Everything received before a marker event, once ``n`` events arrived (or the timeout passed).

        No quiet period: ``marker()`` sends one more event through the same path and returns its id. The channel
        delivers in queue order and a retried event keeps its place, so anything extra (a duplicate of an earlier
        event) arrives before the marker; what arrived before the marker is everything there is to see."""
        if self.style is Style.PUSH:
            self.servant.wait_for(n, timeout)
            mark = marker()
            assert wait_until(lambda: mark in self.servant.ids(), timeout), "the marker event did not arrive"
            items = list(self.servant.snapshot())
        else:
            self.pulled.extend(self.client.drain(n - len(self.pulled), timeout))
            mark = marker()
            deadline = time.monotonic() + timeout
            while mark not in [event_id(x) for x in self.pulled] and time.monotonic() < deadline:
                self.pulled.extend(self.client.drain(1, 1.0))
            items = list(self.pulled)
        ids = [event_id(x) for x in items]
        assert mark in ids, "the marker event did not arrive"
        return items[:ids.index(mark)] + items[ids.index(mark) + 1:]


def push_marker(client: Any, form: Form, marker_id: int) -> Callable[[], int]:
    """A ``marker`` for :meth:`ConsumerEnd.receive` that pushes event ``marker_id`` through ``client``."""

    def send() -> int:
        client.push_all([make_item(form, marker_id)])
        return marker_id

    return send


def source_marker(source: Any, form: Form, marker_id: int) -> Callable[[], int]:
    """A ``marker`` that lets a pull supplier (pulled by the channel) serve event ``marker_id`` next."""

    def send() -> int:
        source.add([make_item(form, marker_id)])
        return marker_id

    return send


def supply(channel: Any, form: Form, style: Style, items: list[Any]) -> Any:
    """Connect a supplier of the given kind and make it deliver ``items`` (pull suppliers are pulled by the channel)."""
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, form, style)
    if style is Style.PUSH:
        client = PushSupplierClient(proxy, form)
        client.connect()
        client.push_all(items)
        return client
    source = make_pull_supplier(form, items)
    connect_pull_supplier(proxy, form, source)
    return source


def assert_delivered_form(received: list[Any], supplier_form: Form, consumer_form: Form) -> None:
    """The received events have the consumer's form, translated per NS Table 2-2."""
    for item in received:
        if consumer_form is Form.ANY:
            assert isinstance(item, CORBA.Any)
            if supplier_form is not Form.ANY:  # Structured -> Any: an Any holding the StructuredEvent
                assert item.typecode().equivalent(CosNotification._tc_StructuredEvent)
        else:
            assert isinstance(item, CosNotification.StructuredEvent)
            if supplier_form is Form.ANY:  # Any -> Structured: %ANY, the Any in remainder_of_body
                assert item.header.fixed_header.event_type.type_name == "%ANY"


@pytest.mark.parametrize(("supplier", "consumer"), FLOWS,
                         ids=[f"{s[0].value}-{s[1].value}->{c[0].value}-{c[1].value}" for s, c in FLOWS])
def test_flow_exactly_once_fifo(shared_factory: Any, supplier: tuple[Form, Style],
                                consumer: tuple[Form, Style]) -> None:
    channel = fifo_channel(shared_factory)
    end = ConsumerEnd(channel, *consumer)
    if consumer == (Q, PUSH):
        end.proxy.set_qos([prop("MaximumBatchSize", long_(25)), prop("PacingInterval", time_t(0.2))])
    items = [make_item(supplier[0], i) for i in range(N_EVENTS)]
    handle = supply(channel, supplier[0], supplier[1], items)
    marker = (push_marker if supplier[1] is Style.PUSH else source_marker)(handle, supplier[0], MARKER_ID)
    received = end.receive(N_EVENTS, marker)
    assert [event_id(x) for x in received] == list(range(N_EVENTS)), "not exactly once in FIFO order"
    assert_delivered_form(received, supplier[0], consumer[0])


def test_factory_reachable_by_corbaloc_and_ior(nsjms_server: Any, client_orb: Any) -> None:
    endpoints = nsjms_server.endpoints
    assert endpoints["pid"] == nsjms_server.pid
    assert endpoints["event_channel_factory"]["ior"].startswith("IOR:")
    assert nsjms_server.corbaloc() == f"corbaloc::127.0.0.1:{nsjms_server.port}/NotifyEventChannelFactory"
    by_loc = client_orb.factory(nsjms_server.corbaloc())
    by_ior = client_orb.factory(nsjms_server.ior())
    channel, cid = by_loc.create_channel([], [])
    assert cid in by_ior.get_all_channels()
    same = by_ior.get_event_channel(cid)
    assert same.default_consumer_admin.MyID == 0
    assert channel.default_supplier_admin.MyID == 0


def test_sigterm_stops_cleanly(nsjms_server: Any) -> None:
    assert nsjms_server.stop() == 0


def test_navigation_ids_and_back_references(shared_factory: Any) -> None:
    channel, cid = shared_factory.create_channel([], [])
    _, cid2 = shared_factory.create_channel([], [])
    assert cid != cid2 and {cid, cid2} <= set(shared_factory.get_all_channels())
    assert cid in channel.MyFactory.get_all_channels()
    cadmin0, sadmin0 = channel.default_consumer_admin, channel.default_supplier_admin
    assert (cadmin0.MyID, sadmin0.MyID) == (0, 0)
    assert channel.get_consumeradmin(0).MyID == 0 and channel.get_supplieradmin(0).MyID == 0
    cadmin, caid = channel.new_for_consumers(CosNotifyChannelAdmin.AND_OP)
    sadmin, said = channel.new_for_suppliers(CosNotifyChannelAdmin.OR_OP)
    assert caid != 0 and said != 0
    assert caid in channel.get_all_consumeradmins() and said in channel.get_all_supplieradmins()
    assert cadmin.MyOperator == CosNotifyChannelAdmin.AND_OP and sadmin.MyOperator == CosNotifyChannelAdmin.OR_OP
    assert channel.get_consumeradmin(caid).MyID == caid
    assert cadmin.MyChannel.get_consumeradmin(caid).MyID == caid  # MyChannel leads back to the same channel
    push_s, pid1 = obtain_proxy_supplier(cadmin, S, PUSH)
    pull_s, pid2 = obtain_proxy_supplier(cadmin, Q, PULL)
    assert pid1 != pid2
    assert list(cadmin.push_suppliers) == [pid1] and list(cadmin.pull_suppliers) == [pid2]
    assert push_s.MyType == CosNotifyChannelAdmin.PUSH_STRUCTURED
    assert pull_s.MyType == CosNotifyChannelAdmin.PULL_SEQUENCE
    assert push_s.MyAdmin.MyID == caid
    assert cadmin.get_proxy_supplier(pid1).MyType == CosNotifyChannelAdmin.PUSH_STRUCTURED
    push_c, cpid = obtain_proxy_consumer(sadmin, A, PUSH)
    assert list(sadmin.push_consumers) == [cpid] and push_c.MyAdmin.MyID == said
    assert push_c.MyType == CosNotifyChannelAdmin.PUSH_ANY
    assert sadmin.get_proxy_consumer(cpid).MyType == CosNotifyChannelAdmin.PUSH_ANY


def test_not_found_exceptions(shared_factory: Any) -> None:
    channel, cid = shared_factory.create_channel([], [])
    with pytest.raises(CosNotifyChannelAdmin.ChannelNotFound):
        shared_factory.get_event_channel(cid + 100_000)
    with pytest.raises(CosNotifyChannelAdmin.AdminNotFound):
        channel.get_consumeradmin(99_999)
    with pytest.raises(CosNotifyChannelAdmin.AdminNotFound):
        channel.get_supplieradmin(99_999)
    with pytest.raises(CosNotifyChannelAdmin.ProxyNotFound):
        channel.default_consumer_admin.get_proxy_supplier(99_999)
    with pytest.raises(CosNotifyChannelAdmin.ProxyNotFound):
        channel.default_supplier_admin.get_proxy_consumer(99_999)


def test_connection_state_exceptions(shared_factory: Any) -> None:
    channel, _ = shared_factory.create_channel([], [])
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, S, PUSH)
    with pytest.raises(CosNotifyChannelAdmin.NotConnected):
        proxy.suspend_connection()
    with pytest.raises(CosNotifyChannelAdmin.NotConnected):
        proxy.resume_connection()
    connect_push_consumer(proxy, S, StructuredPushConsumer())
    with pytest.raises(CosEventChannelAdmin.AlreadyConnected):
        connect_push_consumer(proxy, S, StructuredPushConsumer())
    with pytest.raises(CosNotifyChannelAdmin.ConnectionAlreadyActive):
        proxy.resume_connection()
    proxy.suspend_connection()
    with pytest.raises(CosNotifyChannelAdmin.ConnectionAlreadyInactive):
        proxy.suspend_connection()
    proxy.resume_connection()
    supplier_proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, S, PUSH)
    client = PushSupplierClient(supplier_proxy, S)
    client.connect()
    with pytest.raises(CosEventChannelAdmin.AlreadyConnected):
        client.connect()


def _assert_gone(call: Any) -> None:
    """A call on a destroyed object raises OBJECT_NOT_EXIST."""
    with pytest.raises(CORBA.OBJECT_NOT_EXIST):
        call()


def test_destroy_proxy_admin_and_channel(shared_factory: Any) -> None:
    channel, cid = shared_factory.create_channel([], [])
    cadmin, caid = channel.new_for_consumers(CosNotifyChannelAdmin.OR_OP)
    proxy, pid = obtain_proxy_supplier(cadmin, S, PUSH)
    connect_push_consumer(proxy, S, StructuredPushConsumer())
    proxy.disconnect_structured_push_supplier()
    assert pid not in cadmin.push_suppliers
    with pytest.raises(CosNotifyChannelAdmin.ProxyNotFound):
        cadmin.get_proxy_supplier(pid)
    _assert_gone(lambda: proxy.MyType)
    proxy2, _ = obtain_proxy_supplier(cadmin, A, PULL)
    cadmin.destroy()
    with pytest.raises(CosNotifyChannelAdmin.AdminNotFound):
        channel.get_consumeradmin(caid)
    _assert_gone(lambda: proxy2.MyType)
    _assert_gone(lambda: cadmin.MyID)
    channel.destroy()
    assert cid not in shared_factory.get_all_channels()
    with pytest.raises(CosNotifyChannelAdmin.ChannelNotFound):
        shared_factory.get_event_channel(cid)
    _assert_gone(lambda: channel.default_consumer_admin)


def test_consumer_raising_disconnected_destroys_its_proxy(shared_factory: Any) -> None:
    channel = fifo_channel(shared_factory)
    admin = channel.default_consumer_admin
    bad_proxy, bad_pid = obtain_proxy_supplier(admin, S, PUSH)
    bad = StructuredPushConsumer()
    bad.raise_disconnected = True
    connect_push_consumer(bad_proxy, S, bad)
    good_end = ConsumerEnd(channel, S, PUSH)
    client = PushSupplierClient(obtain_proxy_consumer(channel.default_supplier_admin, S, PUSH)[0], S)
    client.connect()
    client.push_all([make_event(i) for i in range(5)])
    assert wait_until(lambda: bad_pid not in admin.push_suppliers, 15), "proxy survived its consumer's Disconnected"
    with pytest.raises(CosNotifyChannelAdmin.ProxyNotFound):
        admin.get_proxy_supplier(bad_pid)
    _assert_gone(lambda: bad_proxy.MyType)
    assert [event_id(x) for x in good_end.receive(5, push_marker(client, S, MARKER_ID), 15)] == list(range(5))


@pytest.mark.parametrize("order", [CosNotification.FifoOrder, CosNotification.PriorityOrder], ids=["fifo", "priority"])
def test_order_of_events_queued_while_suspended(nsjms_server: Any, factory: Any, order: int) -> None:
    channel = fifo_channel(factory, order)
    end = ConsumerEnd(channel, S, PUSH)
    end.proxy.suspend_connection()
    prios = [((i * 7) % 5) - 2 for i in range(300)]  # -2..2, interleaved
    client = PushSupplierClient(obtain_proxy_consumer(channel.default_supplier_admin, S, PUSH)[0], S)
    client.connect()
    client.push_all([make_event(i, priority=p) for i, p in enumerate(prios)])  # returns once queued
    assert wait_until(lambda: queued(nsjms_server, end.pid) == 300, 30), "the node's status shows all 300 queued"
    assert end.servant.count() == 0, "events were delivered to a suspended consumer"
    end.proxy.resume_connection()
    got = [event_id(x) for x in end.receive(300, push_marker(client, S, MARKER_ID), 60)]
    if order == CosNotification.FifoOrder:
        assert got == list(range(300))
    else:  # highest priority first, FIFO within equal priority
        assert got == sorted(range(300), key=lambda i: (-prios[i], i))


def test_sequence_push_batch_size_and_pacing(nsjms_server: Any, factory: Any) -> None:
    channel = fifo_channel(factory)
    end = ConsumerEnd(channel, Q, PUSH)
    end.proxy.set_qos([prop("MaximumBatchSize", long_(10)), prop("PacingInterval", time_t(0.0))])
    client = PushSupplierClient(obtain_proxy_consumer(channel.default_supplier_admin, S, PUSH)[0], S)
    client.connect()
    client.push_all([make_event(i) for i in range(5)])
    # PacingInterval 0: no time spent collecting (NS 2.5.5), so the five are delivered although the batch is short
    # (before the fix they stayed queued for ever).
    servant: SequencePushConsumer = end.servant
    assert servant.wait_for(5, FLOW_TIMEOUT_S), "PacingInterval=0: a partial batch was never sent"
    # What is queued when the proxy dispatches goes out in batches of at most MaximumBatchSize: queue 995 while
    # suspended, then resume.
    end.proxy.suspend_connection()
    client.push_all([make_event(i) for i in range(5, 1000)])
    assert wait_until(lambda: queued(nsjms_server, end.pid) == 995, 30), "the node's status shows all 995 queued"
    first = len(servant.batches)
    end.proxy.resume_connection()
    assert servant.wait_for(1000, FLOW_TIMEOUT_S)
    assert [size for _, size in servant.batches[first:]] == [10] * 99 + [5]
    end.proxy.set_qos([prop("PacingInterval", time_t(0.5))])
    client.push_all([make_event(i) for i in range(1000, 1003)])
    assert servant.wait_for(1003, 10), "a partial batch was not sent after PacingInterval"
    assert servant.batches[-1][1] == 3, "the three events should be collected into one batch"
    assert servant.ids() == list(range(1003))


def test_sequence_pull_obeys_max_batch_size(shared_factory: Any) -> None:
    channel = fifo_channel(shared_factory)
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Q, PULL)
    proxy.set_qos([prop("MaximumBatchSize", long_(10))])
    puller = PullConsumerClient(proxy, Q, max_number=100)
    puller.connect()
    client = PushSupplierClient(obtain_proxy_consumer(channel.default_supplier_admin, S, PUSH)[0], S)
    client.connect()
    client.push_all([make_event(i) for i in range(25)])
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < 25 and time.monotonic() < deadline:
        batch = puller.try_pull()
        assert len(batch) <= 10, f"try_pull_structured_events returned {len(batch)} > MaximumBatchSize"
        got.extend(batch)
        time.sleep(0.01 if not batch else 0)
    assert [event_id(x) for x in got] == list(range(25))


def test_event_service_style_admins_and_proxies(shared_factory: Any) -> None:
    channel = fifo_channel(shared_factory)
    cadmin = channel.for_consumers()
    push_proxy = cadmin.obtain_push_supplier()
    consumer = AnyPushConsumer()
    push_proxy.connect_push_consumer(consumer._this())
    pull_proxy = cadmin.obtain_pull_supplier()
    pull_proxy.connect_pull_consumer(None)  # a pull consumer may connect with a nil reference
    supplier_proxy = channel.for_suppliers().obtain_push_consumer()
    supplier_proxy.connect_push_supplier(None)
    for i in range(50):
        supplier_proxy.push(make_any(i))
    assert consumer.wait_for(50, 30)
    assert consumer.ids() == list(range(50))
    pulled: list[int] = []
    deadline = time.monotonic() + 30
    while len(pulled) < 50 and time.monotonic() < deadline:
        value, has = pull_proxy.try_pull()
        if has:
            pulled.append(event_id(value))
        else:
            time.sleep(0.01)
    assert pulled == list(range(50))
    with pytest.raises(CosEventChannelAdmin.AlreadyConnected):
        push_proxy.connect_push_consumer(AnyPushConsumer()._this())


def test_blocking_pull_answers_transient_before_the_client_call_timeout(shared_factory: Any) -> None:
    """A blocking pull with nothing to pull answers TRANSIENT (COMPLETED_NO) after the channel's wait limit, within
    the client's call timeout (30 s here): before, the client timed out and the abandoned pull kept running."""
    from router.channel.boundary import MINOR_PULL_WAIT_OVER

    channel = fifo_channel(shared_factory)
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, S, PULL)
    PullConsumerClient(proxy, S).connect()
    with pytest.raises(CORBA.TRANSIENT) as info:
        proxy.pull_structured_event()
    assert info.value.minor == MINOR_PULL_WAIT_OVER and info.value.completed == CORBA.COMPLETED_NO
    client = PushSupplierClient(obtain_proxy_consumer(channel.default_supplier_admin, S, PUSH)[0], S)
    client.connect()
    client.push_all([make_event(1)])
    assert event_id(proxy.pull_structured_event()) == 1     # nothing was taken by the pull that answered TRANSIENT
