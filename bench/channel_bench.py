"""Channel throughput: supplier push → channel → push consumer, over IIOP between processes.

    .venv/bin/python bench/channel_bench.py [--events 2000]

Measures, in the same run: PostgreSQL commit baselines (1 and 100 rows per transaction) and a raw IIOP baseline
(a oneway-free push to a consumer servant in this process from the node... i.e. the same consumer, fed by the
channel with BestEffort events), then the channel with BestEffort and Persistent events, structured (one event per
call) and sequence (100 events per call). Reports events/s and ratios.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)

from common import PAYLOAD, client_orb, node, pg_commit_rate, report, services


def _event(i: int) -> Any:
    from omniORB import CORBA

    import CosNotification

    header = CosNotification.EventHeader(
        CosNotification.FixedEventHeader(CosNotification.EventType("Bench", "Event"), f"e{i}"), [])
    return CosNotification.StructuredEvent(header, [CosNotification.Property("n", CORBA.Any(CORBA.TC_long, i))],
                                           CORBA.Any(CORBA.TC_string, PAYLOAD))


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self.cond = threading.Condition()

    def add(self, k: int) -> None:
        with self.cond:
            self.n += k
            self.cond.notify_all()

    def wait(self, target: int, timeout: float = 300) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.n >= target, timeout):
                raise RuntimeError(f"only {self.n}/{target} events arrived")



def push_all(pc: Any, events: list[Any], sequence: bool) -> None:
    """Connect the proxy push consumer ``pc`` and push ``events``: in sequences of 100, or one structured event per
    call."""
    import CosNotifyChannelAdmin as NCA

    if sequence:
        pc = pc._narrow(NCA.SequenceProxyPushConsumer)
        pc.connect_sequence_push_supplier(None)
        for i in range(0, len(events), 100):
            pc.push_structured_events(events[i:i + 100])
    else:
        pc = pc._narrow(NCA.StructuredProxyPushConsumer)
        pc.connect_structured_push_supplier(None)
        for ev in events:
            pc.push_structured_event(ev)

def _consumer(counter: Counter, sequence: bool) -> Any:
    import CosNotifyComm__POA

    base = CosNotifyComm__POA.SequencePushConsumer if sequence else CosNotifyComm__POA.StructuredPushConsumer

    class Consumer(base):  # type: ignore[misc, valid-type]
        def push_structured_event(self, ev: Any) -> None:
            counter.add(1)

        def push_structured_events(self, evs: Any) -> None:
            counter.add(len(evs))

        def disconnect_structured_push_consumer(self) -> None: ...
        def disconnect_sequence_push_consumer(self) -> None: ...
        def offer_change(self, a: Any, r: Any) -> None: ...

    return Consumer()


def channel_rate(orb: Any, factory: Any, persistent: bool, sequence: bool, n: int, filters: int = 0) -> float:
    from omniORB import CORBA

    import CosNotification
    import CosNotifyChannelAdmin as NCA

    rel = CosNotification.Persistent if persistent else CosNotification.BestEffort
    qos = [CosNotification.Property(CosNotification.ConnectionReliability, CORBA.Any(CORBA.TC_short, rel)),
           CosNotification.Property(CosNotification.EventReliability, CORBA.Any(CORBA.TC_short, rel))]
    if sequence:
        qos.append(CosNotification.Property(CosNotification.MaximumBatchSize, CORBA.Any(CORBA.TC_long, 100)))
    channel, _ = factory.create_channel(qos, [])
    kind = NCA.SEQUENCE_EVENT if sequence else NCA.STRUCTURED_EVENT
    counter = Counter()
    consumer = _consumer(counter, sequence)
    ps, _ = channel._get_default_consumer_admin().obtain_notification_push_supplier(kind)
    if sequence:
        ps._narrow(NCA.SequenceProxyPushSupplier).connect_sequence_push_consumer(consumer._this())
    else:
        ps._narrow(NCA.StructuredProxyPushSupplier).connect_structured_push_consumer(consumer._this())
    pc, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(kind)
    events = [_event(i) for i in range(n)]
    t0 = time.perf_counter()
    push_all(pc, events, sequence)
    counter.wait(n)
    elapsed = time.perf_counter() - t0
    channel.destroy()
    return n / elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=2000)
    args = ap.parse_args()
    n = args.events
    with services() as (dsn, broker_url):
        pg1 = pg_commit_rate(dsn, 1000, 1)
        pg100 = pg_commit_rate(dsn, 5000, 100)
        with node(dsn, broker_url) as ep:
            import CosNotifyChannelAdmin as NCA

            orb = client_orb()
            factory = orb.string_to_object(ep["event_channel_factory"]["corbaloc"])._narrow(NCA.EventChannelFactory)
            channel_rate(orb, factory, False, False, 200)   # warm-up
            be = channel_rate(orb, factory, False, False, n)
            pers = channel_rate(orb, factory, True, False, n)
            be_seq = channel_rate(orb, factory, False, True, n * 5)
            pers_seq = channel_rate(orb, factory, True, True, n * 5)
    report(f"channel, 1 KB structured events, 1 supplier -> 1 push consumer ({n} events)", [
        ("BestEffort, push_structured_event", be, "PG commit 1 row/tx", pg1),
        ("Persistent, push_structured_event", pers, "PG commit 1 row/tx", pg1),
        ("BestEffort, push_structured_events x100 (batch 100)", be_seq, "PG 100 rows/tx", pg100),
        ("Persistent, push_structured_events x100 (batch 100)", pers_seq, "PG 100 rows/tx", pg100),
    ])
    print("\nPersistent events cost one transaction to store (with their queue rows) and one per delivery batch to"
          " remove; the PG ratios show how close the channel runs to the database's own commit rate.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
