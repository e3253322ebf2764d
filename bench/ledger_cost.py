"""The delivery ledger's cost: the channel and bridge benches with the ledger off and on, in the same run.

    .venv/bin/python bench/ledger_cost.py [--events 2000] [--messages 1000] [--rounds 3] [--store-only]

Runs the persistent measurements of ``channel_bench.py`` (``--events``) and ``bridge_bench.py`` (``--messages``)
on a node started with ``NSJMS_LEDGER_ENABLED=false`` and one with ``true``, alternating which goes first in each
round (``--rounds``, default 3), on the same PostgreSQL and broker; prints the median rate of each and the ratio
on/off. BestEffort traffic is not measured: it writes no ledger rows unless ``ledger.best_effort`` is set.

It also measures the store's own cycle without ORB or broker (what the ledger adds to): ``Store.insert_events``
(event, queue row, ``accepted`` row) then ``Store.delete_deliveries`` (queue row, ``delivered`` row) and
``delete_events``, each in its own unit of work, for 1 and 100 events per unit of work, ledger off and on, on a
fresh database; the end-to-end numbers vary with the machine's load far more than the ledger costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)

from bridge_bench import from_jms_rate, to_jms_rate
from channel_bench import channel_rate
from common import PAYLOAD, client_orb, node, services

MEASUREMENTS = (
    "channel: Persistent, push_structured_event",
    "channel: Persistent, push_structured_events x100 (batch 100)",
    "bridge: channel -> JMS, structured push",
    "bridge: channel -> JMS, sequence push x100",
    "bridge: JMS -> channel, listener",
)


def one_node(dsn: str, url: str, ledger: bool, events: int, messages: int) -> list[float]:
    os.environ["NSJMS_LEDGER_ENABLED"] = "true" if ledger else "false"
    with node(dsn, url) as ep:
        import CosNotifyChannelAdmin as NCA

        from idl.generated import CosBridgeAdmin as BA

        orb = client_orb()
        factory = orb.string_to_object(ep["event_channel_factory"]["corbaloc"])._narrow(NCA.EventChannelFactory)
        bf = orb.string_to_object(ep["bridge_factory"]["corbaloc"])._narrow(BA.BridgeFactory)
        channel_rate(orb, factory, True, False, 200)      # warm-up
        to_jms_rate(factory, bf, url, 100, False)
        return [
            channel_rate(orb, factory, True, False, events),
            channel_rate(orb, factory, True, True, events * 5),
            to_jms_rate(factory, bf, url, messages, False),
            to_jms_rate(factory, bf, url, messages * 5, True),
            from_jms_rate(factory, bf, url, messages),
        ]


def store_rate(dsn: str, ledger: bool, n: int, batch: int) -> float:
    """Events per second through insert_events + delete_deliveries + delete_events on a fresh database."""
    import psycopg

    from router.channel.store import NewEvent, Store
    from router.db import Database
    from router.routing.ledger import LedgerSettings, LedgerWriter

    db_name = f"ledger_cost_{os.getpid()}_{int(time.time() * 1000)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db_name}"')
    db = Database(psycopg.conninfo.make_conninfo(dsn, dbname=db_name), 2)
    try:
        db.open()
        store = Store(LedgerWriter(LedgerSettings(enabled=ledger)))
        with db.unit_of_work() as conn:
            cid = store.next_channel_id(conn)
            store.insert_channel(conn, cid, {}, {}, {"C": {}, "S": {}})
        body, seq = PAYLOAD.encode(), 0
        t0 = time.perf_counter()
        for _ in range(0, n, batch):
            events = []
            for _ in range(batch):
                seq += 1
                events.append(NewEvent(seq, 1, body, 0, None, None, [(0, 0)], time.time()))
            with db.unit_of_work() as conn:
                ids = store.insert_events(conn, cid, events)
            with db.unit_of_work() as conn:
                store.delete_deliveries(conn, cid, 0, 0, ids)
            with db.unit_of_work() as conn:
                store.delete_events(conn, ids)
        return n / (time.perf_counter() - t0)
    finally:
        db.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')


def _table(title: str, names: tuple[str, ...], runs: dict[bool, list[list[float]]]) -> None:
    off = [statistics.median(col) for col in zip(*runs[False], strict=True)]
    on = [statistics.median(col) for col in zip(*runs[True], strict=True)]
    print(f"\n== {title}")
    print(f"{'measurement':<62} {'off/s':>9} {'on/s':>9} {'on/off':>7}")
    for what, a, b in zip(names, off, on, strict=True):
        print(f"{what:<62} {a:>9,.0f} {b:>9,.0f} {b / a:>7.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--store-only", action="store_true", help="only the store cycle (no node, no broker)")
    args = ap.parse_args()
    store_names = ("store: 1 event per unit of work", "store: 100 events per unit of work")
    store_runs: dict[bool, list[list[float]]] = {False: [], True: []}
    runs: dict[bool, list[list[float]]] = {False: [], True: []}
    with services() as (dsn, url):
        for r in range(args.rounds):
            for ledger in ((False, True) if r % 2 == 0 else (True, False)):
                rates = [store_rate(dsn, ledger, args.events, 1), store_rate(dsn, ledger, args.events * 5, 100)]
                store_runs[ledger].append(rates)
                print(f"round {r + 1} store, ledger {'on ' if ledger else 'off'}: "
                      + ", ".join(f"{x:,.0f}" for x in rates), flush=True)
        if not args.store_only:
            for r in range(args.rounds):
                for ledger in ((False, True) if r % 2 == 0 else (True, False)):
                    rates = one_node(dsn, url, ledger, args.events, args.messages)
                    runs[ledger].append(rates)
                    print(f"round {r + 1} ledger {'on ' if ledger else 'off'}: "
                          + ", ".join(f"{x:,.0f}" for x in rates), flush=True)
    rounds = f"median of {args.rounds} rounds"
    _table(f"ledger cost in the store, {rounds} ({args.events} / {args.events * 5} events)", store_names, store_runs)
    if not args.store_only:
        _table(f"ledger cost end to end, {rounds} (events {args.events}, messages {args.messages})", MEASUREMENTS,
               runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
