"""The decisions of the broker dead-letter operations, without a broker (router/deadletter/broker.py): where a retry
goes or why it is refused, what the copy carries, how a message is summarised; and the operations' refusals and operator
log over a stand-in browser (the real broker: tests/integration/test_broker_dead_letters.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from router.deadletter.broker import (
    AMQ_DLQ,
    NSJMS_DLQ,
    BrokerDeadLetterOps,
    BrokerDown,
    Record,
    Refused,
    copy_for_retry,
    retry_target,
    summary,
)
from router.jms.browsing import Browse, BrowsedMessage, OutgoingCopy
from router.jms.errors import BrokerUnavailable, UnconfirmedOutcome


def _msg(queue: str, body: bytes = b"x", **headers: str) -> BrowsedMessage:
    return BrowsedMessage(f"/queue/{queue}", "ID:m-1", {"message-id": "ID:m-1", "destination": f"/queue/{queue}",
                                                        **headers}, body)


def test_where_a_retry_goes_by_queue_and_origin() -> None:
    msg = _msg(NSJMS_DLQ, nsjms_dlq_origin="message", nsjms_dlq_destination="/queue/in")
    assert retry_target(NSJMS_DLQ, msg)[0] == "/queue/in"
    assert retry_target(NSJMS_DLQ, _msg(NSJMS_DLQ, nsjms_dlq_origin="message"))[0] is None
    event = _msg(NSJMS_DLQ, nsjms_dlq_origin="event", nsjms_dlq_bridge="4")
    assert retry_target(NSJMS_DLQ, event)[0] is None and "name the destination" in retry_target(NSJMS_DLQ, event)[1]
    assert retry_target(NSJMS_DLQ, event, event_to="/topic/t")[0] == "/topic/t"
    assert retry_target(NSJMS_DLQ, event, event_to=f"/queue/{NSJMS_DLQ}")[0] is None
    assert "bridge 4's JMS destination" in summary(NSJMS_DLQ, event)["retry"] and summary(NSJMS_DLQ, event)[
        "retryable"]
    assert not summary(NSJMS_DLQ, _msg(NSJMS_DLQ, nsjms_dlq_origin="refused"))["retryable"]
    record = retry_target(NSJMS_DLQ, _msg(NSJMS_DLQ, nsjms_dlq_origin="refused", nsjms_dlq_message_id="ID:o"))
    assert record[0] is None and "ID:o" in record[1] and AMQ_DLQ in record[1]
    assert retry_target(NSJMS_DLQ, _msg(NSJMS_DLQ))[1].startswith("not a dead letter of an nsjms bridge")
    assert retry_target(AMQ_DLQ, _msg(AMQ_DLQ, **{"original-destination": "/topic/t"}))[0] == "/topic/t"
    assert retry_target(AMQ_DLQ, _msg(AMQ_DLQ), Record("r", 3, "/queue/src"))[0] == "/queue/src"
    assert retry_target(AMQ_DLQ, _msg(AMQ_DLQ))[0] is None
    assert retry_target(AMQ_DLQ, _msg(AMQ_DLQ, **{"original-destination": f"/queue/{AMQ_DLQ}"}))[0] is None
    empty = retry_target(AMQ_DLQ, _msg(AMQ_DLQ, b"", **{"original-destination": "/queue/q"}))
    assert empty[0] is None and "Map, Stream or Object" in empty[1]
    marked = _msg(AMQ_DLQ, b"", **{"original-destination": "/queue/q", "content-length": "0"})
    assert retry_target(AMQ_DLQ, marked)[0] == "/queue/q"         # an empty BytesMessage is carried


def test_the_copy_keeps_body_properties_and_jms_headers_not_the_broker_s_or_the_reason() -> None:
    msg = _msg(AMQ_DLQ, b"\x00\x01", **{"original-destination": "/queue/q", "content-length": "2", "expires": "5",
                                       "timestamp": "1", "redelivered": "true", "priority": "7", "persistent": "true",
                                       "type": "Order", "colour": "blue", "nsjms_dlq_reason": "r",
                                       "originalExpiration": "5", "nsjms_dedupe_id": "d-1"})
    copy = copy_for_retry(msg, "/queue/q")
    assert copy == OutgoingCopy("/queue/q", {"content-length": "2", "priority": "7", "persistent": "true",
                                             "type": "Order", "colour": "blue", "nsjms_dedupe_id": "d-1"}, b"\x00\x01")


def test_a_summary_names_the_reason_bridge_and_source() -> None:
    row = summary(AMQ_DLQ, _msg(AMQ_DLQ, b"a" * 300, timestamp="1500"), Record("why", 4, "/queue/src"))
    assert (row["reason"], row["bridge"], row["source"], row["at"], row["size"]) == ("why", 4, "/queue/src", 1.5, 300)
    assert row["preview"].endswith("… (300 bytes)") and row["retry_to"] == "/queue/src"
    plain = summary(AMQ_DLQ, _msg(AMQ_DLQ, b"\xff", dlqDeliveryFailureCause="poison"))
    assert plain["reason"] == "poison" and plain["preview"] == "\\xff" and plain["bridge"] is None


class StandIn:
    """A DestinationBrowser over a dict of queues; ``fail`` raises from every call."""

    def __init__(self, queues: dict[str, list[BrowsedMessage]], fail: Exception | None = None) -> None:
        self.queues, self.fail, self.sent = queues, fail, list[OutgoingCopy]()

    def browse(self, destination: str, *, selector: str | None = None, limit: int = 1000) -> Browse:
        if self.fail:
            raise self.fail
        found = [m for m in self.queues.get(destination, []) if selector is None or m.message_id in selector
                 or ("nsjms_dlq_origin" in selector and m.headers.get("nsjms_dlq_origin") == "refused")]
        return Browse(found[:limit], True)

    def settle(self, destination: str, message_id: str,
               copy: Callable[[BrowsedMessage], OutgoingCopy] | None = None, *,
               wait_s: float = 10.0) -> BrowsedMessage | None:
        if self.fail:
            raise self.fail
        found = [m for m in self.queues.get(destination, []) if m.message_id == message_id]
        if not found:
            return None
        if copy is not None:
            self.sent.append(copy(found[0]))
        self.queues[destination].remove(found[0])
        return found[0]


def test_the_operations_refuse_record_and_report_the_broker_down(tmp_path: Path) -> None:
    broker = StandIn({f"/queue/{AMQ_DLQ}": [_msg(AMQ_DLQ, b"body", **{"original-destination": "/queue/q"})]})
    ops = BrokerDeadLetterOps("n1", tmp_path, lambda: broker)
    assert ops.retry(AMQ_DLQ, "ID:m-1", "op", "why")["to"] == "/queue/q"
    assert [c.destination for c in broker.sent] == ["/queue/q"]
    with pytest.raises(Refused, match="no message ID:m-1"):
        ops.discard(AMQ_DLQ, "ID:m-1", "op", "again")
    with pytest.raises(Refused, match="not a dead-letter queue"):
        ops.retry("orders", "ID:m-1", "op", "")
    down = BrokerDeadLetterOps("n1", tmp_path, lambda: StandIn({}, BrokerUnavailable("connection refused")))
    with pytest.raises(BrokerDown, match="not reachable"):
        down.listing(NSJMS_DLQ)
    unknown = BrokerDeadLetterOps("n1", tmp_path, lambda: StandIn({}, UnconfirmedOutcome("no receipt", "COMMIT")))
    with pytest.raises(BrokerDown):
        unknown.discard(NSJMS_DLQ, "ID:x", "op", "w")
    log = [json.loads(line) for line in (tmp_path / "txn-operator.log").read_text().splitlines()]
    assert [(e["action"], "done" if isinstance(e["result"], dict) else e["result"][:7]) for e in log] == [
        ("broker deadletter retry", "done"), ("broker deadletter discard", "refused"),
        ("broker deadletter retry", "refused"), ("broker deadletter discard", "failed:")]


def test_the_cli_finds_the_configured_or_the_embedded_broker(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from router.cli.brokerdlq import NoBroker, broker_ops

    def cfg(url: str = "", login: str = "", passcode: str = "") -> SimpleNamespace:
        return SimpleNamespace(node=SimpleNamespace(state_dir=str(tmp_path), node_id="n1"),
                               broker=SimpleNamespace(url=url, login=login, passcode=passcode, connect_timeout_s=5))

    with pytest.raises(NoBroker, match="is not configured and no node runs"):
        broker_ops(cfg())
    given = broker_ops(cfg("stomp://10.0.0.1:61613", "app", "pw")).broker()
    assert (given.url, given._credentials) == ("stomp://10.0.0.1:61613", ("app", "pw"))
    (tmp_path / "endpoints.json").write_text(json.dumps({"broker_url": "stomp://127.0.0.1:5555"}))
    (tmp_path / "activemq").mkdir()
    (tmp_path / "activemq" / "credentials").write_text("nsjms\nsecret-pass\n")
    embedded = broker_ops(cfg()).broker()
    assert (embedded.url, embedded._credentials) == ("stomp://127.0.0.1:5555",
                                                     ("nsjms", "secret-pass"))


def test_an_event_dead_letter_is_mapped_again_or_refused_with_the_reason() -> None:
    import omniORB
    from omniORB import CORBA

    import CosNotification

    from router.deadletter.broker_event import EventUnmappable, event_copy, sink_destination

    CORBA.ORB_init(["test"], CORBA.ORB_ID)
    fixed = CosNotification.FixedEventHeader(CosNotification.EventType("d", "t"), "e1")
    event = CosNotification.StructuredEvent(
        CosNotification.EventHeader(fixed, []),
        [CosNotification.Property("n", CORBA.Any(CORBA.TC_long, 7))], CORBA.Any(CORBA.TC_string, "the body"))
    cdr = bytes(omniORB.cdrMarshal(CosNotification._tc_StructuredEvent, event))
    copy = event_copy(_msg(NSJMS_DLQ, cdr, nsjms_dlq_origin="event"), "/queue/out")
    assert copy.destination == "/queue/out" and copy.headers["$fd_n"] == "7" and b"the body" in copy.body
    with pytest.raises(EventUnmappable, match="not a StructuredEvent"):
        event_copy(_msg(NSJMS_DLQ, b"\x00\x01cdr"), "/queue/out")
    assert [sink_destination(s) for s in ("queue:a.b (push)", "topic:t [jms-json] (pull)", "channel:3 (push)")] == [
        "/queue/a.b", "/topic/t", None]


def test_a_discard_is_refused_on_a_queue_that_is_not_a_dead_letter_queue(tmp_path: Path) -> None:
    """The review's finding: discard did not check the queue (retry did, through its look-up), so the shared
    operations consumed by id from any queue a caller named (an ActiveMQ composite name ``a,b`` included)."""
    broker = StandIn({"/queue/orders": [_msg("orders", b"body")]})
    ops = BrokerDeadLetterOps("n1", tmp_path, lambda: broker)
    for queue in ("orders", f"orders,{AMQ_DLQ}"):
        with pytest.raises(Refused, match="not a dead-letter queue"):
            ops.discard(queue, "ID:m-1", "op", "why")
    assert broker.sent == []
