"""JMS → channel without a routing transaction (one local unit of work per round: router.channel.t2in.local_round)
while the node's PostgreSQL connections are killed under it, with a real node, PostgreSQL and ActiveMQ.

The faults land at counted points, never by timing (issue 29: the test failed on a loaded machine because its
kills, paced by the inbox's progress, came too late): the node runs with the pause points of
``router.routing.crashpoints`` armed, ``in.local.after_take`` (the round's inbox claims made in its open transaction:
the kill fails the events' statement) at its 2nd, 4th and 6th passage and ``in.local.before_commit`` (the events
stored, the COMMIT not sent: the kill fails the COMMIT, whose outcome the node then does not know) at its 3rd, 5th
and 7th; at each the test terminates every backend of the node's database (``pg_terminate_backend``) and lets the
round go on. Six faults, in every run, while the bridge moves a preloaded queue into a Persistent channel. Counted
at a standard CORBA pull consumer drained afterwards, by the ``n`` header of each message: every message exactly
once, **in the order the broker delivered them**, an inbox row per message, nothing left on the queue.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from idl.generated import CosBridgeAdmin as BA

from bridgekit import (
    bridge_factory,
    bridge_status,
    channel_ep,
    jms_ep,
    leftover,
    persistent_channel,
    stomp_produce,
    unique_name,
)
from conftest import NsjmsServer, started_node
from stdclients import Form, PullConsumerClient, Style, obtain_proxy_supplier, wait_until

pytestmark = pytest.mark.integration

TIMEOUT_S = 90.0
PAUSES = {"in.local.after_take": (2, 4, 6), "in.local.before_commit": (3, 5, 7)}
KILLS = sum(len(p) for p in PAUSES.values())


OURS = "nsjms-fault-test"      # the application_name of this test's own connections: never terminated


def _terminate_node_backends(dsn: str) -> int:
    """Terminate every backend of the database but this test's (the node's pooled connections); how many."""
    with psycopg.connect(dsn, autocommit=True, application_name=OURS) as conn:
        row = conn.execute("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                           "AND backend_type = 'client backend' AND application_name <> %s", (OURS,)).fetchone()
    return int(row[0]) if row else 0


def inbox_count(dsn: str, bid: int) -> int:
    """bridge ``bid``'s inbox rows, read on a connection the killer leaves alone."""
    with psycopg.connect(dsn, application_name=OURS) as conn:
        row = conn.execute("SELECT count(*) FROM nsjms_inbox WHERE bridge_id = %s", (bid,)).fetchone()
    return int(row[0]) if row else 0


def _ids_in_order(client: PullConsumerClient, n: int) -> list[int]:
    got = client.drain(n, TIMEOUT_S)
    got += client.drain(n, 1.0)          # anything more is a duplicate
    return [int({p.name: p.value.value() for p in ev.filterable_data}["n"]) for ev in got]


@pytest.mark.parametrize("style", ["PUSH", "PULL"])
def test_killed_database_connections_lose_nothing_duplicate_nothing_and_keep_the_order(
        tmp_path: Path, client_orb: Any, broker_url: str, fresh_db: str, style: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    monkeypatch.setenv("NSJMS_PAUSE_AT", ",".join(f"{p}@{'/'.join(map(str, n))}" for p, n in PAUSES.items()))
    monkeypatch.setenv("NSJMS_PAUSE_DIR", str(pauses))
    with started_node(tmp_path / "state", fresh_db, broker_url) as server:
        _moves_everything_under_faults(server, client_orb.factory(server.ior()), client_orb, broker_url, fresh_db,
                                       style, pauses)


def _moves_everything_under_faults(nsjms_server: NsjmsServer, factory: Any, client_orb: Any, broker_url: str,
                                   fresh_db: str, style: str, pauses: Path) -> None:
    n = 1500
    queue = unique_name(f"localin.faults.{style}")
    channel, cid = persistent_channel(factory)
    proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, Form.SEQUENCE, Style.PULL)
    consumer = PullConsumerClient(proxy, Form.SEQUENCE, 100)
    consumer.connect()
    stomp_produce(broker_url, queue, range(n))
    bf = bridge_factory(client_orb, nsjms_server)
    bridge, bid = bf.create_bridge(jms_ep(BA.SOURCE, queue), channel_ep(BA.SINK, cid, getattr(BA, style)))

    kills: list[tuple[str, int]] = []        # (the pause it landed at, backends terminated)
    stop = threading.Event()

    def killer() -> None:            # at each pause the node reached: kill its connections, then let it go on
        while not stop.is_set() and len(kills) < KILLS:
            for reached in sorted(pauses.glob("*.reached")):
                go = reached.with_suffix(".go")
                if not go.exists():
                    kills.append((reached.stem, _terminate_node_backends(fresh_db)))
                    go.write_text("go")
            stop.wait(0.02)

    bridge.start_bridge()
    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: inbox_count(fresh_db, bid) >= n, TIMEOUT_S), \
            f"{inbox_count(fresh_db, bid)} inbox rows of {n} after the kills {kills}; bridge " \
            f"{bridge_status(nsjms_server, bid)}; node log: {_tail(nsjms_server)}"
    finally:
        stop.set()
        thread.join(10)
    expected = sorted(f"{p}.{i}" for p, passages in PAUSES.items() for i in passages)
    assert sorted(k[0] for k in kills) == expected, f"every armed pause was reached and killed at: {kills}"
    assert all(k[1] > 0 for k in kills), f"each kill ended the node's connection in its round: {kills}"
    failed = _round_failures(nsjms_server)
    assert failed > 0, f"no round failed under the kills {kills}: {_tail(nsjms_server)}"
    got = _ids_in_order(consumer, n)
    dups = len(got) - len(set(got))
    assert sorted(set(got)) == list(range(n)) and dups == 0, \
        f"lost {sorted(set(range(n)) - set(got))[:10]}, {dups} duplicate(s)"
    assert got == list(range(n)), f"out of order from index {next(i for i, v in enumerate(got) if v != i)}"
    assert inbox_count(fresh_db, bid) == n

    def settled() -> bool:                   # acked: as events, or as redeliveries the inbox recognised
        status = bridge_status(nsjms_server, bid)
        return int(status.get("forwarded", 0)) + int(status.get("duplicates_suppressed", 0)) >= n

    assert wait_until(settled, 30), bridge_status(nsjms_server, bid)
    bridge.destroy()
    left = leftover(broker_url, queue)
    assert left == 0, f"{left} message(s) still on the queue: their acks were not written"


def _round_failures(server: NsjmsServer) -> int:
    """Rounds the node logged as failed (and retried): the push loop's and the pull proxy's lines."""
    text = server.stderr_path.read_text(errors="replace")
    return text.count("receive loop failed") + text.count("pulling from its bridge failed")


def _tail(server: NsjmsServer) -> str:
    try:
        return server.stderr_path.read_text(errors="replace")[-3000:]
    except OSError as exc:
        return str(exc)
