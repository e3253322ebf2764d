"""The one decision over a broker's ERROR frames (router.jms.refusal): a refusal of the message (dead-letter it) or a
broker out of a resource (an outage: keep the message queued, retry, never dead-letter), over real broker texts.

The resource texts are the ERROR frames ActiveMQ Classic 5.17 sends over STOMP (``message`` header = the Java
exception's message, body = its stack trace), the JDK's messages for ENOSPC / EDQUOT, and ActiveMQ Artemis's."""

from __future__ import annotations

import pytest

from router.jms.memory.broker import MemoryBroker
from router.jms.memory.transport import MemoryTransport
from router.jms.model import BodyType, Destination, JmsMessage
from router.jms.refusal import RESOURCE_MARK, Refusal, classify, is_resource
from router.jms.transport import BrokerError, BrokerFull, SendFailed, SendRefused, refused_send, resource_refusal

_TRACE = ("{exc}: {msg}\n\tat org.apache.activemq.broker.region.BaseDestination.waitForSpace(BaseDestination.java:"
          "714)\n\tat org.apache.activemq.broker.region.Queue.send(Queue.java:663)\n")

#: (message header, body, the resource it names) — answered to a SEND, a COMMIT or an ACK of a transaction.
RESOURCE_FRAMES = [
    # seen: ActiveMQ 5.17.2 with <storeUsage limit="4 mb"> and sendFailIfNoSpace (tests/integration/test_broker_full.py)
    ("Persistent store is Full, 100% of 4194304. Stopping producer (ID:vm-34869-1796543835346-5:7:-1:1) to prevent "
     "flooding queue://full.out.8f0a94c0. See http://activemq.apache.org/producer-flow-control.html for more info",
     "", "store usage limit"),
    ("COMMIT FAILED: Transaction marked rollback only xaErrorCode:100 (a frame in the transaction failed: Persistent "
     "store is Full, 100% of 4194304. Stopping producer (ID:x) to prevent flooding queue://out.)", "",
     "store usage limit"),
    ("Persistent store is Full, 100% of 1048576. Stopping producer (ID:h-40377-1733470000000-1:1:1:1) to prevent "
     "flooding queue://q.full. See http://activemq.apache.org/producer-flow-control.html for more info (blocking "
     "for: 0s)", _TRACE.format(exc="javax.jms.ResourceAllocationException", msg="Persistent store is Full"),
     "store usage limit"),
    ("Temp Store is Full (100% of 1048576). Stopping producer (ID:h-1:1:1:1) to prevent flooding queue://q. See "
     "http://activemq.apache.org/producer-flow-control.html for more info (blocking for: 0s)", "", "temp usage limit"),
    ("Usage Manager Memory Limit reached. Producer (ID:h-1:1:1:1) stopped to prevent flooding queue://q. See "
     "http://activemq.apache.org/producer-flow-control.html for more info", "", "memory usage limit"),
    ("Usage Manager Memory Limit Wait Timeout. Stopping producer (ID:h-1:1:1:1) to prevent flooding topic://t.",
     "", "memory usage limit"),
    ("No space left on device", "java.io.IOException: No space left on device\n\tat java.base/sun.nio.ch."
     "FileDispatcherImpl.write0(Native Method)\n", "disk full (ENOSPC)"),
    # seen: ActiveMQ 5.17.2 on a full tmpfs, the answer to a persistent SEND (KahaDB's journal write failed)
    ("java.io.IOException: No space left on device", "java.util.concurrent.ExecutionException: java.io.IOException: "
     "No space left on device\n\tat java.base/java.util.concurrent.FutureTask.report(FutureTask.java:122)\n\tat "
     "org.apache.activemq.broker.region.Queue.doMessageSend(Queue.java:", "disk full (ENOSPC)"),
    ("java.io.IOException: No space left on device", "", "disk full (ENOSPC)"),
    ("Disk quota exceeded", "java.io.IOException: Disk quota exceeded", "disk quota (EDQUOT)"),
    ("(no message header)", "javax.jms.ResourceAllocationException: something the broker ran out of",
     "broker resource limit"),
    ("AMQ229102: Address \"orders\" is full. Message encode size = 1088B", "", "address full"),
    ("AMQ119119: Disk Capacity is Full", "", "disk full"),
    ("transaction tx-1: a frame in it failed before the COMMIT was confirmed (Persistent store is Full, 100% of "
     "1048576. Stopping producer (ID:x) to prevent flooding queue://q.); the broker committed it without that "
     "frame", "", "store usage limit"),
    (f"Broker: localhost - Client: x already ... ({RESOURCE_MARK})", "", "broker resource limit"),
]

#: Refusals of the frame itself: the same frame would be refused again (dead-letter it).
CONTENT_FRAMES = [
    ("User anonymous is not authorized to write to: queue://secret",
     "java.lang.SecurityException: User anonymous is not authorized to write to: queue://secret"),
    ("Unable to convert message", "org.apache.activemq.transport.stomp.ProtocolException: Unable to convert"),
    ("Invalid selector: a = ", "javax.jms.InvalidSelectorException: a = "),
    ("Unexpected ACK received for message-id [ID:h-1:1:1:1:1]", ""),
    ("message too large", ""),
    ("COMMIT FAILED: Transaction marked rollback only xaErrorCode:100", ""),   # without its frame's reason
    # review finding: the broker echoes names and values; a resource-like word in them is still a content refusal
    ("User nsjms is not authorized to write to: queue://ops.quota.exceeded",
     "java.lang.SecurityException: User nsjms is not authorized to write to: queue://ops.quota.exceeded"),
    ("User nsjms is not authorized to write to: queue://producer-flow-control.audit", ""),
    ('For input string: "address X is full"', 'java.lang.NumberFormatException: For input string: "address X is '
     'full"'),
    ("(no message header)", ""),
    ("", ""),
]


@pytest.mark.parametrize(("message", "body", "resource"), RESOURCE_FRAMES)
def test_a_broker_out_of_a_resource_is_an_outage(message: str, body: str, resource: str) -> None:
    verdict = classify(message, body)
    assert verdict.refusal is Refusal.RESOURCE and verdict.resource == resource
    assert is_resource(message, body)


@pytest.mark.parametrize(("message", "body"), CONTENT_FRAMES)
def test_a_refusal_of_the_frame_itself_is_content(message: str, body: str) -> None:
    assert classify(message, body).refusal is Refusal.CONTENT and not is_resource(message, body)


def test_the_transport_raises_broker_full_not_send_refused_for_a_resource_refusal() -> None:
    full = refused_send(BrokerError(*RESOURCE_FRAMES[0][:2]), "/queue/q.full")
    assert isinstance(full, BrokerFull) and isinstance(full, SendFailed) and not isinstance(full, SendRefused)
    assert full.resource == "store usage limit" and resource_refusal(full)
    assert RESOURCE_MARK in str(full) and "Persistent store is Full" in str(full)
    refused = refused_send(BrokerError(*CONTENT_FRAMES[0]), "/queue/secret")
    assert isinstance(refused, SendRefused) and not resource_refusal(refused)
    assert resource_refusal(BrokerError("No space left on device")) and not resource_refusal(BrokerError("denied"))


def test_the_memory_twin_translates_at_the_same_boundary() -> None:
    broker = MemoryBroker("refusal-twin")
    transport = MemoryTransport(broker=broker)
    transport.connect()
    try:
        broker.inject_fault("send", BrokerError("No space left on device", "java.io.IOException: No space left"))
        with pytest.raises(BrokerFull) as caught:
            transport.send(Destination("queue", "q"), JmsMessage(BodyType.TEXT, "x"))
        assert caught.value.resource == "disk full (ENOSPC)"
        broker.inject_fault("send", BrokerError("User anonymous is not authorized to write to: queue://q"))
        with pytest.raises(SendRefused):
            transport.send(Destination("queue", "q"), JmsMessage(BodyType.TEXT, "x"))
    finally:
        transport.close()
        MemoryBroker.forget("refusal-twin")
