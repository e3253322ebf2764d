"""A proxy supplier, its admin or its channel destroyed while a push to the consumer is in flight (review finding):
the ledger recorded the event ``discarded`` although the consumer received it. Now the teardown waits for the push
(bounded by the push's call timeout) and the event the consumer got is ``delivered``.

A real node, shared by the module's tests (``module_server``: each makes its own channel and reads only that
channel's ledger rows); the consumer is a CORBA servant in this process whose push blocks until the test lets it
return. The test destroys while the push is blocked, then lets it return, and waits for the event's terminal ledger
row.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import CosNotifyChannelAdmin

from bridgekit import ledger_rows, persistent_channel, structured_supplier
from conftest import NsjmsServer
from stdclients import (
    Form,
    PullConsumerClient,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    make_event,
    obtain_proxy_supplier,
    wait_until,
)

pytestmark = pytest.mark.integration

DESTROY_WINDOW_S = 3.0    # how long the destroy may run alone while the push is blocked (shorter than the push's
                          # call timeout, 10 s); no assertion is made on it
WAIT_S = 60.0


class BlockingConsumer(StructuredPushConsumer):
    """Its push returns only once ``gate`` is set; ``entered`` is set when a push arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()

    def push_structured_event(self, notification: Any) -> None:
        self.entered.set()
        self.gate.wait(30)
        super().push_structured_event(notification)


@pytest.mark.parametrize("what", ["proxy", "admin", "channel"])
def test_an_event_pushed_during_destroy_is_recorded_delivered(module_server: NsjmsServer, shared_factory: Any,
                                                              what: str) -> None:
    channel, cid = persistent_channel(shared_factory)
    admin, _ = channel.new_for_consumers(CosNotifyChannelAdmin.AND_OP)
    proxy, pid = obtain_proxy_supplier(admin, Form.STRUCTURED, Style.PUSH)
    consumer = BlockingConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)
    structured_supplier(channel).push_all([make_event(0)])
    assert consumer.entered.wait(WAIT_S), "the push never reached the consumer"

    destroy_it = {"proxy": proxy.disconnect_structured_push_supplier, "admin": admin.destroy,
                  "channel": channel.destroy}[what]
    errors: list[BaseException] = []

    def destroy() -> None:
        try:
            destroy_it()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    destroyer = threading.Thread(target=destroy)
    destroyer.start()
    destroyer.join(DESTROY_WINDOW_S)         # the destroy runs while the push is in flight
    consumer.gate.set()                      # the consumer takes the event: the push returns OK
    destroyer.join(WAIT_S)
    assert not destroyer.is_alive() and not errors, errors
    assert wait_until(lambda: consumer.count() == 1, WAIT_S)    # the consumer got the event

    where = "channel_id = %s AND proxy_id = %s AND outcome <> 'accepted'"
    assert wait_until(lambda: bool(ledger_rows(module_server.pg_dsn, where, (cid, pid))), WAIT_S)
    rows = ledger_rows(module_server.pg_dsn, where, (cid, pid))
    assert [(r["outcome"], r["failure_reason"]) for r in rows] == [("delivered", None)], rows


@pytest.mark.parametrize("what", ["proxy", "admin", "channel"])
def test_an_event_pulled_before_the_destroy_is_recorded_delivered(module_server: NsjmsServer, shared_factory: Any,
                                                                   what: str) -> None:
    """The same for a pull proxy supplier: an event handed out by a pull whose reply went out is confirmed by the
    next pull; a disconnect or destroy after that pull recorded it ``discarded`` although the consumer had it."""
    channel, cid = persistent_channel(shared_factory)
    admin, _ = channel.new_for_consumers(CosNotifyChannelAdmin.AND_OP)
    proxy, pid = obtain_proxy_supplier(admin, Form.STRUCTURED, Style.PULL)
    client = PullConsumerClient(proxy, Form.STRUCTURED)
    client.connect()
    structured_supplier(channel).push_all([make_event(0)])
    got: list[Any] = []
    assert wait_until(lambda: bool(got.extend(client.try_pull()) or got), WAIT_S), "nothing to pull"
    {"proxy": proxy.disconnect_structured_pull_supplier, "admin": admin.destroy, "channel": channel.destroy}[what]()

    where = "channel_id = %s AND proxy_id = %s AND outcome <> 'accepted'"
    assert wait_until(lambda: bool(ledger_rows(module_server.pg_dsn, where, (cid, pid))), WAIT_S)
    rows = ledger_rows(module_server.pg_dsn, where, (cid, pid))
    assert [(r["outcome"], r["failure_reason"]) for r in rows] == [("delivered", None)], rows


def test_a_channel_destroy_waits_for_its_proxies_pushes_at_once_not_one_after_another(
        module_server: NsjmsServer, shared_factory: Any) -> None:
    """Five push proxies, each with a consumer that does not answer (a push ends only by the channel's push call
    timeout, 10 s); their pushes start one after another, the last proxy's first. The destroy used to tear the
    proxies down in order, one at a time: while it waited for the first proxy's push, the others' pushes timed out
    and their delivery threads pushed again, so each proxy made it wait about one more call timeout (about 30 s
    here) and the destroying client's own call timed out. Now every proxy stops pushing when the destroy starts and
    their waits share one bound: the destroy returns within the client's call timeout (18 s, less than two push
    timeouts; before the fix it raised TIMEOUT) — the client-side call timeout is the behaviour at stake, not a
    measured duration."""
    import omniORB

    channel, cid = persistent_channel(shared_factory)
    admin, _ = channel.new_for_consumers(CosNotifyChannelAdmin.AND_OP)
    proxies = [obtain_proxy_supplier(admin, Form.STRUCTURED, Style.PUSH)[0] for _ in range(5)]
    consumers = [BlockingConsumer() for _ in proxies]
    supplier = structured_supplier(channel)
    try:
        for n, (proxy, consumer) in enumerate(reversed(list(zip(proxies, consumers, strict=True)))):
            connect_push_consumer(proxy, Form.STRUCTURED, consumer)   # the last proxy first: its push starts first
            supplier.push_all([make_event(n)])                         # only the proxies connected so far get it
            assert consumer.entered.wait(WAIT_S), "a push never reached its consumer"
        omniORB.setClientCallTimeout(channel, 18_000)
        channel.destroy()                       # raises CORBA.TIMEOUT if the destroy outlasts the call timeout
        where = "channel_id = %s AND outcome <> 'accepted'"
        # every event has its terminal row (the first proxy connected got 5 events, the next 4, ..., the last 1)
        assert wait_until(lambda: len(ledger_rows(module_server.pg_dsn, where, (cid,))) == 15, WAIT_S)
    finally:
        for consumer in consumers:
            consumer.gate.set()
