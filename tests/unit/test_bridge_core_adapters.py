"""The CORBA adapters of the bridge core (router.bridge.flows): the one translation of the channel's CORBA
exceptions into the core's ChannelError tree, and the servants/ports over proxies, against recording stand-ins."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from omniORB import CORBA

import CosEventComm

from router.bridge import flows as F
from router.bridge.ports import ChannelFull, ChannelGone, ChannelUnavailable, EventRefused
from router.channel.boundary import MINOR_EVENT_TOO_LARGE
from router.jms.model import BodyType, JmsMessage
from router.jms.transport import Delivery
from tests.unit.test_bridge_core import TwinTransport, in_flow, out_flow


@pytest.mark.parametrize(("exc", "kind"), [
    (CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO), ChannelGone),
    (CosEventComm.Disconnected(), ChannelGone),
    (CORBA.BAD_QOS(0, CORBA.COMPLETED_NO), EventRefused),
    (CORBA.IMP_LIMIT(MINOR_EVENT_TOO_LARGE, CORBA.COMPLETED_NO), EventRefused),
    (CORBA.IMP_LIMIT(0, CORBA.COMPLETED_NO), ChannelFull),
    (CORBA.TRANSIENT(0, CORBA.COMPLETED_NO), ChannelUnavailable),
    (CORBA.UNKNOWN(0, CORBA.COMPLETED_MAYBE), ChannelUnavailable),
])
def test_each_channel_exception_has_one_meaning_for_the_core(exc: BaseException, kind: type) -> None:
    def fail() -> None:
        raise exc

    with pytest.raises(kind) as caught:
        F.channel_call(fail)
    assert caught.value.__cause__ is exc
    assert F.channel_error(ValueError("not the channel's")) is None


def test_an_event_refused_for_its_qos_or_size_carries_the_reason_the_dead_letter_gives() -> None:
    qos = F.channel_error(CORBA.BAD_QOS(0, CORBA.COMPLETED_NO))
    big = F.channel_error(CORBA.IMP_LIMIT(MINOR_EVENT_TOO_LARGE, CORBA.COMPLETED_NO))
    assert isinstance(qos, EventRefused) and "BAD_QOS" in qos.reason
    assert isinstance(big, EventRefused) and "too large" in big.reason


def test_the_push_receiver_answers_transient_when_the_core_defers() -> None:
    transport = TwinTransport()
    flow = out_flow(transport)
    flow.bridge.started = False      # type: ignore[attr-defined]
    receiver = F.StructuredPushReceiver(flow)
    with pytest.raises(CORBA.TRANSIENT):
        receiver.push_structured_event("a")
    flow.bridge.started = True       # type: ignore[attr-defined]
    receiver.push_structured_event("a")
    assert transport.bodies() == ["a"]


def _delivery(mid: str, body: str) -> Delivery:
    return Delivery(message=JmsMessage(BodyType.TEXT, body), headers={"content-length": "1"}, body=body.encode(),
                    subscription="s", ack_id=mid, message_id=mid, destination="/queue/in", redelivered=False)


def test_a_sequence_proxy_finds_the_refused_event_with_batches_of_one() -> None:
    """A SequenceProxyPushConsumer has push_structured_events only. When the channel refused a batch (BAD_QOS),
    the loop looked for the bad event with push_structured_event, which such a proxy reference does not have: an
    AttributeError every round, and the batch was never delivered nor dead-lettered."""
    transport = TwinTransport()
    flow = in_flow(transport, [_delivery("m1", "a"), _delivery("m2", "bad"), _delivery("m3", "c")])
    stop = threading.Event()

    class SequenceProxy:                  # the operations of CosNotifyChannelAdmin::SequenceProxyPushConsumer
        def __init__(self) -> None:
            self.taken: list[Any] = []

        def push_structured_events(self, events: list[Any]) -> None:
            if ("event", "bad") in events:
                raise CORBA.BAD_QOS(0, CORBA.COMPLETED_NO)
            self.taken += events

    proxy = SequenceProxy()
    flow.bridge.local_push_proxy = lambda: None     # type: ignore[attr-defined]  # a BestEffort channel: over the ORB
    F.PushSenderLoop(flow, proxy, True, lambda: 3, lambda: 0.0, True, stop)._round()
    assert proxy.taken == [("event", "a"), ("event", "c")]
    assert sorted(transport.acked) == ["m1", "m2", "m3"]
    [dead] = transport.dead_letters()
    assert "BAD_QOS" in str(dead.properties["nsjms_dlq_reason"].value)


def test_the_pull_receiver_keeps_its_unsent_batch_across_a_restart() -> None:
    transport = TwinTransport(failures=[])
    flow = out_flow(transport)

    class PullProxy:
        def __init__(self, batches: list[list[Any]]) -> None:
            self.batches = batches

        def try_pull_structured_events(self, n: int) -> tuple[list[Any], bool]:
            if not self.batches:
                raise CORBA.OBJECT_NOT_EXIST(0, CORBA.COMPLETED_NO)
            batch = self.batches.pop(0)
            return batch, bool(batch)

    receiver = F.SequencePullReceiver(flow, None, lambda: 0.0, threading.Event())
    receiver.attach(PullProxy([["a", "b"]]), threading.Event())
    receiver.run()                    # pulls a, b; then the proxy is gone: the bridge is told
    assert transport.bodies() == ["a", "b"] and flow.bridge.disconnected == 1   # type: ignore[attr-defined]
