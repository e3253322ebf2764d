"""The STOMP socket: its URL, ``TCP_NODELAY``, chunked writes, and which errors mean the link failed.

Every socket the transport opens has ``TCP_NODELAY`` (:func:`no_delay`): STOMP is request/response (a COMMIT
or BEGIN waits for its RECEIPT), and with Nagle's algorithm a small frame written while the previous segment is
unacknowledged waits for the broker's delayed ACK (typically 40 ms on Linux): every small transaction took about
44 ms to confirm instead of about 1 ms (docs/performance.md, round 7). stomp.py 9 does not set it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

import stomp
from stomp.exception import StompException

from router.jms.errors import LocalProtocolError
from router.jms.transport import redact_url

__all__ = ["LINK_ERRORS", "SILENT_LINK_TIMEOUT_MS", "WRITE_CHUNK", "bound_silence", "no_delay", "parse_stomp_url",
           "write_chunked"]

log = logging.getLogger("nsjms.transport.stomp")

#: stomp.py's and the socket's errors: the frame could not be written (translated to BrokerUnavailable).
LINK_ERRORS = (StompException, OSError)

#: Bytes of SEND frames joined into one socket write by :meth:`StompTransport.send_encoded_many` (at least one
#: frame per write, whatever its size).
WRITE_CHUNK = 256 * 1024


def no_delay(conn: stomp.Connection12) -> None:
    """``TCP_NODELAY`` on ``conn``'s socket (just opened by ``connect``; a TLS socket too): frames go out when
    written, not held back by Nagle's algorithm until the broker acknowledges the previous segment. A socket
    already gone (the connect failed at once) is left to the connect's own error."""
    sock = getattr(conn.transport, "socket", None)
    if sock is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:
        log.debug("TCP_NODELAY on the STOMP socket to %s: %s", conn.transport.current_host_and_port, exc)


#: How long written data may stay unacknowledged by the broker's TCP before the kernel aborts the connection
#: (``TCP_USER_TIMEOUT``), in ms: 1.5 x the 10 s heart-beat, the silence after which stomp.py gives a connection up.
#: A silent cut (packets dropped, no RST) while a write waits for room in a full send buffer otherwise blocks that
#: write, stomp.py's socket lock and with it the heart-beat thread (it sends before it checks what it received)
#: for as long as TCP retransmits (``tcp_retries2``: about 15 minutes); with it the write fails and the connection
#: counts as lost (issue 31). Linux (5.11 and later) applies the same bound to a zero window: a broker that stops
#: reading this connection for longer (ActiveMQ's producer flow control blocking a producer with a full memory or
#: store limit) is cut too, although it answers the probes. That is deliberate: the write would otherwise block, and
#: the heart-beat with it, for as long as the broker holds it, invisibly; cut, the bridge shows ``broker down`` and
#: reconnects with back-off (its open transaction is aborted by the broker, nothing is lost, see docs/transport.md).
SILENT_LINK_TIMEOUT_MS = 15_000


def bound_silence(conn: stomp.Connection12) -> None:
    """``TCP_USER_TIMEOUT`` = :data:`SILENT_LINK_TIMEOUT_MS` on ``conn``'s socket (Linux; elsewhere a no-op)."""
    sock = getattr(conn.transport, "socket", None)
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if sock is None or option is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, SILENT_LINK_TIMEOUT_MS)
    except OSError as exc:
        log.debug("TCP_USER_TIMEOUT on the STOMP socket to %s: %s", conn.transport.current_host_and_port, exc)


def write_chunked(conn: stomp.Connection12, frames: Iterable[bytes]) -> None:
    """Write encoded ``frames`` in order, joined into socket writes of about :data:`WRITE_CHUNK` bytes (at least one
    whole frame each: stomp.py's socket lock keeps another thread's frame out of a write)."""
    chunk: list[bytes] = []
    size = 0
    for frame in frames:
        chunk.append(frame)
        size += len(frame)
        if size >= WRITE_CHUNK:
            conn.transport.send(b"".join(chunk))
            chunk, size = [], 0
    if chunk:
        conn.transport.send(b"".join(chunk))


def parse_stomp_url(url: str) -> tuple[list[tuple[str, int]], bool]:
    """``stomp://h1:61613[,h2:61613]`` → host/port list and whether TLS (``stomp+ssl``) is wanted."""
    parts = urlsplit(url)
    if parts.scheme not in ("stomp", "stomp+ssl"):
        raise LocalProtocolError(f"not a stomp URL: {redact_url(url)}")
    if "@" in parts.netloc:
        raise LocalProtocolError("put credentials in the username/password options, not in the URL")
    hosts = []
    for item in parts.netloc.split(","):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise LocalProtocolError(f"want HOST:PORT in {url!r}, got {item!r}")
        hosts.append((host.strip("[]"), int(port)))
    return hosts, parts.scheme == "stomp+ssl"
