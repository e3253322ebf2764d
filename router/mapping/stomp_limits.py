"""ActiveMQ Classic's limits on a STOMP SEND frame, checked before sending (decisions only, no I/O).

A frame ActiveMQ refuses is either answered with an ERROR frame that closes the connection (a header line above
10 KiB, more than 1000 headers) or makes it close the connection without any answer (a header it parses as a number
that is not one — measured on 5.17). Either looks like a broker failure to the sender, so an event producing such a
frame would be retried forever and stall its bridge: :func:`check_stomp_limits` turns it into a mapping failure,
which the bridge dead-letters with the reason. Part of the STOMP codec (:mod:`router.mapping.stomp_codec`,
``StompCodec.check``); moved here from ``router/bridge/limits.py`` (issue 24: the bridge names no wire format).
"""

from __future__ import annotations

from router.mapping.errors import MappingError

__all__ = ["STOMP_INTEGER_HEADERS", "STOMP_MAX_HEADERS", "STOMP_MAX_HEADER_LINE", "check_stomp_limits"]

# ActiveMQ Classic's STOMP wire format refuses a header line above 10 KiB or more than 1000 headers with an ERROR
# frame and closes the connection: such an event could never be sent and would stall the bridge (resent forever).
STOMP_MAX_HEADER_LINE = 10 * 1024
STOMP_MAX_HEADERS = 1000
_STOMP_RESERVE = 16                # headers the transport adds when sending (destination, receipt, transaction, ...)
# Headers ActiveMQ parses as numbers when it converts a SEND: a value that is not one makes it close the connection
# without an ERROR frame (measured on 5.17), which looks like a broker failure and would stall the bridge. The mapping
# writes expires/priority/timestamp itself; these can come from event properties.
STOMP_INTEGER_HEADERS = frozenset({"JMSXGroupSeq", "AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_PERIOD",
                                   "AMQ_SCHEDULED_REPEAT", "expires", "priority", "timestamp"})
#: (header, the bits of its Java type: int for JMSXGroupSeq, long for the others), for the fast check.
_INTEGER_BITS = tuple((name, 32 if name == "JMSXGroupSeq" else 64) for name in sorted(STOMP_INTEGER_HEADERS))


def check_stomp_limits(headers: dict[str, str]) -> None:
    """A mapping failure (the event is dead-lettered) when the frame exceeds what the broker accepts."""
    if len(headers) + _STOMP_RESERVE > STOMP_MAX_HEADERS:
        raise MappingError(f"{len(headers)} STOMP headers; the broker accepts at most {STOMP_MAX_HEADERS}",
                           "properties")
    # The usual frame: no line can reach the limit (a character takes at most 4 bytes, escaped or in UTF-8, even
    # all of them on one line) and every integer header is one; anything else is looked at line by line below,
    # so the error raised is the same.
    if 4 * (sum(map(len, headers)) + sum(map(len, headers.values()))) + 1 <= STOMP_MAX_HEADER_LINE:
        for name, bits in _INTEGER_BITS:
            value = headers.get(name)
            if value is not None and not _is_java_integer(value, bits):
                break                    # not a Java integer: the walk below raises for it
        else:
            return

    for name, value in headers.items():
        if name in STOMP_INTEGER_HEADERS and not _is_java_integer(value, 32 if name == "JMSXGroupSeq" else 64):
            raise MappingError(f"ActiveMQ closes the connection on a non-integer {name} header ({value[:40]!r})",
                               f"property:{name}")
        if 4 * (len(name) + len(value)) + 1 <= STOMP_MAX_HEADER_LINE:
            continue              # cannot exceed it: a character takes at most 4 bytes, escaped or in UTF-8
        size = _escaped_len(name) + 1 + _escaped_len(value)
        if size > STOMP_MAX_HEADER_LINE:
            raise MappingError(f"the STOMP header line is {size} bytes; the broker accepts at most "
                               f"{STOMP_MAX_HEADER_LINE}", f"property:{name}")


def _is_java_integer(text: str, bits: int) -> bool:
    """What Java's ``Integer.parseInt`` (32) / ``Long.parseLong`` (64) accepts."""
    if text.isascii() and text.isdigit() and len(text) < (10 if bits == 32 else 19):
        return True                      # the usual value (priority, timestamp): ASCII digits that fit
    try:
        number = int(text, 10)
    except ValueError:
        return False
    return text.lstrip("+-").isdigit() and -(2 ** (bits - 1)) <= number < 2 ** (bits - 1)


def _escaped_len(text: str) -> int:
    """UTF-8 length after STOMP 1.2 header escaping (backslash, CR, LF and colon take two bytes)."""
    return len(text.encode("utf-8")) + sum(text.count(c) for c in "\\\r\n:")
