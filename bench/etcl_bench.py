"""Micro benchmark of the ETCL engine: constraint evaluations per second for a few typical constraints.

Run: ``python bench/etcl_bench.py [--seconds 1.0]``. Prints one line per constraint plus the compile
rate. The numbers are machine-specific; compare runs on the same machine only.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import omniORB  # noqa: F401  (before CosNotification)
from omniORB import CORBA
from omniORB.any import to_any

import CosNotification as N

from router.etcl import compile_constraint

CONSTRAINTS = [
    "",
    "$type_name == 'CommunicationsAlarm'",
    "$type_name == 'CommunicationsAlarm' and not ($event_name == 'lost_packet')",
    "$type_name == 'CommunicationsAlarm' and $Priority >= 1 and $Priority <= 5",
    "$.header.variable_header(Priority) > 2 or $severity + 1 > 3",
    "'link' ~ $reason and 'b' in $.filterable_data(tags)",
    "exist $.header.variable_header(required_rights)",
]


def _event() -> object:
    header = N.EventHeader(N.FixedEventHeader(N.EventType("Telecom", "CommunicationsAlarm"), "ev1"),
                           [N.Property("Priority", CORBA.Any(CORBA.TC_short, 3))])
    body = [N.Property("severity", to_any(4)), N.Property("reason", to_any("link down")),
            N.Property("tags", to_any(["a", "b", "c"]))]
    return N.StructuredEvent(header, body, CORBA.Any(CORBA.TC_null, None))


def _rate(call: Callable[[], object], seconds: float) -> float:
    count, start = 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(100):
            call()
        count += 100
    return count / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    args = parser.parse_args(argv)
    event = _event()
    for text in CONSTRAINTS:
        constraint = compile_constraint(text)
        result = constraint.match_structured(event)
        rate = _rate(functools.partial(constraint.match_structured, event), args.seconds)
        print(f"{rate:12,.0f} evals/s  {result!s:5}  {text or '(empty)'}")
    compile_rate = _rate(lambda: compile_constraint(CONSTRAINTS[3]), args.seconds)
    print(f"{compile_rate:12,.0f} compiles/s        {CONSTRAINTS[3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
