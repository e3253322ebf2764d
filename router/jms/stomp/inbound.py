"""Frames arriving from the broker, on stomp.py's receiver thread: the :class:`Listener` that only enqueues them for
the transport's dispatcher, the reassembly of a MESSAGE frame a NUL byte in a header split (:class:`SplitFrame`), and
an ERROR frame as a :class:`~router.jms.errors.BrokerError`."""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import stomp
from stomp.utils import PREAMBLE_END_RE, Frame

from router.jms.errors import BrokerError

__all__ = ["SPLIT_FRAME", "Listener", "SplitFrame", "broker_error", "watch_split_frames"]

_SERVER_FRAMES = frozenset({"connected", "message", "receipt", "error", "heartbeat"})
#: decode_error of a MESSAGE whose header held a NUL byte (STOMP cannot carry one: the frame arrived split).
SPLIT_FRAME = "a STOMP header of this message holds a NUL byte, which split its MESSAGE frame (reassembled)"


def watch_split_frames(conn: stomp.Connection12, inbox: queue.Queue[Any], epoch: int) -> None:
    """Runs on stomp.py's receiver thread, only enqueues. STOMP ends a frame at the first NUL byte, and ActiveMQ
    passes a NUL inside a header value through unescaped (a STOMP producer can put one there): stomp.py then sees a
    MESSAGE whose header section never ends, followed by a "frame" whose command is the rest of that header. stomp.py
    logs and drops the second part, and the first lacks most headers, so the message could be neither acked nor
    rejected. Both parts are handed to the dispatcher, which reassembles them (:class:`SplitFrame`)."""
    original: Callable[[Frame, bytes], None] = conn.transport.process_frame

    def process_frame(frame: Frame, raw: bytes) -> None:
        kind = str(frame.cmd).lower()
        if kind == "message" and PREAMBLE_END_RE.search(raw) is None:
            inbox.put((epoch, "split", frame))
        elif kind not in _SERVER_FRAMES:
            inbox.put((epoch, "fragment", (frame, PREAMBLE_END_RE.search(raw) is not None)))
        else:
            original(frame, raw)

    conn.transport.process_frame = process_frame


def _unescape(text: str) -> str:
    """STOMP 1.2 header unescaping (``\\c`` ``\\n`` ``\\r`` ``\\\\``) of a line stomp.py did not parse."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            out.append({"c": ":", "n": "\n", "r": "\r", "\\": "\\"}.get(text[i + 1], text[i + 1]))
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


@dataclass
class SplitFrame:
    """A MESSAGE frame being put back together from the pieces a NUL byte in its headers cut it into."""

    epoch: int
    headers: dict[str, str]

    def add(self, fragment: Frame) -> None:
        """The fragment's "command" continues the last header's value after the NUL, unless it is a whole
        ``name:value`` line (the NUL ended the value; STOMP 1.2 escapes colons inside values)."""
        last = next(reversed(self.headers), None)
        name, colon, value = str(fragment.cmd).partition(":")
        if last is not None:
            self.headers[last] += "\0"
        if colon:
            self.headers.setdefault(_unescape(name), _unescape(value))
        elif last is not None:
            self.headers[last] += _unescape(str(fragment.cmd))
        for key, val in fragment.headers.items():
            self.headers.setdefault(key, val)


class Listener(stomp.ConnectionListener):
    """Runs on stomp.py's receiver thread: only enqueues."""

    def __init__(self, inbox: queue.Queue[Any], epoch: int) -> None:
        self._inbox = inbox
        self._epoch = epoch

    def on_connected(self, frame: Frame) -> None:
        self._inbox.put((self._epoch, "connected", frame))

    def on_message(self, frame: Frame) -> None:
        self._inbox.put((self._epoch, "message", frame))

    def on_receipt(self, frame: Frame) -> None:
        self._inbox.put((self._epoch, "receipt", frame))

    def on_error(self, frame: Frame) -> None:
        self._inbox.put((self._epoch, "error", frame))

    def on_disconnected(self) -> None:
        self._inbox.put((self._epoch, "disconnected", None))

    def on_heartbeat_timeout(self) -> None:
        self._inbox.put((self._epoch, "disconnected", None))


def broker_error(frame: Frame) -> BrokerError:
    body = frame.body.decode("utf-8", "replace") if isinstance(frame.body, bytes) else str(frame.body or "")
    return BrokerError(frame.headers.get("message", "(no message header)"), body, frame.headers.get("receipt-id"))
