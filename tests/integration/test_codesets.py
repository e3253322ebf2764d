"""Non-Latin-1 and invalid text both ways, to consumers of different native code sets (issue 31).

Before: a JMS message holding any character outside ISO-8859-1 (``currency:€``, ``price 5 € 中文``, an emoji, or
invalid UTF-8 bytes, which the broker turns into U+FFFD) reached the channel, and every push to a standard
omniORBpy consumer (native char code set ISO-8859-1) failed with ``DATA_CONVERSION`` ``CannotMapChar``: after 3
tries the channel dead-lettered (deleted) it. The same happened to a CORBA supplier's ``string`` holding such
characters.

Here three independent consumer processes (OMG stubs only, nothing from ``router``) run with native char code sets
ISO-8859-1 (omniORB's default), UTF-8 and ISO-8859-15; each gets its own structured push proxy on one channel and
prints what it receives. Messages are SENT to the broker with raw STOMP frames (so headers and bodies can hold
any bytes); a JMS -> channel bridge forwards them. Every message must reach every consumer exactly once, with the
text of docs/mapping.md ("Text and code sets"): a JMS String outside ISO-8859-1 arrives as a ``wstring`` with its
exact text; a name the consumer's code set cannot carry arrives ``\\u``-escaped; invalid UTF-8 arrives as U+FFFD.
The reverse path: a CORBA supplier's non-Latin-1 ``string`` / ``wstring`` values reach a stomp.py consumer as the
same text.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import stomp

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)
from omniORB import CORBA

import CosNotification

from idl.generated import CosBridgeAdmin as BA

from bridgekit import JavaTool, bridge_factory, channel_ep, jms_ep, persistent_channel, structured_supplier
from stdclients import Form, Style, obtain_proxy_supplier, prop

pytestmark = pytest.mark.integration

DEADLINE_S = 90.0
CODE_SETS = {"latin1": [], "utf8": ["-ORBnativeCharCodeSet", "UTF-8"],
             "latin9": ["-ORBnativeCharCodeSet", "ISO-8859-15"]}

CONSUMER = r"""
import json, sys
import omniORB, omniORB.codesets
from omniORB import CORBA
import CosNotifyComm__POA

orb = CORBA.ORB_init(["consumer", "-ORBendPoint", "giop:tcp:127.0.0.1:"] + sys.argv[1:], CORBA.ORB_ID)
poa = orb.resolve_initial_references("RootPOA")
poa._get_the_POAManager().activate()

def item(any_):
    kind = str(any_.typecode().kind()).rsplit("_", 1)[-1]
    value = any_.value()
    return [kind, value if isinstance(value, (str, int, float, bool)) or value is None else repr(value)]

class Consumer(CosNotifyComm__POA.StructuredPushConsumer):
    def push_structured_event(self, ev):
        t = ev.header.fixed_header
        print(json.dumps({"domain": t.event_type.domain_name, "type": t.event_type.type_name,
                          "name": t.event_name, "fd": [[p.name, item(p.value)] for p in ev.filterable_data],
                          "body": item(ev.remainder_of_body)}), flush=True)
    def offer_change(self, added, removed):
        pass
    def disconnect_structured_push_consumer(self):
        pass

print("IOR " + orb.object_to_string(Consumer()._this()), flush=True)
orb.run()
"""


class ConsumerProcess:
    """A standard-stub structured push consumer in its own process, with its own native code sets."""

    def __init__(self, name: str, orb_args: list[str]) -> None:
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-c", CONSUMER, *orb_args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, encoding="ascii")
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        assert first.startswith("IOR "), f"{name}: {first!r} {self.proc.stderr.read() if self.proc.stderr else ''}"
        self.ior = first[4:].strip()
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.events.append(json.loads(line))

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._reader.join(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def consumers() -> Iterator[dict[str, ConsumerProcess]]:
    started: dict[str, ConsumerProcess] = {}
    try:
        for name, args in CODE_SETS.items():
            started[name] = ConsumerProcess(name, args)
        yield started
    finally:
        for c in started.values():
            c.stop()


def connect(channel: Any, consumer: ConsumerProcess, orb: Any) -> None:
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    proxy.connect_structured_push_consumer(orb.string_to_object(consumer.ior))


def wait_until(cond: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def fd(event: dict[str, Any]) -> dict[str, list[Any]]:
    return {name: value for name, value in event["fd"]}


# ------------------------------------------------------------------------------------------ raw STOMP producer
def _read_until(sock: socket.socket, marker: bytes) -> None:
    got = b""
    while marker not in got:
        chunk = sock.recv(65536)
        assert chunk, f"the broker closed the connection before {marker!r}"
        assert not got.startswith(b"ERROR"), got[:500]
        got += chunk


def stomp_send_raw(broker_url: str, queue: str, messages: list[tuple[list[bytes], bytes]]) -> None:
    """SEND each (header lines, body) persistently with a receipt; no content-length (a JMS TextMessage)."""
    host, port = broker_url.removeprefix("stomp://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        _read_until(sock, b"CONNECTED")
        for i, (headers, body) in enumerate(messages):
            head = f"SEND\ndestination:/queue/{queue}\npersistent:true\nreceipt:r{i}\n".encode()
            sock.sendall(head + b"".join(h + b"\n" for h in headers) + b"\n" + body + b"\x00")
            _read_until(sock, f"receipt-id:r{i}".encode())
        sock.sendall(b"DISCONNECT\n\n\x00")


REPLACEMENT = "\ufffd"
# (header lines, body): the header n names the message
JMS_MESSAGES: list[tuple[list[bytes], bytes]] = [
    ([b"n:0", "currency:€".encode()], b"plain"),
    ([b"n:1"], "price 5 € 中文".encode()),
    ([b"n:2", "mood:😀".encode()], "smile 😀".encode()),
    ([b"n:3", b"bad:ok \xff\xfe end"], b"header with invalid UTF-8"),
    ([b"n:4"], b"body \xff\xfe invalid"),
    ([b"n:5", "city:café".encode()], "café".encode()),
    ([b"n:6", "名前:値".encode()], b"cjk name"),
]


def stomp_receive(broker_url: str, destination: str, n: int, selector: str | None = None
                  ) -> list[tuple[dict[str, str], bytes]]:
    """``n`` messages from ``destination`` with stomp.py (auto ack, bodies as bytes), then 0.5 s for any extra."""
    got: list[tuple[dict[str, str], bytes]] = []
    lock = threading.Lock()

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            with lock:
                got.append((dict(frame.headers), frame.body))

    host, port = broker_url.removeprefix("stomp://").split(":")
    conn = stomp.Connection([(host, int(port))], auto_content_length=False, auto_decode=False)
    conn.set_listener("l", Listener())
    conn.connect(wait=True)
    try:
        headers = {"selector": selector} if selector else {}
        conn.subscribe(destination, id="1", ack="auto", headers=headers)
        wait_until(lambda: len(got) >= n, f"{n} messages on {destination}")
        time.sleep(0.5)
    finally:
        conn.disconnect()
    with lock:
        return list(got)


def test_jms_text_reaches_consumers_of_every_code_set(module_server: Any, shared_factory: Any, client_orb: Any,
                                                      broker_url: str,
                                                      consumers: dict[str, ConsumerProcess]) -> None:
    channel, cid = persistent_channel(shared_factory)
    for c in consumers.values():
        connect(channel, c, client_orb.orb)
    queue = f"codesets.in.{uuid.uuid4().hex[:8]}"
    bridge, bid = bridge_factory(client_orb, module_server).create_bridge(jms_ep(BA.SOURCE, queue),
                                                                           channel_ep(BA.SINK, cid))
    bridge.start_bridge()
    stomp_send_raw(broker_url, queue, JMS_MESSAGES)

    # message 4's text body is not UTF-8: dead-lettered with the reason and its bytes intact, never dropped
    dead = stomp_receive(broker_url, "/queue/nsjms.DLQ", 1,
                         f"nsjms_dlq_bridge = '{bid}' AND nsjms_dlq_destination = '/queue/{queue}'")
    assert len(dead) == 1, dead
    headers, body = dead[0]
    assert "not valid UTF-8" in headers["nsjms_dlq_reason"], headers
    assert body == b"body \xff\xfe invalid"

    delivered = [i for i in range(len(JMS_MESSAGES)) if i != 4]
    for c in consumers.values():
        try:
            wait_until(lambda c=c: len(c.snapshot()) >= len(delivered), f"{len(delivered)} events at {c.name}")
        except AssertionError:
            log = module_server.stderr_path.read_text(errors="replace")
            raise AssertionError(f"{c.name} got {c.snapshot()}\nnode log:\n{log[-6000:]}") from None
    time.sleep(0.5)                                     # nothing more may come: no duplicate
    for name, c in consumers.items():
        events = c.snapshot()
        numbers = sorted(int(fd(e)["n"][1]) for e in events)
        assert numbers == delivered, f"{name}: {numbers}: lost or duplicated"
        by_n = {int(fd(e)["n"][1]): e for e in events}
        # a JMS String outside ISO-8859-1 is a wstring with its exact text, for every consumer (docs/mapping.md)
        assert fd(by_n[0])["currency"] == ["wstring", "€"], name
        assert by_n[1]["body"] == ["wstring", "price 5 € 中文"], name
        assert fd(by_n[2])["mood"] == ["wstring", "😀"] and by_n[2]["body"] == ["wstring", "smile 😀"], name
        # invalid UTF-8 in a header: the replacement character (one per invalid byte); the rest of the text is kept
        assert fd(by_n[3])["bad"] == ["wstring", f"ok {REPLACEMENT}{REPLACEMENT} end"], (name, fd(by_n[3])["bad"])
        # Latin-1 text stays a string
        assert fd(by_n[5])["city"] == ["string", "café"] and by_n[5]["body"] == ["string", "café"], name
        # a property *name* is an IDL string: exact where the negotiated code set carries it (the node's ORB sends
        # UTF-8 to the ISO-8859-15 consumer: it lists UTF-8 among its conversion code sets and the node has no
        # ISO-8859-15 converter), \u-escaped for the ISO-8859-1 one
        expected_name = "\\u540d\\u524d" if name == "latin1" else "名前"
        assert fd(by_n[6]).get(expected_name) == ["wstring", "値"], (name, list(fd(by_n[6])))
    bridge.destroy()
    channel.destroy()


def test_corba_text_reaches_consumers_of_every_code_set(shared_factory: Any, client_orb: Any,
                                                        consumers: dict[str, ConsumerProcess]) -> None:
    """A supplier whose ORB's native char code set is UTF-8 (this test process) pushes ``string`` values no
    ISO-8859-1 consumer can take, and a name with a Euro sign: every consumer gets every event; the text of an
    ``any`` holding a ``string`` is kept exactly (as a ``wstring`` where the consumer needs it), names are escaped
    only for the consumers whose code set cannot carry them."""
    channel, _ = shared_factory.create_channel([], [])
    for c in consumers.values():
        connect(channel, c, client_orb.orb)
    supplier = structured_supplier(channel)
    texts = ["5 €", "中文", "😀", "café", "¤ in Latin-1, not in Latin-9"]
    for i, text in enumerate(texts):
        fixed = CosNotification.FixedEventHeader(CosNotification.EventType("Domäne€", "T"), f"e{i}")
        supplier.push_all([CosNotification.StructuredEvent(
            CosNotification.EventHeader(fixed, []),
            [prop("n", CORBA.Any(CORBA.TC_long, i)), prop("s", CORBA.Any(CORBA.TC_string, text)),
             prop("w", CORBA.Any(CORBA.TC_wstring, text))],
            CORBA.Any(CORBA.TC_string, text))])
    for c in consumers.values():
        wait_until(lambda c=c: len(c.snapshot()) >= len(texts), f"{len(texts)} events at {c.name}")
    time.sleep(0.5)
    for name, c in consumers.items():
        events = c.snapshot()
        assert sorted(int(fd(e)["n"][1]) for e in events) == list(range(len(texts))), name
        for e in events:
            text = texts[int(fd(e)["n"][1])]
            assert fd(e)["w"] == ["wstring", text], (name, e)
            if name == "latin1" and max(map(ord, text)) > 0xFF:    # carried as a wstring, text unchanged
                assert fd(e)["s"] == ["wstring", text] and e["body"] == ["wstring", text], (name, e)
            else:
                assert fd(e)["s"] == ["string", text] and e["body"] == ["string", text], (name, e)
            assert e["domain"] == ("Domäne\\u20ac" if name == "latin1" else "Domäne€"), (name, e["domain"])
    channel.destroy()


def test_corba_text_reaches_a_stomp_consumer(module_server: Any, shared_factory: Any, client_orb: Any,
                                             broker_url: str) -> None:
    """The reverse path: non-Latin-1 ``string`` and ``wstring`` values pushed into a channel reach a stomp.py
    consumer of the bridge's queue as the same text, in UTF-8 headers and a TextMessage body."""
    channel, cid = persistent_channel(shared_factory)
    queue = f"codesets.out.{uuid.uuid4().hex[:8]}"
    bridge, _ = bridge_factory(client_orb, module_server).create_bridge(channel_ep(BA.SOURCE, cid),
                                                                         jms_ep(BA.SINK, queue))
    bridge.start_bridge()
    supplier = structured_supplier(channel)
    texts = ["5 € 中文", "😀 emoji", "café"]
    for i, text in enumerate(texts):
        fixed = CosNotification.FixedEventHeader(CosNotification.EventType("D", "T"), f"e{i}")
        supplier.push_all([CosNotification.StructuredEvent(
            CosNotification.EventHeader(fixed, []),
            [prop("s", CORBA.Any(CORBA.TC_string, text)), prop("w", CORBA.Any(CORBA.TC_wstring, text))],
            CORBA.Any(CORBA.TC_wstring if i % 2 else CORBA.TC_string, text))])

    got = stomp_receive(broker_url, f"/queue/{queue}", len(texts))
    assert len(got) == len(texts)
    for headers, body in got:
        i = int(headers["$event_name"][1:])
        assert headers["$fd_s"] == texts[i] and headers["$fd_w"] == texts[i], headers
        assert body.decode("utf-8") == texts[i], body
    bridge.destroy()
    channel.destroy()


def test_corba_text_reaches_a_java_consumer(module_server: Any, shared_factory: Any, client_orb: Any,
                                            java_tool: JavaTool) -> None:
    """The reverse path to the Java JMS client (OpenWire): String properties and a TextMessage body hold the
    supplier's exact text (Latin-1, Euro sign, CJK). Characters above U+FFFF are ActiveMQ 5.17's limit, pinned here
    as documented (docs/mapping.md, "Text and code sets"): in a property the Java client reads each emoji as two
    U+FFFD (the message is delivered); a text body holding one cannot be read by the Java client at all (the broker
    redelivers it), so no body here holds one. STOMP consumers get both intact (the test above)."""
    channel, cid = persistent_channel(shared_factory)
    queue = f"codesets.java.{uuid.uuid4().hex[:8]}"
    bridge, _ = bridge_factory(client_orb, module_server).create_bridge(channel_ep(BA.SOURCE, cid),
                                                                         jms_ep(BA.SINK, queue))
    bridge.start_bridge()
    supplier = structured_supplier(channel)
    texts = ["5 € 中文", "😀 emoji"]
    bodies = ["5 € 中文", "Grüße, 中文 (BMP only)"]
    for i, text in enumerate(texts):
        fixed = CosNotification.FixedEventHeader(CosNotification.EventType("D", "T"), f"e{i}")
        supplier.push_all([CosNotification.StructuredEvent(
            CosNotification.EventHeader(fixed, []),
            [prop("s", CORBA.Any(CORBA.TC_string, text)), prop("w", CORBA.Any(CORBA.TC_wstring, text))],
            CORBA.Any(CORBA.TC_string, bodies[i]))])
    got = java_tool.consume("queue", queue, len(texts), DEADLINE_S)
    assert len(got) == len(texts), got
    for m in got:
        i = int(m["properties"]["$event_name"]["value"][1:])
        assert m["class"] == "ActiveMQTextMessage" and m["body"] == bodies[i], m
        seen = texts[i].replace("😀", REPLACEMENT * 2)           # ActiveMQ 5.17, STOMP -> OpenWire
        assert m["properties"]["$fd_s"] == {"type": "String", "value": seen}, m["properties"]
        assert m["properties"]["$fd_w"] == {"type": "String", "value": seen}, m["properties"]
    bridge.destroy()
    channel.destroy()
