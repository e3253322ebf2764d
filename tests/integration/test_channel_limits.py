"""The channel's own answers win over the ORB's for pushes that are too large or nested too deep (issue 31).

A supplier process (standard stubs, its own ORB allowing 64 MB messages) pushes to a running node:

* a 20 MB event: before, the node's ORB limit (2 x 8 MiB + 1 MiB = 17 MiB) cut the connection and the supplier saw
  ``COMM_FAILURE``, which suppliers retry (a loop); now the channel answers ``IMP_LIMIT`` ``COMPLETED_NO`` with
  ``MINOR_EVENT_TOO_LARGE``;
* an Any nested 5,000 deep: before ``UNKNOWN`` ``COMPLETED_MAYBE`` (a RecursionError while sizing it); now
  ``BAD_PARAM`` ``COMPLETED_NO`` with ``MINOR_EVENT_TOO_DEEP``;

and the small events pushed around them are delivered to a consumer, in order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from router.channel.boundary import MINOR_EVENT_TOO_DEEP, MINOR_EVENT_TOO_LARGE

from stdclients import (
    Form,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
)

pytestmark = pytest.mark.integration

S = Form.STRUCTURED
DEADLINE_S = 60.0

SUPPLIER = r"""
import json, sys
import omniORB
from omniORB import CORBA
import CosNotifyChannelAdmin
from stdclients import make_event

ior, plan = sys.argv[1], json.loads(sys.argv[2])
orb = CORBA.ORB_init(["supplier", "-ORBgiopMaxMsgSize", str(64 * 1000 * 1000),
                      "-ORBclientCallTimeOutPeriod", "60000"], CORBA.ORB_ID)
proxy = orb.string_to_object(ior)._narrow(CosNotifyChannelAdmin.StructuredProxyPushConsumer)
proxy.connect_structured_push_supplier(None)
for i, (kind, n) in enumerate(plan):
    ev = make_event(i)
    if kind == "big":
        ev.remainder_of_body = CORBA.Any(CORBA.TC_string, "x" * n)
    elif kind == "deep":
        value = CORBA.Any(CORBA.TC_long, i)
        for _ in range(n):
            value = CORBA.Any(CORBA.TC_any, value)
        ev.remainder_of_body = value
    try:
        proxy.push_structured_event(ev)
        print(json.dumps({"i": i, "ok": True}), flush=True)
    except CORBA.SystemException as exc:
        print(json.dumps({"i": i, "exc": type(exc).__name__, "minor": exc.minor,
                          "completed": str(exc.completed)}), flush=True)
orb.destroy()
"""


def push_from_process(ior: str, plan: list[tuple[str, int]]) -> list[dict[str, Any]]:
    here = str(Path(__file__).resolve().parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", SUPPLIER, ior, json.dumps(plan)], capture_output=True, text=True,
                         env=env, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_too_large_and_too_deep_pushes_get_the_channels_answer(shared_factory: Any, client_orb: Any) -> None:
    channel, _ = shared_factory.create_channel([], [])
    push_proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, S, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(push_proxy, S, consumer)
    supplier_proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, S, Style.PUSH)

    plan = [("small", 0), ("big", 20 * 1000 * 1000), ("small", 0), ("deep", 5000), ("small", 0)]
    results = push_from_process(client_orb.orb.object_to_string(supplier_proxy), plan)

    assert [r["i"] for r in results] == [0, 1, 2, 3, 4]
    assert [r.get("ok") for r in results] == [True, None, True, None, True], results
    assert (results[1]["exc"], results[1]["minor"]) == ("IMP_LIMIT", MINOR_EVENT_TOO_LARGE), results[1]
    assert results[1]["completed"].endswith("COMPLETED_NO")
    assert (results[3]["exc"], results[3]["minor"]) == ("BAD_PARAM", MINOR_EVENT_TOO_DEEP), results[3]
    assert results[3]["completed"].endswith("COMPLETED_NO")

    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end and len(consumer.ids()) < 3:
        time.sleep(0.05)
    assert consumer.ids() == [0, 2, 4]
    channel.destroy()
