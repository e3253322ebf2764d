"""Group commit on the accept side (issue 12): concurrent suppliers' persistent events share PostgreSQL commits.

Eight suppliers push persistent structured events at the same time, one event per call, into a channel whose only
consumer is suspended (so no delivery commits mix in). Every push returns once its event is stored; the database's
own counter (``pg_stat_database.xact_commit``) must show fewer commits than events. Then the consumer resumes and
receives every event exactly once.

PostgreSQL flushes a backend's statistics up to about a second after its transactions, so the counter is read once
it has settled (two reads in a row that differ by at most the few background transactions of an idle node).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from stdclients import (
    Form,
    PushSupplierClient,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    event_id,
    make_event,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    persistent_qos,
    wait_until,
)

pytestmark = pytest.mark.integration

SUPPLIERS = 8
PER_SUPPLIER = 60
EVENTS = SUPPLIERS * PER_SUPPLIER


def _commits(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


def settled_commits(dsn: str, deadline_s: float = 60.0) -> int:
    """The commit counter once the statistics have caught up (condition with a deadline, not a fixed sleep)."""
    end = time.monotonic() + deadline_s
    last = _commits(dsn)
    while time.monotonic() < end:
        time.sleep(1.5)                 # PostgreSQL's statistics flush interval is 1 s: poll slower than that
        now = _commits(dsn)
        if now - last <= 3:
            return now
        last = now
    raise AssertionError("pg_stat_database.xact_commit did not settle")


def _stored_events(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM nsjms_event").fetchone()
    assert row is not None
    return int(row[0])


def test_concurrent_persistent_pushes_share_commits(nsjms_server: Any, factory: Any) -> None:
    dsn = nsjms_server.pg_dsn
    channel, _ = factory.create_channel(persistent_qos(), [])
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(proxy, Form.STRUCTURED, consumer)
    proxy.suspend_connection()
    clients = []
    for _ in range(SUPPLIERS):
        client = PushSupplierClient(obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED,
                                                          Style.PUSH)[0], Form.STRUCTURED)
        client.connect()
        clients.append(client)
    start = threading.Barrier(SUPPLIERS)
    errors: list[BaseException] = []

    def supply(k: int) -> None:
        try:
            start.wait(30)
            for i in range(PER_SUPPLIER):
                clients[k].push_one(make_event(k * 1000 + i))
        except BaseException as exc:  # noqa: BLE001 — reported by the assertion below
            errors.append(exc)

    before = settled_commits(dsn)
    threads = [threading.Thread(target=supply, args=(k,), daemon=True) for k in range(SUPPLIERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert _stored_events(dsn) == EVENTS, "every push returned once its event was stored"
    commits = settled_commits(dsn) - before
    assert commits < EVENTS, f"{commits} commits for {EVENTS} events: no commit was shared"   # before: >= EVENTS

    proxy.resume_connection()
    assert consumer.wait_for(EVENTS, 120), f"{consumer.count()} of {EVENTS} delivered"
    got = sorted(event_id(x) for x in consumer.snapshot())
    assert got == sorted(k * 1000 + i for k in range(SUPPLIERS) for i in range(PER_SUPPLIER))
    assert wait_until(lambda: _stored_events(dsn) == 0, 60), "delivered events leave the store"
