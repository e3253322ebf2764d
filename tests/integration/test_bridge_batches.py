"""Channel → JMS to a bridge of the same node goes in STOMP transactions, receipted only on COMMIT (issue 12), against
a real node, a real PostgreSQL and a real ActiveMQ.

Between the node and the session broker sits a TCP relay that parses the frames the node writes (STOMP 1.2:
headers, ``content-length`` bodies, NUL terminators, heart-beat EOLs), so the test sees exactly which frames
carried a ``receipt`` header. Events queued while the bridge was stopped (its proxy suspended) are delivered after
its start, in order,
all of them, in few transactions: every SEND to the bridge's queue is inside a transaction and without a receipt,
BEGIN has no receipt, and each COMMIT asks for one.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import CosNotification

from idl.generated import CosBridgeAdmin as BA

from bridgekit import (
    JavaTool,
    bridge_factory,
    channel_ep,
    event_numbers,
    jms_ep,
    persistent_channel,
    structured_supplier,
    unique_name,
)
from conftest import NsjmsServer, free_port
from stdclients import make_event

N = 300
PERSISTENT = CosNotification.Persistent
TIMEOUT_S = 60.0


@dataclass
class Frame:
    command: str
    headers: dict[str, str]


class FrameRelay:
    """Relays TCP connections to ``upstream``; records every frame the clients send."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.frames: list[Frame] = []
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            broker = socket.create_connection(self.upstream)
            self.socks += [client, broker]
            threading.Thread(target=self._pipe, args=(client, broker, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(broker, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, parse: bool) -> None:
        buf = b""
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                if parse:
                    buf = self._parse(buf + data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _parse(self, buf: bytes) -> bytes:
        while True:
            buf = buf.lstrip(b"\r\n")                        # heart-beats
            end = buf.find(b"\n\n")
            if end < 0:
                return buf
            lines = buf[:end].decode("utf-8", "replace").replace("\r", "").split("\n")
            headers: dict[str, str] = {}
            for line in lines[1:]:
                key, _, value = line.partition(":")
                headers.setdefault(key, value)
            start = end + 2
            if "content-length" in headers:
                stop = start + int(headers["content-length"])
                if len(buf) < stop + 1:
                    return buf
            else:
                stop = buf.find(b"\0", start)
                if stop < 0:
                    return buf
            with self.lock:
                self.frames.append(Frame(lines[0], headers))
            buf = buf[stop + 1:]

    def snapshot(self) -> list[Frame]:
        with self.lock:
            return list(self.frames)

    def close(self) -> None:
        for s in [self.server, *self.socks]:
            try:
                s.close()
            except OSError:
                pass


@pytest.fixture
def relayed_node(tmp_path: Path, fresh_db: str, broker_url: str) -> Iterator[tuple[NsjmsServer, FrameRelay]]:
    parts = urlsplit(broker_url)
    relay = FrameRelay((parts.hostname or "127.0.0.1", int(parts.port or 61613)))
    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=fresh_db, broker_url=f"stomp://127.0.0.1:{relay.port}",
                         port=free_port())
    try:
        server.start()
        yield server, relay
    finally:
        server.stop()
        relay.close()


def test_queued_structured_events_reach_activemq_in_order_in_transactions_receipted_on_commit(
        relayed_node: tuple[NsjmsServer, FrameRelay], client_orb: Any, java_tool: JavaTool) -> None:
    server, relay = relayed_node
    factory = client_orb.factory(server.ior())
    bf = bridge_factory(client_orb, server)
    channel, cid = persistent_channel(factory)
    queue = unique_name("batches.out")
    bridge, _ = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, queue))
    bridge.start_bridge()
    bridge.stop_bridge()                                # its proxy is suspended: the events queue for it
    supplier = structured_supplier(channel)
    for i in range(N):
        supplier.push_one(make_event(i, reliability=PERSISTENT))
    bridge.start_bridge()
    got = java_tool.consume("queue", queue, N, TIMEOUT_S)
    assert event_numbers(got) == list(range(N)), "every event, in order, once"
    frames = relay.snapshot()
    dest = f"/queue/{queue}"
    sends = [f for f in frames if f.command == "SEND" and f.headers.get("destination") == dest]
    assert len(sends) == N
    assert all("transaction" in f.headers and "receipt" not in f.headers for f in sends), \
        "every SEND in a transaction, without a receipt"
    txs = {f.headers["transaction"] for f in sends}
    begins = [f for f in frames if f.command == "BEGIN" and f.headers.get("transaction") in txs]
    commits = [f for f in frames if f.command == "COMMIT" and f.headers.get("transaction") in txs]
    assert len(begins) == len(txs) and all("receipt" not in f.headers for f in begins), "BEGIN without a receipt"
    assert len(commits) == len(txs) and all("receipt" in f.headers for f in commits), "each COMMIT receipted"
    assert len(txs) <= N // 50, f"{len(txs)} transactions for {N} queued events: not batched"
    bridge.destroy()
