"""The broker's dead-letter queues (``nsjms.DLQ``, ``ActiveMQ.DLQ``) browsed, retried and discarded against a real
ActiveMQ (router/deadletter/broker.py, router/jms/stomp/browse.py, ``nsjms deadletter broker``).

* A real JMS -> channel bridge dead-letters an expired message (a past ``expires``) to ``nsjms.DLQ``; it is listed
  with its reason, the bridge and its source; retried, the copy (no expiry) goes back to the bridge's source and
  reaches the channel's standard-stub consumer once; it is gone from the DLQ; the action is in the operator log.
* A message NACKed to ``ActiveMQ.DLQ`` by a stomp.py consumer, with the ``refused`` record a bridge writes to
  ``nsjms.DLQ``: listed with the record's reason and bridge; retried, an independent stomp.py consumer of its
  original queue receives it once with its body and properties; another is discarded and gone.
* A connection lost between the copy's SEND and the COMMIT (injected at that point) leaves the dead letter where it
  was and sends nothing; a retry afterwards moves it once.
* Refusals: an ``event`` dead letter, a ``refused`` record, an empty (Map/Stream/Object) original, an unknown id.
* The CLI (``nsjms deadletter broker list|show|retry|discard --json``) on the same operations.
"""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp

import omniORB

import CosNotification

from idl.generated import CosBridgeAdmin as BA
from router.deadletter.broker import AMQ_DLQ, NSJMS_DLQ, BrokerDeadLetterOps, Refused
from router.jms.stomp import browse as browse_mod
from router.jms.stomp.browse import StompBrowser
from router.routing.t2.ops import AUDIT_FILE

from bridgekit import bridge_factory, channel_ep, jms_ep
from conftest import NsjmsServer
from stdclients import (
    Form,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    make_event,
    obtain_proxy_supplier,
    prop,
    short,
)

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0


def _name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def _host_port(broker_url: str) -> tuple[str, int]:
    host, port = broker_url.removeprefix("stomp://").split(":")
    return host, int(port)


class _Client(stomp.ConnectionListener):  # type: ignore[misc]
    """An independent stomp.py client: its frames in a queue."""

    def __init__(self, broker_url: str) -> None:
        self.frames: queue.Queue[Any] = queue.Queue()
        self.conn = stomp.Connection12([_host_port(broker_url)], auto_content_length=False, auto_decode=False)
        self.conn.set_listener("t", self)
        self.conn.connect(wait=True)

    def on_message(self, frame: Any) -> None:
        self.frames.put(frame)

    def send(self, dest: str, body: bytes, **headers: str) -> None:
        self.conn.send(dest, body, headers={"persistent": "true", "receipt": uuid.uuid4().hex, **headers})

    def take(self, timeout: float) -> Any:
        try:
            return self.frames.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.conn.disconnect()

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@pytest.fixture
def client(broker_url: str) -> Iterator[_Client]:
    c = _Client(broker_url)
    yield c
    c.close()


@pytest.fixture
def ops(tmp_path: Path, broker_url: str) -> BrokerDeadLetterOps:
    return BrokerDeadLetterOps("test-node", tmp_path, lambda: StompBrowser(broker_url, timeout=30.0))


def _nack_to_amq_dlq(client: _Client, source: str, body: bytes, **headers: str) -> str:
    """Send one message to ``source`` and NACK it (ActiveMQ moves it to ActiveMQ.DLQ); its message id."""
    client.send(f"/queue/{source}", body, **headers)
    sub = _name("sub")
    client.conn.subscribe(f"/queue/{source}", id=sub, ack="client-individual")
    frame = client.take(TIMEOUT_S)
    assert frame is not None, f"nothing delivered from {source}"
    client.conn.nack(frame.headers["ack"], receipt=uuid.uuid4().hex)
    client.conn.unsubscribe(sub)
    return str(frame.headers["message-id"])


def _row(ops: BrokerDeadLetterOps, queue_name: str, mid: str) -> dict[str, Any] | None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        rows = [r for r in ops.listing(queue_name, 0, 5000)["dead_letters"] if r["id"] == mid]
        if rows:
            return rows[0]
        time.sleep(0.2)
    return None


def _ids_on(ops: BrokerDeadLetterOps, queue_name: str) -> set[str]:
    return {r["id"] for r in ops.listing(queue_name, 0, 5000)["dead_letters"]}


def _log(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / AUDIT_FILE).read_text().splitlines()]


def _send_raw(broker_url: str, frame: bytes) -> None:
    """One SEND frame byte for byte (a negative ``expires``, which stomp.py would not mind either), receipted."""
    with socket.create_connection(_host_port(broker_url), timeout=10) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        got = b""
        while b"CONNECTED" not in got:
            got += sock.recv(65536)
        head, _, body = frame.partition(b"\n\n")
        sock.sendall(head + b"\nreceipt:r1\n\n" + body + b"\x00")
        while b"receipt-id:r1" not in got:
            chunk = sock.recv(65536)
            assert chunk and not chunk.startswith(b"ERROR"), chunk[:300]
            got += chunk
        sock.sendall(b"DISCONNECT\n\n\x00")


def test_a_bridge_dead_letter_is_listed_retried_back_to_its_source_and_reaches_the_channel(
        nsjms_server: NsjmsServer, client_orb: Any, factory: Any, broker_url: str, ops: BrokerDeadLetterOps,
        tmp_path: Path) -> None:
    source = _name("bdl.src")
    qos = [prop("EventReliability", short(CosNotification.Persistent)),
           prop("ConnectionReliability", short(CosNotification.Persistent))]
    channel, cid = factory.create_channel(qos, [])
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)
    bridge, bid = bridge_factory(client_orb, nsjms_server).create_bridge(jms_ep(BA.SOURCE, source),
                                                                         channel_ep(BA.SINK, cid))
    bridge.start_bridge()
    _send_raw(broker_url, f"SEND\ndestination:/queue/{source}\npersistent:true\nmark:late\nexpires:-5\n"
                          "content-length:4\n\nlate".encode())

    # the bridge dead-letters it (expired); find it by its source
    deadline, row = time.monotonic() + TIMEOUT_S, None
    while row is None and time.monotonic() < deadline:
        rows = [r for r in ops.listing(NSJMS_DLQ, 0, 5000)["dead_letters"] if r["source"] == f"/queue/{source}"]
        row = rows[0] if rows else None
        time.sleep(0.2)
    assert row is not None, "the bridge did not dead-letter the expired message to nsjms.DLQ"
    assert "expired" in row["reason"], row
    assert row["bridge"] == bid and row["origin"] == "message", row
    assert row["retry_to"] == f"/queue/{source}" and row["preview"] == "late", row
    assert consumer.count() == 0, "an expired message became an event"

    shown = ops.show(NSJMS_DLQ, row["id"])
    assert shown["reason"] == row["reason"] and shown["headers"]["nsjms_dlq_origin"] == "message", shown

    result = ops.retry(NSJMS_DLQ, row["id"], "tester", "expiry was a clock error")
    assert result["retried"] and result["to"] == f"/queue/{source}", result
    assert consumer.wait_for(1, TIMEOUT_S), "the retried message did not reach the channel through its bridge"
    bodies = [bytes(ev.remainder_of_body.value()) for ev in consumer.snapshot()]   # the dead letter keeps the body
    assert bodies == [b"late"], bodies
    marks = [{p.name: p.value.value() for p in ev.filterable_data}.get("mark") for ev in consumer.snapshot()]
    assert marks == ["late"], f"the dead letter keeps the original's properties, so its retry carries them: {marks}"
    assert row["id"] not in _ids_on(ops, NSJMS_DLQ), "the retried dead letter is still on nsjms.DLQ"
    assert not [r for r in ops.listing(NSJMS_DLQ, 0, 5000)["dead_letters"] if r["source"] == f"/queue/{source}"], \
        "the retry was dead-lettered again"
    entry = _log(tmp_path)[-1]
    assert (entry["action"], entry["who"], entry["why"]) == ("broker deadletter retry", "tester",
                                                             "expiry was a clock error")
    assert entry["target"] == f"{NSJMS_DLQ} {row['id']}" and entry["result"]["retried"] is True
    time.sleep(1.0)                      # nothing more arrives (one copy, not two)
    assert consumer.count() == 1
    bridge.destroy()

    # an event a channel -> JMS bridge dead-lettered (its CDR encoding): `nsjms deadletter broker retry` asks the
    # running node for the bridge's destination and sends the event mapped again as the bridge maps it
    out = _name("bdl.out")
    _, out_bid = bridge_factory(client_orb, nsjms_server).create_bridge(channel_ep(BA.SOURCE, cid),
                                                                        jms_ep(BA.SINK, out))
    cdr = bytes(omniORB.cdrMarshal(CosNotification._tc_StructuredEvent, make_event(7)))
    with _Client(broker_url) as producer:
        producer.send(f"/queue/{NSJMS_DLQ}", cdr, nsjms_dlq_origin="event", nsjms_dlq_bridge=str(out_bid),
                      nsjms_dlq_reason=f"broker refused the message: not authorized {out}",
                      **{"content-length": str(len(cdr))})
    [event_dl] = _wait_rows(ops, NSJMS_DLQ, lambda r: out in r["reason"])
    assert f"bridge {out_bid}'s JMS destination" in event_dl["retry"], event_dl
    proc = subprocess.run([sys.executable, "-m", "router.cli", "deadletter", "broker", "retry", NSJMS_DLQ,
                           event_dl["id"], "--why", "authorised now", "--json", "--state-dir",
                           str(nsjms_server.state_dir)], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["to"] == f"/queue/{out}", proc.stdout
    with _Client(broker_url) as reader:
        reader.conn.subscribe(f"/queue/{out}", id="out", ack="auto")
        got = reader.take(TIMEOUT_S)
        assert got is not None, "the retried event did not reach the bridge's destination"
        assert got.headers["$fd_n"] == "7" and got.headers["$event_name"] == "e7", got.headers
        assert reader.take(1.0) is None, "a second copy arrived"
    assert event_dl["id"] not in _ids_on(ops, NSJMS_DLQ)


def test_an_activemq_dlq_message_is_shown_with_its_record_retried_to_its_origin_and_discarded(
        client: _Client, broker_url: str, ops: BrokerDeadLetterOps, tmp_path: Path) -> None:
    source = _name("bdl.amq")
    keep = _nack_to_amq_dlq(client, source, b"retry me", colour="blue", type="Order")
    drop = _nack_to_amq_dlq(client, source, b"drop me")
    client.send(f"/queue/{NSJMS_DLQ}", b"", nsjms_dlq_origin="refused", nsjms_dlq_bridge="77",
                nsjms_dlq_reason="why it was refused", nsjms_dlq_message_id=keep,
                nsjms_dlq_destination=f"/queue/{source}", nsjms_dlq_moved_to=AMQ_DLQ)

    row = _row(ops, AMQ_DLQ, keep)
    assert row is not None, "the NACKed message is not listed on ActiveMQ.DLQ"
    assert (row["reason"], row["bridge"], row["source"]) == ("why it was refused", 77, f"/queue/{source}"), row
    assert row["retry_to"] == f"/queue/{source}" and row["headers"]["colour"] == "blue", row
    other = _row(ops, AMQ_DLQ, drop)
    assert other is not None and other["reason"].startswith("not recorded"), other

    result = ops.retry(AMQ_DLQ, keep, "tester", "fixed the consumer")
    assert result["to"] == f"/queue/{source}", result
    client.conn.subscribe(f"/queue/{source}", id="back", ack="auto")
    got = client.take(TIMEOUT_S)
    assert got is not None, "the retried message did not reach its original queue"
    assert got.body == b"retry me" and got.headers["colour"] == "blue" and got.headers["type"] == "Order", got.headers
    assert got.headers["message-id"] != keep and "nsjms_dlq_reason" not in got.headers
    assert client.take(1.0) is None, "a second copy arrived"
    assert keep not in _ids_on(ops, AMQ_DLQ)

    done = ops.discard(AMQ_DLQ, drop, "tester", "test data")
    assert done["discarded"], done
    assert drop not in _ids_on(ops, AMQ_DLQ)
    assert client.take(1.0) is None, "a discarded message was sent somewhere"
    with pytest.raises(Refused, match="no message"):
        ops.discard(AMQ_DLQ, drop, "tester", "again")
    actions = [(e["action"], e["target"].split()[-1], "refused" if isinstance(e["result"], str) else "done")
               for e in _log(tmp_path)]
    assert actions == [("broker deadletter retry", keep, "done"), ("broker deadletter discard", drop, "done"),
                       ("broker deadletter discard", drop, "refused")], actions


def test_a_connection_lost_before_the_commit_leaves_the_dead_letter_and_sends_nothing(
        client: _Client, ops: BrokerDeadLetterOps, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _name("bdl.crash")
    mid = _nack_to_amq_dlq(client, source, b"once")
    assert _row(ops, AMQ_DLQ, mid) is not None
    real = browse_mod._Session.receipted
    cut: list[str] = []

    def cut_before_commit(self: Any, what: str, action: Any) -> None:
        if what == "COMMIT":                 # the copy is SENT and the original ACKed inside the transaction
            cut.append(what)
            self.conn.transport.disconnect_socket()
        real(self, what, action)

    monkeypatch.setattr(browse_mod._Session, "receipted", cut_before_commit)
    with pytest.raises(Exception):  # noqa: B017 - BrokerDown or a transport error: the outcome is the point
        ops.retry(AMQ_DLQ, mid, "tester", "crash")
    assert cut == ["COMMIT"]
    monkeypatch.setattr(browse_mod._Session, "receipted", real)
    assert _row(ops, AMQ_DLQ, mid) is not None, "the dead letter was lost with the connection"
    client.conn.subscribe(f"/queue/{source}", id="back", ack="auto")
    assert client.take(2.0) is None, "the copy was sent although the transaction never committed"
    ops.retry(AMQ_DLQ, mid, "tester", "again")
    got = client.take(TIMEOUT_S)
    assert got is not None and got.body == b"once"
    assert client.take(1.0) is None, "a second copy arrived"
    assert mid not in _ids_on(ops, AMQ_DLQ)


def test_what_cannot_be_retried_is_refused_and_kept(client: _Client, ops: BrokerDeadLetterOps,
                                                     tmp_path: Path) -> None:
    source = _name("bdl.refuse")
    empty = _nack_to_amq_dlq(client, source, b"")              # as a Java MapMessage arrives over STOMP
    client.send(f"/queue/{NSJMS_DLQ}", b"\x00\x01cdr", nsjms_dlq_origin="event", nsjms_dlq_bridge="5",
                nsjms_dlq_reason=f"mapping failed {source}", **{"content-length": "5"})
    event = next(r["id"] for r in _wait_rows(ops, NSJMS_DLQ, lambda r: source in r["reason"]))
    assert _row(ops, AMQ_DLQ, empty) is not None
    with pytest.raises(Refused, match="Map, Stream or Object"):
        ops.retry(AMQ_DLQ, empty, "tester", "")
    with pytest.raises(Refused, match="name the destination"):        # its bridge 5 is not known here
        ops.retry(NSJMS_DLQ, event, "tester", "")
    with pytest.raises(Refused, match="not a StructuredEvent"):        # its body is no event
        ops.retry(NSJMS_DLQ, event, "tester", "", to=f"/queue/{source}")
    with pytest.raises(Refused, match="no message"):
        ops.retry(AMQ_DLQ, "ID:no-such-message", "tester", "")
    with pytest.raises(Refused, match="not a dead-letter queue"):
        ops.listing("some.queue")
    assert empty in _ids_on(ops, AMQ_DLQ) and event in _ids_on(ops, NSJMS_DLQ), "a refused retry consumed it"
    assert [str(e["result"]).split(":")[0] for e in _log(tmp_path)] == ["refused"] * 4
    ops.discard(AMQ_DLQ, empty, "tester", "cleanup")
    ops.discard(NSJMS_DLQ, event, "tester", "cleanup")


def _wait_rows(ops: BrokerDeadLetterOps, queue_name: str, which: Any) -> list[dict[str, Any]]:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        rows = [r for r in ops.listing(queue_name, 0, 5000)["dead_letters"] if which(r)]
        if rows:
            return rows
        time.sleep(0.2)
    raise AssertionError(f"nothing matching on {queue_name}")


def test_the_cli_lists_shows_retries_and_discards(client: _Client, broker_url: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from router.cli import main

    source = _name("bdl.cli")
    first = _nack_to_amq_dlq(client, source, b"one")
    second = _nack_to_amq_dlq(client, source, b"two")
    config = tmp_path / "nsjms.toml"
    config.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[broker]\nurl = "{broker_url}"\n')
    (tmp_path / "state").mkdir()
    base = ["--config", str(config)]

    assert main(["deadletter", "broker", "list", AMQ_DLQ, "--json", *base]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {first, second} <= {r["id"] for r in listed[0]["dead_letters"]}, listed
    assert main(["deadletter", "broker", "show", AMQ_DLQ, first, *base]) == 0
    text = capsys.readouterr().out
    assert f"back to /queue/{source}" in text and "body        one" in text, text
    assert main(["deadletter", "broker", "retry", AMQ_DLQ, first, "--why", "cli", "--json", *base]) == 0
    assert json.loads(capsys.readouterr().out)[0]["to"] == f"/queue/{source}"
    assert main(["deadletter", "broker", "retry", NSJMS_DLQ, "ID:x", "--to", "channel:1", *base]) == 2
    assert "want queue:NAME or topic:NAME" in capsys.readouterr().err
    assert main(["deadletter", "broker", "discard", AMQ_DLQ, second, "--why", "cli", *base]) == 2   # no --yes
    capsys.readouterr()
    assert main(["deadletter", "broker", "discard", AMQ_DLQ, second, "ID:none", "--yes", "--why", "cli",
                 *base]) == 4                     # the unknown one refused, the other still done
    err = capsys.readouterr().err
    assert "ID:none: refused" in err, err
    client.conn.subscribe(f"/queue/{source}", id="back", ack="auto")
    got = client.take(TIMEOUT_S)
    assert got is not None and got.body == b"one"
    assert client.take(1.0) is None
    assert not {first, second} & {r["id"] for r in
                                  BrokerDeadLetterOps("n", tmp_path, lambda: StompBrowser(broker_url))
                                  .listing(AMQ_DLQ, 0, 5000)["dead_letters"]}
    log = [json.loads(line) for line in (tmp_path / "state" / AUDIT_FILE).read_text().splitlines()]
    assert [e["action"] for e in log] == ["broker deadletter retry", "broker deadletter discard",
                                          "broker deadletter discard"]


def test_a_send_without_its_receipt_rolls_the_transaction_back(client: _Client, ops: BrokerDeadLetterOps,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy's SEND written in the transaction but its receipt never seen (injected): reported as nothing done,
    and nothing is (the connection's close aborts the transaction): the dead letter kept, no copy."""
    from router.deadletter.broker import BrokerDown
    from router.jms.errors import UnconfirmedOutcome

    source = _name("bdl.noreceipt")
    mid = _nack_to_amq_dlq(client, source, b"kept")
    assert _row(ops, AMQ_DLQ, mid) is not None
    real = browse_mod._Session.receipted

    def lost_receipt(self: Any, what: str, action: Any) -> None:
        if what == "SEND":
            self.write(what, lambda: action("never-answered"))     # written, its receipt id unknown to us
            raise UnconfirmedOutcome("injected: no receipt", what)
        real(self, what, action)

    monkeypatch.setattr(browse_mod._Session, "receipted", lost_receipt)
    with pytest.raises(BrokerDown, match="nothing done"):
        ops.retry(AMQ_DLQ, mid, "tester", "no receipt")
    monkeypatch.setattr(browse_mod._Session, "receipted", real)
    assert _row(ops, AMQ_DLQ, mid) is not None, "the dead letter was consumed"
    client.conn.subscribe(f"/queue/{source}", id="back", ack="auto")
    assert client.take(2.0) is None, "the copy was sent although the transaction was never committed"
    ops.discard(AMQ_DLQ, mid, "tester", "cleanup")
