"""``router.jms.stomp.sendframe.encode_send_frame`` writes exactly the bytes stomp.py 9 writes for a SEND (issue 12,
round 4): the transport frames SENDs itself (one write per batch) and must not change a byte of the wire."""

from __future__ import annotations

import random
from typing import Any

import pytest
from stomp.protocol import Protocol12
from stomp.utils import convert_frame, pack

from router.jms.stomp.sendframe import FrameTemplates, encode_send_frame


class _Capture:
    """The part of a stomp.py transport ``Protocol12.send`` uses: ``transmit`` (encoded as stomp.py does)."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def set_listener(self, name: str, listener: Any) -> None:
        pass

    def transmit(self, frame: Any) -> None:
        self.frames.append(pack(convert_frame(frame)))


def _stomp_py(destination: str, body: bytes, headers: dict[str, Any]) -> bytes:
    capture = _Capture()
    Protocol12(capture, auto_content_length=False).send(destination, body, headers=dict(headers))
    return capture.frames[0]


def _ours(destination: str, body: bytes, headers: dict[str, Any]) -> bytes:
    return encode_send_frame({**headers, "destination": destination}, body)


CASES: list[tuple[dict[str, Any], bytes]] = [
    ({"persistent": "true"}, b"x" * 1000),
    ({"content-length": "3", "amq-msg-type": "bytes", "transaction": "tx-1"}, b"a\x00b"),
    ({"content-length": "999"}, b"wrong length is corrected"),
    ({"content-length": "0"}, b""),
    ({"a": "colon: newline\n cr\r backslash\\ all"}, b"body"),
    ({"$nsjms_idl": '{"v":1,"fd":[["n","long",["$fd_n"]]]}', "priority": "4"}, b""),
    ({"unicode é": "日本 é", "surrogate": "bad \udcff value"}, "text é".encode()),
    ({"none": None, "destination": "/queue/overridden"}, b"b"),
    ({"receipt": "send-abc", "transaction": "tx-2", "persistent": "false"}, b"\n\r\\:"),
]


@pytest.mark.parametrize(("headers", "body"), CASES)
def test_a_send_frame_is_stomp_pys_byte_for_byte(headers: dict[str, Any], body: bytes) -> None:
    assert _ours("/queue/q", body, headers) == _stomp_py("/queue/q", body, headers)


def test_random_headers_are_framed_as_stomp_py_frames_them() -> None:
    rng = random.Random(12)
    alphabet = "ab:\\\n\r\t é日\x01$_-=,%"
    for _ in range(500):
        headers = {"".join(rng.choice("abcxyz$_") for _ in range(rng.randint(1, 6))):
                   "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(rng.randint(0, 8))}
        body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 20)))
        if rng.random() < 0.5:
            headers["content-length"] = str(len(body))
        assert _ours("/topic/t", body, headers) == _stomp_py("/topic/t", body, headers), headers


def test_frame_templates_frame_runs_of_frames_as_stomp_py_frames_each() -> None:
    """Issue 12, round 5: ``FrameTemplates`` re-encodes a header line only when its value is not the object of the
    previous frame with the same header names; runs of such frames (values repeated as the same objects, equal
    copies, new values, a None or a number now and then, several name sets interleaved) are stomp.py's bytes."""
    rng = random.Random(5)
    alphabet = "ab:\\\n\r é日\x01$"
    pool = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10))) for _ in range(6)]
    name_sets = [["persistent", "transaction", "$nsjms_idl", "$event_name", "content-length", "zz", "a"],
                 ["b", "content-length"], ["x:y", "é", "destination"]]
    templates = FrameTemplates(limit=2)              # three name sets: the table is also emptied on the way
    for _ in range(600):
        names = rng.choice(name_sets)
        headers: dict[str, Any] = {}
        for name in names:
            pick = rng.random()
            if pick < 0.6:
                headers[name] = rng.choice(pool)                      # the same object again
            elif pick < 0.75:
                headers[name] = "".join(rng.choice(pool))             # an equal or new value, a new object
            elif pick < 0.9:
                headers[name] = str(rng.randint(0, 99))
            elif pick < 0.95:
                headers[name] = None
            else:
                headers[name] = rng.randint(0, 9)
        body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 5)))
        destination = headers.pop("destination", "/queue/q")
        if not isinstance(destination, str):
            destination = "/queue/q"
        want = _stomp_py(destination, body, headers)
        assert templates.encode({**headers, "destination": destination}, body) == want, headers
