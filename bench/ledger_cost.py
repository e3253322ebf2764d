"""The delivery ledger's cost: the channel and bridge benches with the ledger off and on, in the same run.

    .venv/bin/python bench/ledger_cost.py [--events 2000] [--messages 1000] [--rounds 3]

Runs the persistent measurements of ``channel_bench.py`` (``--events``) and ``bridge_bench.py`` (``--messages``)
on a node started with ``NSJMS_LEDGER_ENABLED=false`` and one with ``true``, alternating which goes first in each
round (``--rounds``, default 3), on the same PostgreSQL and broker; prints the median rate of each and the ratio
on/off. BestEffort traffic is not measured: it writes no ledger rows unless ``ledger.best_effort`` is set.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import omniORB  # noqa: F401  (puts the COS stubs on sys.path)

from bridge_bench import from_jms_rate, to_jms_rate
from channel_bench import channel_rate
from common import client_orb, node, services

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    runs: dict[bool, list[list[float]]] = {False: [], True: []}
    with services() as (dsn, url):
        for r in range(args.rounds):
            for ledger in ((False, True) if r % 2 == 0 else (True, False)):
                rates = one_node(dsn, url, ledger, args.events, args.messages)
                runs[ledger].append(rates)
                print(f"round {r + 1} ledger {'on ' if ledger else 'off'}: "
                      + ", ".join(f"{x:,.0f}" for x in rates), flush=True)
    off = [statistics.median(col) for col in zip(*runs[False], strict=True)]
    on = [statistics.median(col) for col in zip(*runs[True], strict=True)]
    print(f"\n== ledger cost, median of {args.rounds} rounds (events {args.events}, messages {args.messages})")
    print(f"{'measurement':<62} {'off/s':>9} {'on/s':>9} {'on/off':>7}")
    for what, a, b in zip(MEASUREMENTS, off, on, strict=True):
        print(f"{what:<62} {a:>9,.0f} {b:>9,.0f} {b / a:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
