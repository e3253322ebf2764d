"""Event acknowledgement (NJI 4.2) on a real node: Ack proxies, SequenceNumbers, retries, stop/reset, crash.

Clients use the standard OMG stubs plus the standard acknowledgement stubs (``CosNotifyChannelAdminAck``,
``CosNotifyCommAck``: OMG IDL, generated into ``idl.generated``); nothing else from the project.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin
import CosNotifyComm__POA

from idl.generated import CosNotifyChannelAdminAck, CosNotifyCommAck, CosNotifyCommAck__POA

from stdclients import event_id, header_value, long_, make_event, prop, short, time_t, wait_until

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0
INTERVAL_S = 0.3
RETRIES = 3


def combination4(retries: int = RETRIES, interval: float = INTERVAL_S) -> list[Any]:
    """Persistent/Persistent/Acknowledgment (NJI Table 4-1, combination 4)."""
    return [prop("EventReliability", short(CosNotification.Persistent)),
            prop("ConnectionReliability", short(CosNotification.Persistent)),
            prop("DeliveryReliability", short(CosNotifyCommAck.Acknowledgment)),
            prop("Retries", long_(retries)), prop("RetryInterval", time_t(interval))]


class AckConsumer(CosNotifyComm__POA.StructuredPushConsumer):
    """Records (SequenceNumber, event id) per push; acknowledges according to ``policy``; dedups by number."""

    def __init__(self, policy: str = "each", fail: bool = False) -> None:
        self.policy = policy            # each | never | bulk:<n>
        self.fail = fail                # raise TRANSIENT instead of accepting
        self.proxy: Any = None
        self.lock = threading.Lock()
        self.pushes: list[tuple[int, int]] = []
        self.unique: dict[int, int] = {}        # SequenceNumber -> event id (duplicates recognised)
        self.pending: list[int] = []
        self.failures = 0

    def push_structured_event(self, ev: Any) -> None:
        if self.fail:
            with self.lock:
                self.failures += 1
            raise CORBA.TRANSIENT(0, CORBA.COMPLETED_NO)
        sn = header_value(ev, "SequenceNumber")
        assert isinstance(sn, int)
        with self.lock:
            self.pushes.append((sn, event_id(ev)))
            if sn in self.unique:
                assert self.unique[sn] == event_id(ev), "a SequenceNumber named two different events"
            self.unique[sn] = event_id(ev)
            self.pending.append(sn)
            batch = self._due()
        if batch:
            threading.Thread(target=self._ack, args=(batch,), daemon=True).start()

    def _due(self) -> list[int]:
        if self.policy == "each":
            batch, self.pending = self.pending, []
            return batch
        if self.policy.startswith("bulk:") and len(self.pending) >= int(self.policy[5:]):
            batch, self.pending = self.pending, []
            return batch
        return []

    def _ack(self, batch: list[int]) -> None:
        self.proxy.acknowledge(batch)

    def ack_all_pending(self) -> None:
        with self.lock:
            batch, self.pending = self.pending, []
        if batch:
            self.proxy.acknowledge(batch)

    def disconnect_structured_push_consumer(self) -> None:
        pass

    def offer_change(self, added: Any, removed: Any) -> None:
        pass

    def count(self) -> int:
        with self.lock:
            return len(self.pushes)


def setup(factory: Any, consumer: AckConsumer, qos: list[Any] | None = None) -> tuple[Any, Any, Any]:
    channel, _ = factory.create_channel(qos if qos is not None else combination4(), [])
    proxy, _ = channel._get_default_consumer_admin().obtain_notification_push_supplier(
        CosNotifyChannelAdmin.STRUCTURED_EVENT)
    ack_proxy = proxy._narrow(CosNotifyChannelAdminAck.StructuredProxyPushSupplierAck)
    assert ack_proxy is not None, "DeliveryReliability=Acknowledgment gives an Ack proxy supplier"
    consumer.proxy = ack_proxy
    ack_proxy.connect_structured_push_consumer(consumer._this())
    sp, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(
        CosNotifyChannelAdmin.STRUCTURED_EVENT)
    sp = sp._narrow(CosNotifyChannelAdmin.StructuredProxyPushConsumer)
    sp.connect_structured_push_supplier(None)
    return channel, ack_proxy, sp


def status(client_orb: Any, server: Any) -> dict[str, str]:
    host_port = server.corbaloc().split("::", 1)[1].split("/", 1)[0]
    obj = client_orb.orb.string_to_object(f"corbaloc::{host_port}/NsjmsStatus")
    admin = obj._narrow(CosNotification.QoSAdmin)
    return {p.name: p.value.value() for p in admin.get_qos()}


def nsjms_status(server: Any) -> str:
    """The output of ``nsjms status`` for the server's state directory (an operator's view)."""
    done = subprocess.run([sys.executable, "-m", "router.cli", "status", "--state-dir", str(server.state_dir)],
                          capture_output=True, text=True, timeout=60)
    return done.stdout


def ack_status(server: Any) -> dict[str, Any] | None:
    """The Ack proxy supplier's entry in the node's status snapshot (``status.json``, rewritten every 2 s):
    in_flight, queued, resends (retries counted on the connection), next_resend_at, and checked_at, the node's
    clock reading of the resend scheduler's last *finished* pass (every resend due by then has been pushed)."""
    try:
        snap = json.loads((server.state_dir / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    entries = [p for ch in snap["channels"] for p in ch["proxy_suppliers"] if "resends" in p]
    assert len(entries) <= 1, entries
    return entries[0] if entries else None


def scheduler_passed(server: Any, deadline: float, **want: Any) -> bool:
    """The resend scheduler finished a pass at or after ``deadline`` and the Ack proxy's state equals ``want``."""
    entry = ack_status(server)
    return (entry is not None and entry["checked_at"] >= deadline
            and all(entry.get(k) == v for k, v in want.items()))


def wait_scheduler(server: Any, deadline: float, **want: Any) -> None:
    """Wait (bounded) until :func:`scheduler_passed`; the failure names the last state seen."""
    assert wait_until(lambda: scheduler_passed(server, deadline, **want), TIMEOUT_S), \
        f"resend scheduler not past {deadline:.3f} with {want}: {ack_status(server)!s}"


def pull_when_offered(proxy: Any) -> Any:
    """Poll ``try_pull`` until an event is offered (a re-offer comes when RetryInterval has passed)."""
    got: list[Any] = []

    def offered() -> bool:
        ev, has = proxy.try_pull_structured_event()
        if has:
            got.append(ev)
        return bool(has)

    assert wait_until(offered, TIMEOUT_S)
    return got[0]


def after_restart(call: Callable[[], Any], attempts: int = 30) -> Any:
    for _ in range(attempts - 1):
        try:
            return call()
        except (CORBA.COMM_FAILURE, CORBA.TRANSIENT):
            time.sleep(0.2)
    return call()


# -- tests --------------------------------------------------------------------------------------------------
def test_each_event_gets_the_next_sequence_number_and_acked_events_are_not_resent(
        factory: Any, nsjms_server: Any) -> None:
    consumer = AckConsumer("each")
    _, _, sp = setup(factory, consumer)
    upstream = prop("SequenceNumber", long_(777))               # overwritten by the channel (per hop)
    for i in range(20):
        sp.push_structured_event(make_event(i, extra_header=[upstream]))
    assert wait_until(lambda: consumer.count() >= 20, TIMEOUT_S)
    deadline = time.time() + INTERVAL_S * 2                     # an unacknowledged event is resent by then
    wait_scheduler(nsjms_server, deadline, in_flight=0, resends=0)
    assert consumer.pushes == [(i, i) for i in range(20)], "one push per event, numbered 0.. in order"


def test_not_acknowledged_event_is_resent_then_the_connection_stops_and_is_reported(
        nsjms_server: Any, client_orb: Any) -> None:
    factory = client_orb.factory(nsjms_server.ior())
    consumer = AckConsumer("never")
    _, proxy, sp = setup(factory, consumer)
    sp.push_structured_event(make_event(1))
    assert wait_until(lambda: consumer.count() >= 1 + RETRIES, TIMEOUT_S)
    assert wait_until(lambda: len(status(client_orb, nsjms_server)) == 1, TIMEOUT_S)
    deadline = time.time() + INTERVAL_S * 2                     # a connection not stopped resends by then
    wait_scheduler(nsjms_server, deadline, in_flight=1, resends=RETRIES, next_resend_at=None)
    assert consumer.pushes == [(0, 1)] * (1 + RETRIES), "original push plus Retries resends, same number"
    sp.push_structured_event(make_event(2))                      # queued, not sent: the connection is stopped
    deadline = time.time() + INTERVAL_S * 2
    wait_scheduler(nsjms_server, deadline, queued=1, in_flight=1)
    assert consumer.count() == 1 + RETRIES
    [(_, reason)] = status(client_orb, nsjms_server).items()
    assert "retries" in reason
    consumer.policy = "each"
    proxy.resume_connection()                                    # the operator's reset
    assert wait_until(lambda: {1, 2} <= set(consumer.unique.values()), TIMEOUT_S)
    consumer.ack_all_pending()
    deadline = time.time() + INTERVAL_S * 2
    wait_scheduler(nsjms_server, deadline, queued=0, in_flight=0)
    assert consumer.unique == {0: 1, 1: 2}, "same number for the resent event, the next for the new one"
    assert status(client_orb, nsjms_server) == {}


class LateAckConsumer(AckConsumer):
    """Acknowledges an event only when it arrives the second time, before that push returns: the acknowledgement
    is later than RetryInterval, and the channel has it before it could resend again (no timing involved)."""

    def push_structured_event(self, ev: Any) -> None:
        super().push_structured_event(ev)
        sn = header_value(ev, "SequenceNumber")
        with self.lock:
            seen = sum(1 for s, _ in self.pushes if s == sn)
            if seen == 2:
                self.pending.remove(sn)
        if seen == 2:
            self.proxy.acknowledge([sn])


def test_late_acknowledgement_causes_one_duplicate_recognised_by_number(factory: Any) -> None:
    consumer = LateAckConsumer("never")
    _, _, sp = setup(factory, consumer, combination4(retries=10))
    sp.push_structured_event(make_event(5))
    assert wait_until(lambda: consumer.count() >= 2, TIMEOUT_S)
    sp.push_structured_event(make_event(6))     # delivered after the worker handled the resend and the ack
    assert wait_until(lambda: 6 in consumer.unique.values(), TIMEOUT_S)
    assert consumer.pushes[:3] == [(0, 5), (0, 5), (1, 6)], consumer.pushes
    assert consumer.unique == {0: 5, 1: 6}


def test_bulk_acknowledgement(factory: Any, nsjms_server: Any) -> None:
    consumer = AckConsumer("bulk:10")
    _, _, sp = setup(factory, consumer, combination4(interval=5.0))
    for i in range(30):
        sp.push_structured_event(make_event(i))
    assert wait_until(lambda: consumer.count() >= 30, TIMEOUT_S)
    wait_scheduler(nsjms_server, time.time(), in_flight=0, resends=0)
    assert consumer.pushes == [(i, i) for i in range(30)]


def test_consumer_that_keeps_failing_stops_the_connection_without_losing_events(
        nsjms_server: Any, client_orb: Any) -> None:
    factory = client_orb.factory(nsjms_server.ior())
    consumer = AckConsumer("each", fail=True)
    _, proxy, sp = setup(factory, consumer)
    for i in range(3):
        sp.push_structured_event(make_event(i))
    assert wait_until(lambda: len(status(client_orb, nsjms_server)) == 1, TIMEOUT_S)
    failures = consumer.failures
    assert failures == 1 + RETRIES
    assert wait_until(lambda: "STOPPED=" in nsjms_status(nsjms_server), TIMEOUT_S), "visible in nsjms status"
    deadline = time.time() + INTERVAL_S * 2                     # a connection not stopped retries by then
    wait_scheduler(nsjms_server, deadline, resends=RETRIES)
    assert consumer.failures == failures, "a stopped connection sends nothing"
    consumer.fail = False
    proxy.resume_connection()
    assert wait_until(lambda: sorted(consumer.unique.values()) == [0, 1, 2], TIMEOUT_S)
    assert status(client_orb, nsjms_server) == {}


def test_one_resume_clears_both_a_stop_and_a_suspension(nsjms_server: Any, client_orb: Any) -> None:
    """A proxy both STOPPED (retries exhausted) and suspended is active again after ONE resume_connection:
    before the fix the first call cleared only the stop and left the proxy suspended (the bridge called it twice)."""
    factory = client_orb.factory(nsjms_server.ior())
    consumer = AckConsumer("each", fail=True)
    _, proxy, sp = setup(factory, consumer)
    sp.push_structured_event(make_event(0))
    assert wait_until(lambda: len(status(client_orb, nsjms_server)) == 1, TIMEOUT_S)
    proxy.suspend_connection()
    sp.push_structured_event(make_event(1))
    consumer.fail = False
    proxy.resume_connection()
    assert wait_until(lambda: sorted(consumer.unique.values()) == [0, 1], TIMEOUT_S), "delivered after one resume"
    with pytest.raises(CosNotifyChannelAdmin.ConnectionAlreadyActive):
        proxy.resume_connection()
    assert status(client_orb, nsjms_server) == {}


def test_crash_before_acknowledging_redelivers_with_the_same_numbers(nsjms_server: Any, client_orb: Any) -> None:
    factory = client_orb.factory(nsjms_server.ior())
    consumer = AckConsumer("never")
    _, _, sp = setup(factory, consumer, combination4(retries=1000, interval=30.0))
    for i in range(5):
        sp.push_structured_event(make_event(i))
    assert wait_until(lambda: consumer.count() >= 5, TIMEOUT_S)
    assert consumer.pushes == [(i, i) for i in range(5)]
    nsjms_server.kill(signal.SIGKILL)
    nsjms_server.restart()
    assert wait_until(lambda: consumer.count() >= 10, TIMEOUT_S), "unacknowledged events come back"
    resent = consumer.pushes[5:]
    assert sorted(resent) == [(i, i) for i in range(5)], "recognisable as duplicates by their numbers"
    after_restart(consumer.ack_all_pending)
    sp.push_structured_event(make_event(9))
    assert wait_until(lambda: 9 in consumer.unique.values(), TIMEOUT_S)
    assert consumer.unique[5] == 9, "the series continues after the restart"


def test_pull_acknowledgement_and_reoffer(factory: Any, nsjms_server: Any) -> None:
    channel, _ = factory.create_channel(combination4(), [])
    proxy, _ = channel._get_default_consumer_admin().obtain_notification_pull_supplier(
        CosNotifyChannelAdmin.STRUCTURED_EVENT)
    proxy = proxy._narrow(CosNotifyChannelAdminAck.StructuredProxyPullSupplierAck)
    proxy.connect_structured_pull_consumer(None)
    sp, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(
        CosNotifyChannelAdmin.STRUCTURED_EVENT)
    sp = sp._narrow(CosNotifyChannelAdmin.StructuredProxyPushConsumer)
    sp.connect_structured_push_supplier(None)
    for i in range(2):
        sp.push_structured_event(make_event(i))
    first = proxy.pull_structured_event()
    second = proxy.pull_structured_event()
    assert [header_value(e, "SequenceNumber") for e in (first, second)] == [0, 1]
    proxy.acknowledge([1])
    again = pull_when_offered(proxy)                             # offered again after RetryInterval
    assert header_value(again, "SequenceNumber") == 0 and event_id(again) == 0
    proxy.acknowledge([0, 0, 1])                                 # duplicate acks are tolerated
    wait_scheduler(nsjms_server, 0.0, in_flight=0, queued=0)
    _, has = proxy.try_pull_structured_event()                   # nothing in flight: nothing to offer again
    assert not has


def test_sequence_push_numbers_each_batch_once(factory: Any, nsjms_server: Any) -> None:
    got: list[list[Any]] = []

    class SeqConsumer(CosNotifyComm__POA.SequencePushConsumer):
        def push_structured_events(self, evs: Any) -> None:
            got.append(list(evs))
            threading.Thread(target=lambda: proxy.acknowledge([header_value(evs[0], "SequenceNumber")]),
                             daemon=True).start()

        def disconnect_sequence_push_consumer(self) -> None:
            pass

        def offer_change(self, a: Any, r: Any) -> None:
            pass

    qos = combination4() + [prop("MaximumBatchSize", long_(5)), prop("PacingInterval", time_t(0.2))]
    channel, _ = factory.create_channel(qos, [])
    p, _ = channel._get_default_consumer_admin().obtain_notification_push_supplier(
        CosNotifyChannelAdmin.SEQUENCE_EVENT)
    proxy = p._narrow(CosNotifyChannelAdminAck.SequenceProxyPushSupplierAck)
    sp, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(
        CosNotifyChannelAdmin.SEQUENCE_EVENT)
    sp = sp._narrow(CosNotifyChannelAdmin.SequenceProxyPushConsumer)
    sp.connect_sequence_push_supplier(None)
    proxy.connect_sequence_push_consumer(SeqConsumer()._this())
    sp.push_structured_events([make_event(i) for i in range(10)])
    assert wait_until(lambda: sum(len(b) for b in got) >= 10, TIMEOUT_S)
    deadline = time.time() + INTERVAL_S * 2                     # an unacknowledged batch is resent by then
    wait_scheduler(nsjms_server, deadline, in_flight=0, resends=0)
    assert [header_value(b[0], "SequenceNumber") for b in got] == list(range(len(got)))
    assert all(header_value(ev, "SequenceNumber") is None for b in got for ev in b[1:])
    assert sorted(event_id(ev) for b in got for ev in b) == list(range(10))


class AckSupplier(CosNotifyCommAck__POA.StructuredPushSupplierAck):
    def __init__(self) -> None:
        self.acks: list[int] = []

    def acknowledge(self, sns: Any) -> None:
        self.acks.extend(sns)

    def disconnect_structured_push_supplier(self) -> None:
        pass

    def subscription_change(self, a: Any, r: Any) -> None:
        pass


def test_the_channel_acknowledges_ack_suppliers_and_drops_duplicates(factory: Any, nsjms_server: Any) -> None:
    channel, _ = factory.create_channel(combination4(), [])
    consumer = AckConsumer("each")
    p, _ = channel._get_default_consumer_admin().obtain_notification_push_supplier(
        CosNotifyChannelAdmin.STRUCTURED_EVENT)
    consumer.proxy = p._narrow(CosNotifyChannelAdminAck.StructuredProxyPushSupplierAck)
    consumer.proxy.connect_structured_push_consumer(consumer._this())
    sp, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(
        CosNotifyChannelAdmin.STRUCTURED_EVENT)
    sp = sp._narrow(CosNotifyChannelAdmin.StructuredProxyPushConsumer)
    supplier = AckSupplier()
    sp.connect_structured_push_supplier(supplier._this())
    for sn, i in ((0, 10), (1, 11), (1, 11), (2, 12)):           # the third push is a resend
        sp.push_structured_event(make_event(i, extra_header=[prop("SequenceNumber", long_(sn))]))
    assert wait_until(lambda: sorted(supplier.acks) == [0, 1, 1, 2], TIMEOUT_S)
    assert wait_until(lambda: consumer.count() >= 3, TIMEOUT_S)
    # everything the channel routed has been delivered and acknowledged: a routed duplicate would be queued here
    wait_scheduler(nsjms_server, time.time(), queued=0, in_flight=0)
    assert [i for _, i in consumer.pushes] == [10, 11, 12]
