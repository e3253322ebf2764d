"""router/cluster/release.py: what a hand-off's stop leaves running is waited on again at the next pass, and the
channel is released only once it has ended (review of this session: a route still in flight was kept as text, a
later pass found no thread of that name, and the channel was released with the accept still running: its event
reached PostgreSQL after the new owner had loaded the channel)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_channel_delivery import Consumer, FakeStore, make_proxy, record, wait_for

from omniORB import CORBA

from router.channel import proxies as P
from router.channel import pushsupplier
from router.channel.delivered import DeliveredJournals
from router.channel.gate import Gate
from router.cluster.release import stop_channel, wait_pending
from router.db import StoreUnavailable


def test_an_accept_in_flight_at_the_stop_is_waited_on_again_until_it_ends() -> None:
    gate = Gate()
    channel = SimpleNamespace(gate=gate, consumer_admins={}, supplier_admins={}, oid=b"ch/7", destroyed=False)
    deactivated: list[Any] = []
    factory = SimpleNamespace(channels={7: channel}, rt=SimpleNamespace(deactivate=deactivated.append),
                              forget=lambda cid: None)
    bridges = SimpleNamespace(bridges={})
    inside, leave = threading.Event(), threading.Event()

    def route() -> None:
        with gate.passing():
            inside.set()
            leave.wait(30)

    t = threading.Thread(target=route)
    t.start()
    try:
        assert inside.wait(10)
        left = stop_channel(factory, bridges, 7, [], 0.05, lambda p, timeout: True)
        assert [p.label for p in left] == ["channel 7: accepts in flight"]
        again = wait_pending(left, time.monotonic() + 0.05)
        assert [p.label for p in again] == ["channel 7: accepts in flight"], "still running: not released"
        leave.set()
        assert wait_pending(again, time.monotonic() + 10) == [], "ended: the release may go on"
    finally:
        leave.set()
        t.join(10)


def test_a_phase_two_not_ended_at_the_stop_is_waited_on_again() -> None:
    done = threading.Event()
    supplier = SimpleNamespace(oid=b"p/1", stop_for_handoff=lambda: None, drain_inbound=lambda timeout: True,
                               delete_delivered_rows=lambda: True)      # proxyport.HandOffProxy
    admin = SimpleNamespace(proxies={1: supplier}, oid=b"a/1")
    channel = SimpleNamespace(gate=Gate(), consumer_admins={0: admin}, supplier_admins={}, oid=b"ch/7",
                              destroyed=False)
    factory = SimpleNamespace(channels={7: channel}, rt=SimpleNamespace(deactivate=lambda oid: None),
                              forget=lambda cid: None)
    left = stop_channel(factory, SimpleNamespace(bridges={}), 7, [], 0.05, lambda p, timeout: done.wait(timeout))
    assert [p.label for p in left] == ["proxy b'p/1': phase two of its routing transactions",
                                       "proxy b'p/1': delete of its delivered events' rows"], \
        "the delete of its delivered rows is asked again once the phase two (and its last delete) ended"
    assert len(wait_pending(left, time.monotonic() + 0.05)) == 2
    done.set()
    assert wait_pending(left, time.monotonic() + 1) == []


# -- the hand-off gaps docs/cluster.md named (issue 25): a connection change during the stop, a failed delete ------
def _channel_of(*proxies: Any) -> Any:
    admin = SimpleNamespace(proxies={p.id: p for p in proxies}, oid=b"a/0")
    return SimpleNamespace(id=0, gate=Gate(), consumer_admins={0: admin}, supplier_admins={}, oid=b"ch/0",
                           destroyed=False)


def _stop(channel: Any, timeout_s: float = 5.0) -> list[Any]:
    factory = SimpleNamespace(channels={0: channel}, rt=SimpleNamespace(deactivate=lambda oid: None),
                              forget=lambda cid: None)
    return stop_channel(factory, SimpleNamespace(bridges={}), 0, [], timeout_s, lambda p, timeout: True)


def _push_proxy(monkeypatch: pytest.MonkeyPatch, channel: Any = None) -> Any:
    proxy = make_proxy(P.StructuredProxyPushSupplierImpl, Consumer(), monkeypatch)
    proxy._lock, proxy.closing, proxy.extra = threading.RLock(), False, {}
    proxy.writes = []
    proxy._update = lambda **cols: proxy.writes.append(cols)
    if channel is not None:
        proxy.channel = channel
    return proxy


def test_a_resume_or_suspend_during_the_stop_is_refused_transient_and_writes_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the stopped proxy's resume_connection wrote ``suspended = false`` (and a suspend ``true``) to its row
    while the channel was being released: a new owner that loaded the row first kept the old state, the client was
    told it had changed. Now TRANSIENT (COMPLETED_NO): asked again, its call reaches the new owner."""
    proxy = _push_proxy(monkeypatch)
    proxy.suspended = True
    channel = _channel_of(proxy)
    proxy.channel = channel
    assert _stop(channel) == []
    for change in (proxy.resume_connection, proxy.suspend_connection):
        with pytest.raises(CORBA.TRANSIENT) as refused:
            change()
        assert refused.value.completed == CORBA.COMPLETED_NO
    assert proxy.writes == [] and proxy.suspended


def test_a_proxy_made_during_the_stop_cannot_connect_nor_start_a_worker_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a proxy an admin made while its channel stopped (not among the proxies the stop had listed) was
    connected and started its delivery (or pull) thread on the old node, beside the next owner's."""
    channel = _channel_of()
    assert _stop(channel) == []
    late = _push_proxy(monkeypatch, channel)
    late.connected = False
    spawned: list[str] = []
    late.rt.spawn = lambda name, fn: spawned.append(name)
    late.rt.ior = lambda client: "IOR:late"
    monkeypatch.setattr(CORBA, "is_nil", lambda obj: obj is None)      # the fake consumer is no object reference
    with pytest.raises(CORBA.TRANSIENT):
        late.connect_structured_push_consumer(Consumer())
    assert spawned == [] and late.writes == [] and not late.connected


class _FlakyStore(FakeStore):
    """FakeStore whose deletes fail while ``down`` (PostgreSQL away)."""

    down = False

    def delete_deliveries(self, conn: object, cid: int, aid: int, pid: int, ids: list[int], **how: Any) -> None:
        if self.down:
            raise StoreUnavailable("injected: the database is away")
        super().delete_deliveries(conn, cid, aid, pid, ids, **how)


def test_delivered_rows_whose_delete_failed_during_the_stop_are_deleted_before_the_release(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the delivery thread's last delete failed (the database away during the stop), the stop said the
    channel could be released, and the next owner loaded those rows and delivered the events again."""
    for name in ("FLUSH_EVENTS", "FLUSH_AGE", "IDLE_FLUSH_EVENTS", "IDLE_FLUSH_AGE"):
        monkeypatch.setattr(pushsupplier, name, 10**6)        # the deliveries wait for a batch delete
    proxy = _push_proxy(monkeypatch)
    proxy.rt.delivered = DeliveredJournals(tmp_path / "delivered")
    store = proxy.rt.store = _FlakyStore()
    channel = _channel_of(proxy)
    proxy.channel = channel
    for i in range(1, 4):
        proxy.queue.put(record(i, db_id=100 + i))
    worker = threading.Thread(target=proxy.supervised(proxy._push_loop), name=f"push-{proxy.oid}", daemon=True)
    worker.start()
    wait_for(lambda: len(proxy._pending or []) == 3, "three deliveries waiting for their batch delete")
    store.down = True
    left = _stop(channel, 0.3)
    worker.join(10)
    assert not worker.is_alive()
    assert proxy.client.got == [1, 2, 3] and store.deleted == []
    assert [p.label for p in left] == [f"proxy {proxy.oid}: delete of its delivered events' rows"], \
        "not released while the next owner would deliver those events again"
    assert len(wait_pending(left, time.monotonic() + 0.1)) == 1, "still away: still not released"
    store.down = False
    assert wait_pending(left, time.monotonic() + 10) == []
    assert sorted(store.deleted) == [101, 102, 103]
    assert {o for o, _ in store.outcomes.values()} == {"delivered"}


def test_a_pull_or_an_acknowledge_during_the_stop_is_refused_transient(monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's finding: only the push side's connection changes were refused during the stop. A pull then
    handed out events whose rows stayed for the next owner (delivered twice), and an acknowledge deleted rows and
    saved the ack state after the next owner had loaded them. Now both answer TRANSIENT (COMPLETED_NO): asked
    again, the call reaches the new owner."""
    from router.channel.ack import StructuredProxyPushSupplierAckImpl

    channel = _channel_of()
    assert _stop(channel) == []                              # the gate is closed for good on this node
    puller = make_proxy(P.StructuredProxyPullSupplierImpl, Consumer(), monkeypatch)
    puller.channel, puller.closing, puller.connected = channel, False, True
    with pytest.raises(CORBA.TRANSIENT) as refused:
        puller._check_pullable()
    assert refused.value.completed == CORBA.COMPLETED_NO
    acker = make_proxy(StructuredProxyPushSupplierAckImpl, Consumer(), monkeypatch)
    acker.channel, acker.closing = channel, False
    acker.ack = SimpleNamespace(acknowledge=lambda seqs: pytest.fail(f"acknowledged {seqs} during the stop"))
    with pytest.raises(CORBA.TRANSIENT):
        acker.acknowledge([0, 1])


def test_an_acknowledge_whose_delete_failed_during_the_stop_is_not_done_and_the_stop_waits_for_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: an acknowledge that had passed its check when the stop began kept retrying its delete (the database
    away) until the proxy stopped, then saved the acknowledgement state without the events and returned as done:
    their rows stayed for the next owner, which delivered the acknowledged events again. Now the call holds the
    channel's gate (the stop waits for it) and, stopped before its delete worked, saves nothing and answers
    TRANSIENT (COMPLETED_NO): asked again, the next owner acknowledges them."""
    from router.channel.ack import StructuredProxyPushSupplierAckImpl
    from router.channel.queue import Entry

    acker = make_proxy(StructuredProxyPushSupplierAckImpl, Consumer(), monkeypatch)
    acker._lock, acker.closing, acker.extra = threading.RLock(), False, {}
    acker.writes = []
    acker._update = lambda **cols: acker.writes.append(cols)
    acker._init_ack()
    store = acker.rt.store = _FlakyStore()
    channel = acker.channel = _channel_of(acker)
    pending = acker.ack.open([Entry(record(1, db_id=101), 0)], 0.0)
    store.down = True
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            acker.acknowledge([pending.sn])
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 — the test inspects it
            outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    wait_for(lambda: not acker.ack.inflight, "the acknowledge taken, its delete retrying")
    left = _stop(channel, 0.3)
    caller.join(10)
    assert not caller.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], CORBA.TRANSIENT), outcome
    assert outcome[0].completed == CORBA.COMPLETED_NO
    assert store.deleted == [] and acker.writes == [], "nothing deleted, no acknowledgement state saved"
    assert "channel 0: accepts in flight" in [p.label for p in left], "the stop waited for the acknowledge"


class _NoWrites:
    def unit_of_work(self, timeout: float | None = None) -> Any:
        raise AssertionError("a row was written for a channel being handed to another node")


def test_no_admin_or_proxy_is_made_while_the_channel_is_handed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: an admin or a proxy made during the stop had its row inserted; when that committed after the next
    owner had loaded the channel, the next owner did not know it (its calls there got OBJECT_NOT_EXIST) although
    the client had been given its reference. Now both pass the channel's gate: refused TRANSIENT (COMPLETED_NO,
    nothing written) while it is closed; one being made is waited for by the stop."""
    from router.channel.admins import ConsumerAdminImpl
    from router.channel.channel import EventChannelImpl

    channel = object.__new__(EventChannelImpl)
    channel._lock, channel.destroyed = threading.RLock(), False
    channel.rt = SimpleNamespace(db=_NoWrites(), limits=None)
    channel.consumer_admins, channel.supplier_admins = {}, {}
    channel.factory, channel.qos, channel._next_admin, channel.id = None, {}, {"C": 0, "S": 0}, 0
    channel.check_limit = lambda side: None
    monkeypatch.setattr("router.channel.channel.check_admins", lambda limits, factory: None)
    monkeypatch.setattr("router.channel.admins.check_proxies", lambda limits, factory: None)
    channel.gate.close(1.0)                                   # the hand-off's stop began
    with pytest.raises(CORBA.TRANSIENT) as refused:
        channel._new_admin("C", SimpleNamespace(_v=0), es_style=False)
    assert refused.value.completed == CORBA.COMPLETED_NO
    admin = object.__new__(ConsumerAdminImpl)
    admin._lock, admin.destroyed, admin.side, admin.channel = threading.RLock(), False, "C", channel
    admin.rt, admin.qos, admin._next_proxy, admin.id = channel.rt, {}, 0, 0
    with pytest.raises(CORBA.TRANSIENT):
        admin._new_proxy("STRUCTURED", es_style=False)


def test_no_filter_of_the_channel_is_made_while_it_is_handed_over() -> None:
    """The review's finding: a create_filter on the channel's filter factory during the stop inserted its row and
    registered the filter here after the channel's filters were retired, while the next owner loaded it from
    PostgreSQL: two copies, constraint changes landing on the stale one. Now it passes the channel's gate."""
    from router.channel.filters import GRAMMAR, ChannelFilterFactory

    made: list[int] = []
    node = SimpleNamespace(create_filter=lambda grammar, channel: made.append(channel),
                           create_mapping_filter=lambda grammar, value, channel: made.append(channel))
    gate = Gate()
    factory = ChannelFilterFactory(node, 4, gate)  # type: ignore[arg-type]
    factory.create_filter(GRAMMAR)
    assert made == [4]
    assert gate.close(1.0)                                    # the hand-off's stop began
    with pytest.raises(CORBA.TRANSIENT):
        factory.create_filter(GRAMMAR)
    with pytest.raises(CORBA.TRANSIENT):
        factory.create_mapping_filter(GRAMMAR, 1)
    assert made == [4], "nothing made during the stop"


def test_a_step_of_the_stop_that_fails_does_not_leave_the_channel_half_stopped_and_registered() -> None:
    """Review of issue 25's merge: a proxy's ``stop_for_handoff`` (or a bridge's connection close) that raised ended
    ``stop_channel`` after the gate closed and the other proxies stopped but before ``factory.forget``: the channel
    stayed registered, so the reload after the failed hand-off skipped it (already loaded) and it answered
    TRANSIENT for ever. Every step now runs; the failure is logged."""
    def broken() -> None:
        raise RuntimeError("stop failed")

    stopped: list[bytes] = []
    first = SimpleNamespace(oid=b"p/1", id=1, stop_for_handoff=broken, drain_inbound=lambda timeout: True,
                            delete_delivered_rows=lambda: True)
    second = SimpleNamespace(oid=b"p/2", id=2, stop_for_handoff=lambda: stopped.append(b"p/2"),
                             drain_inbound=lambda timeout: True, delete_delivered_rows=lambda: True)
    channel = _channel_of(first, second)
    forgotten: list[int] = []
    deactivated: list[bytes] = []
    factory = SimpleNamespace(channels={0: channel}, rt=SimpleNamespace(deactivate=deactivated.append),
                              forget=forgotten.append)
    left = stop_channel(factory, SimpleNamespace(bridges={}), 0, [], 5.0, lambda p, timeout: True)
    assert left == []
    assert stopped == [b"p/2"], "the next proxy is stopped too"
    assert forgotten == [0] and channel.destroyed, "the channel no longer runs here: a reload can load it whole"
    assert {b"p/1", b"p/2", b"a/0", b"ch/0"} <= set(deactivated)
