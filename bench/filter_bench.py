"""Filtering cost: constraint evaluations per second, and channel throughput with 0, 1 and 10 filters attached.

    .venv/bin/python bench/filter_bench.py [--events 2000] [--seconds 1.0]

Part 1 (in process): evaluations/s of a compiled constraint, of a ``FilterImpl`` (event-type check + constraint),
and of a ``FilterImpl`` with 10 constraints of which only the last matches.
Part 2 (a real node, IIOP between processes): structured push supplier → channel → structured push consumer,
BestEffort events, with no filter (the baseline, measured in the same run), then with 1 and 10 filters on the
proxy supplier. With 10 filters, nine do not match and the tenth does (the OR over filters is evaluated in
full). Filters come from the channel's default filter factory, so the channel evaluates them in process.
Reports events/s and the ratio to the baseline; the numbers are machine-specific.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)

from channel_bench import Counter, _consumer, _event
from common import client_orb, node, report, services

MATCH = "$type_name == 'Event' and $n >= 0"
MISS = "$type_name == 'Event' and $n < 0"


def _evals_per_s(call: Callable[[], object], seconds: float) -> float:
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(200):
            call()
        count += 200
    return count / (time.perf_counter() - start)


class _Repo:
    """In-memory stand-in for the filter table (part 1 needs no database)."""

    def migrate(self) -> None: ...
    def next_id(self) -> int: return 1
    def insert(self, *a: Any) -> None: ...
    def save(self, *a: Any) -> None: ...


class _Rt:
    store = None

    def activate(self, oid: str, servant: Any) -> Any: return oid
    def spawn(self, name: str, fn: Callable[[], None]) -> None: fn()


def in_process(seconds: float) -> list[tuple[str, float, str, float]]:
    import CosNotification
    import CosNotifyFilter

    from router.channel import filters as F
    from router.etcl import compile_constraint

    ev = _event(7)
    constraint = compile_constraint(MATCH)
    factory = F.FilterFactoryImpl.__new__(F.FilterFactoryImpl)
    factory.rt, factory.repo, factory.filters, factory.on_change = _Rt(), _Repo(), {}, None
    one = F.FilterImpl(factory, 1, F.GRAMMAR)
    one.add_constraints([CosNotifyFilter.ConstraintExp([CosNotification.EventType("Bench", "*")], MATCH)])
    ten = F.FilterImpl(factory, 2, F.GRAMMAR)
    ten.add_constraints([CosNotifyFilter.ConstraintExp([], MISS)] * 9 + [CosNotifyFilter.ConstraintExp([], MATCH)])
    base = _evals_per_s(lambda: constraint.match_structured(ev), seconds)
    return [
        ("compiled constraint, match_structured", base, "itself", base),
        ("FilterImpl, 1 constraint (type list + expression)", _evals_per_s(lambda: one.match_structured(ev), seconds),
         "compiled constraint", base),
        ("FilterImpl, 10 constraints (last matches)", _evals_per_s(lambda: ten.match_structured(ev), seconds),
         "compiled constraint", base),
    ]


def channel_rate(factory: Any, n: int, filters: int) -> float:
    import CosNotifyChannelAdmin as NCA
    import CosNotifyFilter

    channel, _ = factory.create_channel([], [])
    counter = Counter()
    ps, _ = channel._get_default_consumer_admin().obtain_notification_push_supplier(NCA.STRUCTURED_EVENT)
    ps = ps._narrow(NCA.StructuredProxyPushSupplier)
    ff = channel._get_default_filter_factory()
    for k in range(filters):
        flt = ff.create_filter("EXTENDED_TCL")
        flt.add_constraints([CosNotifyFilter.ConstraintExp([], MATCH if k == filters - 1 else MISS)])
        ps.add_filter(flt)
    ps.connect_structured_push_consumer(_consumer(counter, False)._this())
    pc, _ = channel._get_default_supplier_admin().obtain_notification_push_consumer(NCA.STRUCTURED_EVENT)
    pc = pc._narrow(NCA.StructuredProxyPushConsumer)
    pc.connect_structured_push_supplier(None)
    events = [_event(i) for i in range(n)]
    t0 = time.perf_counter()
    for ev in events:
        pc.push_structured_event(ev)
    counter.wait(n)
    elapsed = time.perf_counter() - t0
    channel.destroy()
    return n / elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args(argv)
    client_orb()                                  # an ORB for CDR and the in-process servants
    report("constraint evaluations, in process (1 KB structured event)", in_process(args.seconds))
    with services() as (dsn, broker_url), node(dsn, broker_url) as ep:
        import CosNotifyChannelAdmin as NCA

        orb = client_orb()
        factory = orb.string_to_object(ep["event_channel_factory"]["corbaloc"])._narrow(NCA.EventChannelFactory)
        channel_rate(factory, 200, 0)          # warm-up
        base = channel_rate(factory, args.events, 0)
        rows = [("no filter (baseline)", base, "no filter", base)]
        for k in (1, 10):
            rows.append((f"{k} filter(s) on the proxy supplier", channel_rate(factory, args.events, k),
                         "no filter", base))
    report(f"channel, structured push -> push consumer, BestEffort ({args.events} events)", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
