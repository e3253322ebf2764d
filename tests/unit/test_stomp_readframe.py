"""``router.jms.stomp.readframe.parse_frame`` parses every frame exactly as stomp.py 9's ``stomp.utils.parse_frame``
does (issue 12, round 8: the receiver thread parses a MESSAGE per JMS message), and ``install`` changes one
connection's receiver loop only, the same steps as stomp.py's."""

from __future__ import annotations

import inspect
import random
from typing import Any

import pytest
import stomp
import stomp.transport
from stomp.utils import HEARTBEAT_FRAME
from stomp.utils import parse_frame as stomp_parse_frame

from router.jms.stomp import readframe
from router.jms.stomp.readframe import parse_frame

ACTIVEMQ_MESSAGE = (
    b"MESSAGE\ncontent-length:5\nexpires:0\ndestination:/queue/bench.in.7\nsubscription:1\npriority:4\n"
    b"n:12345\nmessage-id:ID:nsjms-host-40123-1764612345678-3:1:1:1:12345\npersistent:true\n"
    b"timestamp:1764612345678\nack:ID:nsjms-host-40123-1764612345678-5:2:-1:1:12345\n\nhello")

CASES: list[bytes] = [
    ACTIVEMQ_MESSAGE,
    b"RECEIPT\nreceipt-id:send-1\n\n",
    b"CONNECTED\nversion:1.2\nheart-beat:0,0\nserver:ActiveMQ/5.17\n\n",
    b"ERROR\nmessage:Unknown destination\ncontent-type:text/plain\n\nbody with\nlines:and colons\n\n",
    b"\n\n\nMESSAGE\na:1\n\nleading blank lines",
    b"MESSAGE\r\na:1\r\nb:two\r\n\r\nCRLF frame",
    b"MESSAGE\na:1\r\nb:2\n\nmixed line ends",
    b"MESSAGE\nlone\rcr:v\ra\nk:v\r\n\nlone carriage returns",
    b"MESSAGE\nk:first\nk:second\n\nrepeated header: the first wins",
    b"MESSAGE\nno colon here\n:no key\nk:\n::\nk2:a:b:c\n\nodd lines",
    b"MESSAGE\nk\\cey:v\\na\\\\l\\r\\x\nk\\c2:v\n\nescapes, an unknown one kept",
    b"MESSAGE\nk\\x:first\nk\\\\x:second\n\ntwo spellings of one key: the first wins",
    b"MESSAGE\nunicode \xc3\xa9:\xe6\x97\xa5\xe6\x9c\xac\nbad:\xff\xfe\n\ninvalid UTF-8 replaced",
    b"MESSAGE\nk:v",                                   # no end of the header section
    b"MESSAGE",
    b"",
    b"\n\n",
    b"\n",
    b"MESSAGE\nk:v\n\n\x00inside\n\nbody",
    b"  MESSAGE \n k : v \n\nspaces are kept",
]


def _same(frame: bytes) -> None:
    theirs, ours = stomp_parse_frame(frame), parse_frame(frame)
    if theirs is None:
        assert ours is None, frame
        return
    assert ours is not None, frame
    assert (ours.cmd, ours.headers, ours.body) == (theirs.cmd, theirs.headers, theirs.body), frame
    assert list(ours.headers) == list(theirs.headers), "the same header order"
    assert ours.original_headers == theirs.original_headers


@pytest.mark.parametrize("frame", CASES)
def test_a_frame_is_parsed_as_stomp_py_parses_it(frame: bytes) -> None:
    _same(frame)


def test_random_frames_are_parsed_as_stomp_py_parses_them() -> None:
    rng = random.Random(8)
    alphabet = [b"a", b"b", b"k", b":", b"\\", b"c", b"n", b"r", b"\n", b"\r", b" ", b"\xc3\xa9", b"\xff", b"\x00",
                b"\t", b"\\c", b"\\n", b"\\\\", b"\r\n", b"\n\n", b"\x0b", b"\x0c", b"\x1c", b"\x85", b"\xc2\x85",
                b"\xe2\x80\xa8"]
    keys = [b"k", b"a", b"k\\c", b"\\n", b"", b"k:", b"\xc3\xa9"]

    def text(n: int) -> bytes:
        return b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, n)))

    for _ in range(5000):
        if rng.random() < 0.5:                     # arbitrary bytes
            head = text(40)
        else:                                      # header lines with few keys: repeats, escapes, odd lines
            lines = [rng.choice(keys) + rng.choice([b":", b":", b""]) + text(6) for _ in range(rng.randint(0, 6))]
            head = b"".join(line + rng.choice([b"\n", b"\r\n"]) for line in lines)
        frame = rng.choice([b"MESSAGE\n", b"", b"\n", b"RECEIPT\r\n"]) + head
        if rng.random() < 0.7:
            frame += rng.choice([b"\n", b"\r\n"]) + text(10)
        _same(frame)


def test_the_receiver_loop_it_mirrors_is_stomp_pys() -> None:
    """install() replaces stomp.py 9.0's private frame loop with a copy that parses faster; a stomp.py whose loop
    differs must fail here, not parse differently in production."""
    source = inspect.getsource(stomp.transport.BaseTransport._BaseTransport__read_frames)
    body = [line.strip() for line in source.splitlines()[1:] if line.strip()]
    assert body == [
        "frames = self.__read()",
        "for frame in frames:",
        "if self.__is_eol(frame):",
        "f = HEARTBEAT_FRAME",
        "else:",
        "f = parse_frame(frame)",
        "if f is None:",
        "continue",
        "if self.__auto_decode:",
        "f.body = decode(f.body)",
        "self.process_frame(f, frame)",
    ]


def test_install_changes_one_connection_and_its_loop_takes_the_same_steps() -> None:
    """install() sets the loop on one connection's transport (another keeps stomp.py's); the loop hands a frame,
    a heartbeat (an end-of-line frame) and a frame to ``process_frame`` as stomp.py's does, the body decoded only
    with ``auto_decode``."""
    ours = stomp.Connection12([("127.0.0.1", 1)], auto_decode=False)
    theirs = stomp.Connection12([("127.0.0.1", 1)], auto_decode=False)
    readframe.install(ours.transport)
    assert "_BaseTransport__read_frames" in vars(ours.transport)
    assert "_BaseTransport__read_frames" not in vars(theirs.transport)
    raw = [b"RECEIPT\nreceipt-id:r1\n\n", b"\n", b"MESSAGE\nk:v\\c1\n\nbody"]
    for auto_decode, empty, body in ((False, b"", b"body"), (True, "", "body")):
        got: list[tuple[Any, bytes]] = []
        transport = ours.transport
        transport._BaseTransport__read = lambda: list(raw)
        transport._BaseTransport__auto_decode = auto_decode
        transport.process_frame = lambda f, frame, got=got: got.append((f, frame))
        transport._BaseTransport__read_frames()
        assert [(f.cmd, f.headers, f.body) for f, _ in got] == [
            ("RECEIPT", {"receipt-id": "r1"}, empty),
            (HEARTBEAT_FRAME.cmd, {}, HEARTBEAT_FRAME.body),
            ("MESSAGE", {"k": "v:1"}, body)]
        assert [frame for _, frame in got] == raw


def test_every_connection_the_transport_makes_parses_with_readframe() -> None:
    """The wiring: ``StompTransport`` installs the parser on each stomp.py connection it builds."""
    from router.jms.stomp.transport import StompTransport

    transport = StompTransport("stomp://127.0.0.1:1")
    conn = transport._new_connection(1)
    assert "_BaseTransport__read_frames" in vars(conn.transport)
