"""The bytes of a STOMP SEND (and receipt-less ACK) frame, as stomp.py 9 writes them (issue 12, rounds 4 and 5).

:func:`encode_send_frame` encodes one frame; :class:`FrameTemplates` encodes a run of frames whose headers share
their names and most of their values (a batch of one bridge: destination, transaction, the event type's names,
its manifest, its JMS type — only the event's name, its values, the timestamp differ): per set of header names the
sorted order is decided once, and each header line is encoded again only when its value is not the very object
the previous frame of that set carried. Both write the same bytes as stomp.py: ``tests/unit/test_stomp_framing.py``
pins both, ``tests/unit/test_to_jms_wire.py`` the single frames, ``tests/unit/test_t2_out_wire.py`` a T2's chunks
(``FrameTemplates`` through ``send_encoded_many``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["FrameTemplates", "encode_ack_frame", "encode_send_frame"]


def _escape(value: str) -> str:
    """STOMP 1.2 header value escaping, as stomp.py's ``Protocol12._escape_headers`` does it (keys are not escaped);
    most values need none, and are returned as they are."""
    if "\\" in value or "\n" in value or ":" in value or "\r" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c").replace("\r", "\\r")
    return value


def encode_send_frame(headers: Mapping[str, str | None], body: bytes) -> bytes:
    """The bytes stomp.py 9 writes for ``Connection12.send(destination, body, headers=...)`` (``headers`` already
    holding ``destination``): the command, the header lines sorted by name with their values escaped (a None value
    left out), a ``content-length`` set to the body's length when the body is not empty, a blank line, the body and
    NUL, UTF-8 with unencodable characters replaced (``stomp.utils.convert_frame``). The values are escaped in one
    pass and the lines joined in one call instead of stomp.py's dict copies and per-line encodes;
    ``test_stomp_framing`` and ``test_to_jms_wire`` pin the equality."""
    if body and "content-length" in headers:
        headers = {**headers, "content-length": str(len(body))}
    keys = sorted(headers)
    values: list[Any] = [headers[key] for key in keys]
    try:
        text = "\0".join(values)                     # a None or non-str value: TypeError
    except TypeError:
        return _encode_send_frame_slowly(headers, body)
    if not keys or text.count("\0") != len(keys) - 1:  # a value holding a NUL (STOMP cannot carry one anyway)
        return _encode_send_frame_slowly(headers, body)
    if "\\" in text or "\n" in text or ":" in text or "\r" in text:
        values = _escape(text).split("\0")
    lines = "".join(map("{}:{}\n".format, keys, values))
    return b"".join((b"SEND\n", lines.encode("utf-8", "replace"), b"\n", body, b"\x00"))


def encode_ack_frame(ack_id: str, transaction: str | None = None) -> bytes:
    """The bytes stomp.py 9 writes for ``Connection12.ack(ack_id, transaction=transaction)`` (no receipt): ``ACK``,
    the header lines sorted by name (``id``, then ``transaction``) with their values escaped, a blank line and NUL
    (``test_stomp_ack_many`` pins the equality)."""
    lines = f"id:{_escape(ack_id)}\n" + (f"transaction:{_escape(transaction)}\n" if transaction else "")
    return b"".join((b"ACK\n", lines.encode("utf-8", "replace"), b"\n\x00"))


def _encode_send_frame_slowly(headers: Mapping[str, str | None], body: bytes) -> bytes:
    lines = []
    for key in sorted(headers):
        value = headers[key]
        if value is None:
            continue
        lines.append(f"{key}:{_escape(value) if isinstance(value, str) else value}\n")
    return b"".join((b"SEND\n", "".join(lines).encode("utf-8", "replace"), b"\n", body, b"\x00"))


class _Template:
    """The frames of one tuple of header names (in the headers' order): their sorted order (stomp.py sorts) and,
    per line, the last value seen with its encoded line."""

    __slots__ = ("cl", "memo", "order", "prefixes")

    def __init__(self, names: tuple[str, ...]) -> None:
        self.order = sorted(range(len(names)), key=names.__getitem__)    # stomp.py: sorted(headers)
        self.prefixes = [names[i] + ":" for i in self.order]
        self.cl = names.index("content-length") if "content-length" in names else -1
        #: per sorted line: (the value it was encoded for, the line's bytes); replaced whole (a thread that reads
        #: it sees a consistent pair: two writers on one transport can only make a line be encoded again)
        self.memo: list[tuple[Any, bytes] | None] = [None] * len(names)


class FrameTemplates:
    """Encodes SEND frames as :func:`encode_send_frame` does, remembering per tuple of header names the sorted
    order and the last encoded line of each header (see the module docstring). At most :attr:`limit` tuples are
    remembered (all forgotten when full); a frame with a value that is not a ``str`` (None, a number) is encoded
    by :func:`encode_send_frame`."""

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self._templates: dict[tuple[str, ...], _Template] = {}

    def encode(self, headers: Mapping[str, Any], body: bytes) -> bytes:
        names = tuple(headers)
        template = self._templates.get(names)
        if template is None:
            try:
                template = _Template(names)
            except TypeError:                       # a name that is not a str: stomp.py's own rules
                return encode_send_frame(headers, body)
            if len(self._templates) >= self.limit:
                self._templates.clear()
            self._templates[names] = template
        values = list(headers.values())
        if body and template.cl >= 0:
            values[template.cl] = str(len(body))
        memo, prefixes = template.memo, template.prefixes
        parts = [b"SEND\n"]
        for slot, i in enumerate(template.order):
            value = values[i]
            seen = memo[slot]
            if seen is not None and seen[0] is value:
                parts.append(seen[1])
                continue
            if type(value) is not str:
                return encode_send_frame(headers, body)
            line = (prefixes[slot] + _escape(value) + "\n").encode("utf-8", "replace")
            memo[slot] = (value, line)
            parts.append(line)
        parts += (b"\n", body, b"\x00")
        return b"".join(parts)
