"""JMS → channel with an expiring JMS message, against a real ActiveMQ and a real node (NS 2.5.5.3-4, NJI 2.5).

The bridge maps JMSExpiration to what the receiving proxy consumer accepts: an exact ``StopTime`` when its
``StopTimeSupported`` is TRUE, a relative ``Timeout`` (the original StopTime kept in ``filterable_data``) when it
is FALSE. Either way the channel accepts the event; nothing is dead-lettered. Before the bridge read its proxy's
QoS it always sent the Timeout form, so a channel that supports StopTime never received one.

The cases share one node (``module_server``): each has its own channel, bridge and queue.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import stomp

import CosNotification

from idl.generated import CosBridgeAdmin as BA

from bridgekit import bridge_factory, channel_ep, jms_ep
from conftest import NsjmsServer
from stdclients import (
    Form,
    StructuredPushConsumer,
    Style,
    boolean,
    connect_push_consumer,
    header_value,
    obtain_proxy_supplier,
    prop,
    short,
)

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0
UTC_EPOCH_OFFSET = 0x01B21DD213814000      # 1582-10-15 -> 1970-01-01 in 100 ns units (TimeBase::UtcT)
LIFETIME_MS = 600_000


def _send_expiring(broker_url: str, queue: str, expires_ms: int) -> None:
    host, port = broker_url.removeprefix("stomp://").split(":")
    conn = stomp.Connection([(host, int(port))])
    conn.connect(wait=True)
    try:
        conn.send(destination=f"/queue/{queue}", body="expiring",
                  headers={"persistent": "true", "expires": str(expires_ms), "receipt": "r1"})
    finally:
        conn.disconnect()


@pytest.mark.parametrize(("style", "supported"), [(BA.PUSH, True), (BA.PUSH, False), (BA.PULL, True)],
                         ids=["push-stoptime-supported", "push-stoptime-unsupported", "pull-stoptime-supported"])
def test_expiring_message_becomes_what_the_channel_accepts(module_server: NsjmsServer, client_orb: Any,
                                                           shared_factory: Any, broker_url: str, style: Any,
                                                           supported: bool) -> None:
    qos = [prop("EventReliability", short(CosNotification.Persistent)),
           prop("ConnectionReliability", short(CosNotification.Persistent)),
           prop("StopTimeSupported", boolean(supported))]
    channel, cid = shared_factory.create_channel(qos, [])
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)
    queue = f"times.{uuid.uuid4().hex[:8]}"
    bridge, _ = bridge_factory(client_orb, module_server).create_bridge(jms_ep(BA.SOURCE, queue),
                                                                        channel_ep(BA.SINK, cid, style))
    bridge.start_bridge()
    expires = int(time.time() * 1000) + LIFETIME_MS
    _send_expiring(broker_url, queue, expires)

    assert consumer.wait_for(1, TIMEOUT_S), "the expiring message never reached the channel's consumer"
    [event] = consumer.snapshot()
    stop = header_value(event, "StopTime")
    timeout = header_value(event, "Timeout")
    if supported:
        assert stop is not None and stop.time == expires * 10_000 + UTC_EPOCH_OFFSET, stop
        assert timeout is None
    else:
        assert stop is None, "StopTime sent to a channel whose StopTimeSupported is FALSE"
        assert isinstance(timeout, int) and 0 < timeout <= LIFETIME_MS * 10_000, timeout
        moved = [p.value.value() for p in event.filterable_data if p.name == "StopTime"]
        assert [m.time for m in moved] == [expires * 10_000 + UTC_EPOCH_OFFSET], "original StopTime kept"
    bridge.destroy()
