"""Bridge throughput: channel → bridge → ActiveMQ queue, and ActiveMQ queue → bridge → channel.

    .venv/bin/python bench/bridge_bench.py [--messages 2000] [--transaction]

``--transaction`` adds the channel → JMS rows with routing transactions (``enable_transaction``: T2 of 100 events
per transaction, structured push with TransactionEvents = 100 and sequence push x100 with
TransactionEventSequences = 1), measured in the same run.

Baselines measured in the same run on the same broker: raw persistent STOMP sends with a receipt each, and
BEGIN + 100 SENDs + COMMIT with a receipt. The bridge is measured end to end (events pushed by a CORBA supplier
until the last one is confirmed on the other side); the channel is Persistent/Persistent in both directions.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)

from channel_bench import Counter, _consumer, _event, push_all
from common import METER, client_orb, node, preload, report, services, stomp_send_rate


def _persistent_channel(factory: Any, batch: int = 1) -> tuple[Any, int]:
    from omniORB import CORBA

    import CosNotification

    qos = [CosNotification.Property(CosNotification.ConnectionReliability,
                                    CORBA.Any(CORBA.TC_short, CosNotification.Persistent)),
           CosNotification.Property(CosNotification.EventReliability,
                                    CORBA.Any(CORBA.TC_short, CosNotification.Persistent)),
           CosNotification.Property(CosNotification.MaximumBatchSize, CORBA.Any(CORBA.TC_long, batch))]
    made: tuple[Any, int] = factory.create_channel(qos, [])
    return made


def _endpoint(role: str, cid: int | None, queue: str | None, sequence: bool) -> Any:
    from idl.generated import CosBridgeAdmin as BA

    if queue is not None:
        connector = BA.ExternalEndpointConnector(destination=BA.JMSDestination(BA.QUEUE, queue, ""))
        return BA.ExternalEndpoint(getattr(BA, role), connector, BA.PUSH, BA.JMS_MESSAGE)
    kind = BA.SEQUENCE_EVENT if sequence else BA.STRUCTURED_EVENT
    return BA.ExternalEndpoint(getattr(BA, role), BA.ExternalEndpointConnector(kind, cid), BA.PUSH, kind)


def _count_queue(url: str, queue: str, counter: Counter) -> Any:
    import stomp

    class L(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            counter.add(1)

    parts = urlsplit(url)
    conn = stomp.Connection12([(parts.hostname, parts.port)])
    conn.set_listener("c", L())
    conn.connect(wait=True)
    conn.subscribe(f"/queue/{queue}", id="1", ack="auto", headers={"activemq.prefetchSize": "1000"})
    return conn


#: How a channel → JMS run sees that its last event is on the queue (``--observe`` of paths.py, to_jms_drain.py):
#: ``store``: the channel's queue rows are gone (the node deletes a row only once the broker confirmed the COMMIT
#: that carried its event), polled every 5 ms; every message is then consumed and counted outside the timed
#: window. ``consumer``: a stomp.py consumer in this process receives each message during the run (its CPU and
#: the broker's dispatch to it compete with the path on the same cores; the raw baseline has no consumer).
OBSERVE = ("store", "consumer")
_POLL_S = 0.005


def wait_drained(dsn: str, cid: int, timeout: float = 600) -> None:
    """Wait until channel ``cid`` has no queue row left (every event delivered and confirmed by the broker); polls
    every 5 ms whether a row exists (its cost does not grow with the queue)."""
    _wait_rows(dsn, cid, "SELECT count(*) FROM (SELECT 1 FROM nsjms_queue WHERE channel_id = %s LIMIT 1) q",
               lambda rows: rows == 0, "still queued", timeout, _POLL_S)


def wait_stored(dsn: str, cid: int, n: int, timeout: float = 600) -> None:
    """Wait until channel ``cid`` has ``n`` queue rows (``n`` events stored for its one suspended consumer); polls
    every 20 ms (a count reads the rows)."""
    _wait_rows(dsn, cid, "SELECT count(*) FROM nsjms_queue WHERE channel_id = %s", lambda rows: rows >= n,
               f"stored, of {n}", timeout, 4 * _POLL_S)


def _wait_rows(dsn: str, cid: int, query: str, done: Callable[[int], bool], what: str, timeout: float,
               poll_s: float) -> None:
    """Run ``query`` (a count, parameter: the channel id) every ``poll_s`` until ``done(count)``.

    The polls run in ONE read-committed transaction (each statement sees the rows committed before it), rolled
    back at the end: they add no commit to ``pg_stat_database.xact_commit``, which the benches report per event."""
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn) as conn:
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        try:
            while True:
                row = conn.execute(query, (cid,)).fetchone()
                rows = row[0] if row else 0
                if done(rows):
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"channel {cid}: {rows} event(s) {what} after {timeout:g} s")
                time.sleep(poll_s)
        finally:
            conn.rollback()


class Arrivals:
    """How one channel → JMS run sees its end (:data:`OBSERVE`), set up before the timed window: :meth:`wait` ends
    the window, :meth:`close` afterwards (``store``: every message consumed and counted; ``consumer``: the live
    consumer disconnected). ``first`` is the time (``perf_counter``) of the first arrival at the live consumer."""

    def __init__(self, observe: str, url: str, queue: str, dsn: str | None, cid: int) -> None:
        if observe == "store" and dsn is None:
            raise ValueError("observe='store' needs the node's dsn")
        self.url, self.queue, self.dsn, self.cid = url, queue, dsn, cid
        self.first: float | None = None
        self.counter = Counter()
        self._conn = None if observe == "store" else _count_queue(url, queue, self._stamp())

    def _stamp(self) -> Counter:
        arrivals = self

        class Stamp(Counter):
            def add(self, k: int) -> None:
                if arrivals.first is None:
                    arrivals.first = time.perf_counter()
                arrivals.counter.add(k)

        return Stamp()

    def wait(self, n: int, timeout: float = 600) -> None:
        """Until the run's ``n`` events are on the queue (store: their rows gone; consumer: ``n`` received)."""
        if self._conn is None:
            assert self.dsn is not None
            wait_drained(self.dsn, self.cid, timeout)
        else:
            self.counter.wait(n, timeout=timeout)

    def close(self, n: int) -> None:
        if self._conn is None:
            count_all(self.url, self.queue, n)          # every message is on the queue: counted after the window
        else:
            self._conn.disconnect()


def count_all(url: str, queue: str, n: int, timeout: float = 60) -> None:
    """Consume ``queue`` until ``n`` messages arrived (raises if fewer arrive: a loss)."""
    counter = Counter()
    conn = _count_queue(url, queue, counter)
    try:
        counter.wait(n, timeout=timeout)
    finally:
        conn.disconnect()


def to_jms_rate(factory: Any, bf: Any, url: str, n: int, sequence: bool, tx: int = 0, *, dsn: str | None = None,
                observe: str = "consumer") -> float:
    """Events per second channel → JMS; ``tx`` > 0: the bridge's ``enable_transaction(tx, 0)`` first (T2).
    ``observe`` = ``store`` (needs ``dsn``, the node's database; not with T2): see :data:`OBSERVE`."""
    import CosNotifyChannelAdmin as NCA

    from idl.generated import NsjmsAdmin

    channel, cid = _persistent_channel(factory, 100 if sequence else 1)
    queue = f"bench.out.{cid}"
    bridge, _ = bf.create_bridge(_endpoint("SOURCE", cid, None, sequence), _endpoint("SINK", None, queue, sequence))
    if tx:
        bridge._narrow(NsjmsAdmin.ManagedBridge).enable_transaction(tx, 0)
    bridge.start_bridge()
    if observe == "store" and tx:
        raise ValueError("observe='store' is not for routing transactions")
    arrivals = Arrivals(observe, url, queue, dsn, cid)
    kind = NCA.SEQUENCE_EVENT if sequence else NCA.STRUCTURED_EVENT
    pc, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(kind)
    events = [_event(i) for i in range(n)]
    METER.start()
    t0 = time.perf_counter()
    push_all(pc, events, sequence)
    arrivals.wait(n)
    elapsed = time.perf_counter() - t0
    METER.stop(n)
    arrivals.close(n)
    bridge.destroy()
    channel.destroy()
    return n / elapsed


def _t2_channel(factory: Any, tx_events: int) -> tuple[Any, int]:
    """A channel with EnableTransaction TRUE (both reliabilities Persistent) and TransactionEvents."""
    from omniORB import CORBA

    import CosNotification

    qos = [CosNotification.Property("EnableTransaction", CORBA.Any(CORBA.TC_boolean, True))]
    admin = [CosNotification.Property("TransactionEvents", CORBA.Any(CORBA.TC_long, tx_events))]
    made: tuple[Any, int] = factory.create_channel(qos, admin)
    return made


def from_jms_rate(factory: Any, bf: Any, url: str, n: int, *, pull: bool = False, t2_events: int = 0,
                  dsn: str | None = None, observe: str = "consumer") -> float:
    """JMS → channel; ``pull``: the channel pulls from the bridge (NJI 2.7.2); ``t2_events`` > 0: with
    EnableTransaction, TransactionEvents = ``t2_events`` (the routing transaction T2, pull only).

    ``observe`` = ``consumer``: until the channel's structured push consumer (a CORBA servant of this process) has
    every event. ``store`` (needs ``dsn``): that consumer's proxy is suspended, the run ends once the channel has
    stored all ``n`` events for it (the bridge acknowledges a message to the broker only after its event is
    stored); the proxy is then resumed and the consumer must receive all ``n``, outside the timed window."""

    import CosNotifyChannelAdmin as NCA

    from idl.generated import CosBridgeAdmin as BA

    channel, cid = _t2_channel(factory, t2_events) if t2_events else _persistent_channel(factory)
    queue = f"bench.in.{cid}"
    preload(url, queue, n)      # the measurement is the bridge draining the queue into the channel
    counter = Counter()
    consumer = _consumer(counter, False)
    ps, _ = channel._get_default_consumer_admin().obtain_notification_push_supplier(NCA.STRUCTURED_EVENT)
    ps = ps._narrow(NCA.StructuredProxyPushSupplier)
    ps.connect_structured_push_consumer(consumer._this())
    by_store = observe == "store"
    if by_store:
        if dsn is None:
            raise ValueError("observe='store' needs the node's dsn")
        ps.suspend_connection()
    sink = _endpoint("SINK", cid, None, False)
    if pull:
        sink = BA.ExternalEndpoint(BA.SINK, sink.connector, BA.PULL, sink.type)
    bridge, _ = bf.create_bridge(_endpoint("SOURCE", None, queue, False), sink)
    METER.start()
    t0 = time.perf_counter()
    bridge.start_bridge()
    if by_store:
        assert dsn is not None
        wait_stored(dsn, cid, n)
    else:
        counter.wait(n)
    elapsed = time.perf_counter() - t0
    METER.stop(n)
    if by_store:
        ps.resume_connection()
        counter.wait(n, timeout=60)
    bridge.destroy()
    channel.destroy()
    return n / elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--transaction", action="store_true", help="also measure channel -> JMS in T2")
    ap.add_argument("--inbound", action="store_true",
                    help="only JMS -> channel: push, pull, and pull inside T2 (EnableTransaction, TransactionEvents="
                         "100), each the median of --runs runs")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    n = args.messages
    if args.inbound:
        return inbound_bench(n, args.runs)
    with services() as (dsn, url):
        s1 = stomp_send_rate(url, 1000)
        s100 = stomp_send_rate(url, 5000, per_tx=100)
        with node(dsn, url) as ep:
            import CosNotifyChannelAdmin as NCA

            from idl.generated import CosBridgeAdmin as BA

            orb = client_orb()
            factory = orb.string_to_object(ep["event_channel_factory"]["corbaloc"])._narrow(NCA.EventChannelFactory)
            bf = orb.string_to_object(ep["bridge_factory"]["corbaloc"])._narrow(BA.BridgeFactory)
            to_jms_rate(factory, bf, url, 200, False)        # warm-up
            single = to_jms_rate(factory, bf, url, n, False)
            batched = to_jms_rate(factory, bf, url, n * 5, True)
            inbound = from_jms_rate(factory, bf, url, n)
            t2_single = to_jms_rate(factory, bf, url, n, False, tx=100) if args.transaction else 0.0
            t2_batched = to_jms_rate(factory, bf, url, n * 5, True, tx=1) if args.transaction else 0.0
    rows = [
        ("channel -> JMS, structured push (receipt per message)", single, "STOMP send+receipt", s1),
        ("channel -> JMS, sequence push x100 (one STOMP tx per batch)", batched, "STOMP tx of 100", s100),
        ("JMS -> channel, listener, ack after the channel accepted", inbound, "STOMP send+receipt", s1),
    ]
    if args.transaction:
        rows += [
            ("channel -> JMS, structured push, T2 (TransactionEvents=100)", t2_single, "STOMP tx of 100", s100),
            ("channel -> JMS, sequence push x100, T2 (1 sequence per T2)", t2_batched, "STOMP tx of 100", s100),
        ]
    report(f"bridge, 1 KB payloads, persistent channel and persistent JMS messages ({n} messages)", rows)
    return 0


def inbound_bench(n: int, runs: int) -> int:
    import statistics

    with services() as (dsn, url):
        raw = stomp_consume_rate(url, n)
        with node(dsn, url) as ep:
            import CosNotifyChannelAdmin as NCA

            from idl.generated import CosBridgeAdmin as BA

            orb = client_orb()
            factory = orb.string_to_object(ep["event_channel_factory"]["corbaloc"])._narrow(NCA.EventChannelFactory)
            bf = orb.string_to_object(ep["bridge_factory"]["corbaloc"])._narrow(BA.BridgeFactory)
            from_jms_rate(factory, bf, url, 200)                                   # warm-up
            rates: dict[str, list[float]] = {"push": [], "pull": [], "t2": []}
            for _ in range(runs):
                rates["push"].append(from_jms_rate(factory, bf, url, n))
                rates["pull"].append(from_jms_rate(factory, bf, url, n, pull=True))
                rates["t2"].append(from_jms_rate(factory, bf, url, n, pull=True, t2_events=100))
    med = {k: statistics.median(v) for k, v in rates.items()}
    for k, v in rates.items():
        print(f"  {k}: runs {', '.join(f'{r:.0f}' for r in v)} /s")
    report(f"JMS -> channel, 1 KB payloads, persistent ({n} messages, median of {runs})", [
        ("push (listener), ack after the channel accepted", med["push"], "raw STOMP consume+ack", raw),
        ("pull (the channel pulls from the bridge)", med["pull"], "raw STOMP consume+ack", raw),
        ("pull inside T2, TransactionEvents=100 (2PC, inbox)", med["t2"], "raw STOMP consume+ack", raw),
    ])
    return 0


def stomp_consume_rate(url: str, n: int) -> float:
    """Raw stomp.py: preload ``n`` persistent messages, then consume them with client-individual acks."""
    import threading

    import stomp

    parts = urlsplit(url)
    queue = f"bench.raw.{time.monotonic_ns()}"
    preload(url, queue, n)
    conn = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False)
    conn.connect(wait=True)
    done = threading.Event()
    got = [0]

    class L(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            conn.ack(frame.headers["ack"])
            got[0] += 1
            if got[0] >= n:
                done.set()

    conn.set_listener("c", L())
    t0 = time.perf_counter()
    conn.subscribe(f"/queue/{queue}", id="1", ack="client-individual", headers={"activemq.prefetchSize": "1000"})
    done.wait(300)
    elapsed = time.perf_counter() - t0
    conn.disconnect()
    return n / elapsed


if __name__ == "__main__":
    sys.exit(main())
