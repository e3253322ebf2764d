"""Group commit on the accept side (issue 12): concurrent suppliers' persistent events share PostgreSQL commits.

Eight suppliers push persistent structured events at the same time, one event per call, into a channel whose only
consumer is suspended (so no delivery commits mix in). Every push returns once its event is stored; the database's
node's count of accept-side commits (``store.accept_commits`` in status.json, the transactions that stored accepted
events) must be lower than the number of events. Then the consumer resumes and receives every event exactly once.

``pg_stat_database.xact_commit`` is not used here: a node commits in the background all the time (T2 recovery
passes, outbox purges, status queries, ledger maintenance), so the database's counter cannot be attributed to the
pushes on a running node; ``bench/paths.py`` reports PostgreSQL transactions per event from it, measured over a
long run against the same background.
"""

from __future__ import annotations

import json
import threading
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


def _accept(server: Any) -> tuple[int, int] | None:
    """(commits, events) of the node's accept-side group commit, from its status.json (None until published)."""
    try:
        store = json.loads((server.state_dir / "status.json").read_text())["store"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None
    if "accept_commits" not in store:
        return None
    return int(store["accept_commits"]), int(store["accept_events"])


def _accept_after(server: Any, events: int, deadline_s: float = 60.0) -> tuple[int, int]:
    """The counters once the status shows at least ``events`` stored events (a condition with a deadline)."""
    got: list[tuple[int, int]] = []

    def ready() -> bool:
        now = _accept(server)
        if now is not None and now[1] >= events:
            got.append(now)
            return True
        return False

    assert wait_until(ready, deadline_s), f"status.json never showed {events} accepted events: {_accept(server)}"
    return got[-1]


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

    before = _accept_after(nsjms_server, 0)
    threads = [threading.Thread(target=supply, args=(k,), daemon=True) for k in range(SUPPLIERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert _stored_events(dsn) == EVENTS, "every push returned once its event was stored"
    after = _accept_after(nsjms_server, before[1] + EVENTS)
    commits, events = after[0] - before[0], after[1] - before[1]
    assert events == EVENTS, f"the accept side stored {events} events, {EVENTS} were pushed"
    assert commits < EVENTS, f"{commits} commits for {EVENTS} events: no commit was shared"   # before: >= EVENTS
    print(f"group commit: {commits} commits for {EVENTS} events from {SUPPLIERS} concurrent suppliers")

    proxy.resume_connection()
    assert consumer.wait_for(EVENTS, 120), f"{consumer.count()} of {EVENTS} delivered"
    got = sorted(event_id(x) for x in consumer.snapshot())
    assert got == sorted(k * 1000 + i for k in range(SUPPLIERS) for i in range(PER_SUPPLIER))
    assert wait_until(lambda: _stored_events(dsn) == 0, 60), "delivered events leave the store"
