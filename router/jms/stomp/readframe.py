"""Parsing the frames the broker sends, as stomp.py 9 parses them, in a quarter of its time (issue 12, round 8).

stomp.py's receiver thread parses every frame with ``stomp.utils.parse_frame``: a regular-expression match and
two ``re.sub`` calls per header line. On a JMS → channel bridge that is one MESSAGE frame of a dozen headers per
message, on the node's critical resource (the GIL): 42 µs of a 1 KB message's ~515 µs of node CPU on this kind
of machine. :func:`parse_frame` returns the same :class:`stomp.utils.Frame` (command, headers, body) for every
input — the same line split (``\\n`` or ``\\r\\n``), leading blank lines skipped, a line without a key or a colon
skipped, the first of repeated headers kept, the STOMP 1.2 escapes of keys and values undone by stomp.py's own
function — with a ``str.partition`` per line, and ``re.sub`` only for a line that holds a backslash.
``tests/unit/test_stomp_readframe.py`` compares the two on frames ActiveMQ sends and on random ones.

:func:`install` puts it in one connection's receiver loop only (``stomp.transport.BaseTransport``'s frame loop,
same steps: heartbeats, ``auto_decode``, ``process_frame``), not in the stomp.py module: other stomp.py users in
the process (the benches' raw baselines) keep stomp.py as it is.
"""

from __future__ import annotations

import re
import types
from typing import Any

from stomp.utils import HEARTBEAT_FRAME, LINE_END_RE, PREAMBLE_END_RE, Frame, _unescape_header, decode

__all__ = ["install", "parse_frame"]

_ESCAPE = re.compile(r"\\.")


def parse_frame(frame: bytes) -> Frame | None:
    """``stomp.utils.parse_frame(frame)``'s result, computed faster (see the module docstring)."""
    mat = PREAMBLE_END_RE.search(frame)
    if mat:
        preamble_end, body_start = mat.start(), mat.end()
    else:
        preamble_end = body_start = len(frame)
    preamble = frame[:preamble_end].decode("utf-8", errors="replace")
    # stomp.py splits at "\n" or "\r\n"; without a "\r" that is a split at "\n"
    lines: list[str] = LINE_END_RE.split(preamble) if "\r" in preamble else preamble.split("\n")
    first, count = 0, len(lines)
    while first < count and not lines[first]:
        first += 1
    if first >= count:
        return None
    headers: dict[str, str] = {}
    for line in lines[first + 1:]:
        key, colon, value = line.partition(":")     # stomp.py: "(?P<key>[^:]+)[:](?P<value>.*)", matched
        if not key or not colon:
            continue
        if "\\" in key:
            key = _ESCAPE.sub(_unescape_header, key)
        if key in headers:
            continue
        if "\\" in value:
            value = _ESCAPE.sub(_unescape_header, value)
        headers[key] = value
    return Frame(lines[first], headers, frame[body_start:])


def _read_frames(self: Any) -> None:
    """``stomp.transport.BaseTransport.__read_frames`` (stomp.py 9.0) with :func:`parse_frame`."""
    frames = self._BaseTransport__read()
    for frame in frames:
        f = HEARTBEAT_FRAME if self._BaseTransport__is_eol(frame) else parse_frame(frame)
        if f is None:
            continue
        if self._BaseTransport__auto_decode:
            f.body = decode(f.body)
        self.process_frame(f, frame)


def install(transport: Any) -> None:
    """Make ``transport`` (a stomp.py connection's ``transport``) parse its frames with :func:`parse_frame`.
    Raises ``AttributeError`` when the private names this relies on are gone (a stomp.py that moved them): the
    transport then fails at its first connection, loudly. A stomp.py whose loop keeps the names but changes its
    steps is caught by ``tests/unit/test_stomp_readframe.py``, which pins the loop's source."""
    for name in ("_BaseTransport__read_frames", "_BaseTransport__read", "_BaseTransport__is_eol",
                 "_BaseTransport__auto_decode", "process_frame"):
        getattr(transport, name)
    transport._BaseTransport__read_frames = types.MethodType(_read_frames, transport)
