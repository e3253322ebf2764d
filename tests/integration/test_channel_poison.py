"""Poison events on the channel side: size limit at the door, bounded delivery attempts, dead letter, no stall.

A supplier process with a large ORB message limit pushes small events around a 3 MB one (below the channel's
8 MiB limit, so accepted) and a 9 MB one (above it: refused with ``IMP_LIMIT`` / ``MINOR_EVENT_TOO_LARGE``,
``COMPLETED_NO``). The consumer lives in the test process, whose ORB keeps omniORB's default 2 MB message limit,
so the 3 MB event can never be delivered to it (``MARSHAL``): the channel must try it a bounded number of times,
dead-letter it with a reason in the log and in the status, and deliver the events behind it in order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import CosNotification
import CosNotifyChannelAdmin

from idl.generated import CosNotifyChannelAdminAck, CosNotifyCommAck
from router.channel.boundary import MINOR_EVENT_TOO_LARGE

from stdclients import (
    Form,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    event_id,
    header_value,
    long_,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    prop,
    short,
    time_t,
)

pytestmark = pytest.mark.integration

S = Form.STRUCTURED
DEADLINE_S = 60.0
MB = 1_000_000

SUPPLIER = r"""
import json, sys
import omniORB
from omniORB import CORBA
import CosNotifyChannelAdmin
from stdclients import make_event

ior, sizes = sys.argv[1], json.loads(sys.argv[2])
orb = CORBA.ORB_init(["supplier", "-ORBgiopMaxMsgSize", str(64 * 1000 * 1000),
                      "-ORBclientCallTimeOutPeriod", "30000"], CORBA.ORB_ID)
proxy = orb.string_to_object(ior)._narrow(CosNotifyChannelAdmin.StructuredProxyPushConsumer)
proxy.connect_structured_push_supplier(None)
for i, size in enumerate(sizes):
    ev = make_event(i)
    if size:
        ev.remainder_of_body = CORBA.Any(CORBA.TC_string, "x" * size)
    try:
        proxy.push_structured_event(ev)
        print(json.dumps({"i": i, "ok": True}), flush=True)
    except CORBA.SystemException as exc:
        print(json.dumps({"i": i, "exc": type(exc).__name__, "minor": exc.minor,
                          "completed": str(exc.completed)}), flush=True)
orb.destroy()
"""


def wait_until(cond: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def push_from_process(ior: str, sizes: list[int]) -> list[dict[str, Any]]:
    here = str(Path(__file__).resolve().parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", SUPPLIER, ior, json.dumps(sizes)], capture_output=True, text=True,
                         env=env, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def proxy_status(server: Any, pid: int) -> dict[str, Any]:
    try:
        data = json.loads((server.state_dir / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    for channel in data.get("channels", []):
        for proxy in channel.get("proxy_suppliers", []):
            if proxy["id"] == pid:
                return dict(proxy)
    return {}


def test_poison_event_is_dead_lettered_and_the_events_behind_it_arrive(nsjms_server: Any, client_orb: Any) -> None:
    factory = client_orb.factory(nsjms_server.ior())
    channel, _ = factory.create_channel([], [])
    push_proxy, push_pid = obtain_proxy_supplier(channel.default_consumer_admin, S, Style.PUSH)
    consumer = StructuredPushConsumer()
    connect_push_consumer(push_proxy, S, consumer)
    supplier_proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, S, Style.PUSH)

    sizes = [0, 3 * MB, 0, 0, 0, 9 * MB, 0]
    results = push_from_process(client_orb.orb.object_to_string(supplier_proxy), sizes)

    assert [r["i"] for r in results] == list(range(len(sizes)))
    assert all(r.get("ok") for i, r in enumerate(results) if i != 5), results
    assert results[5]["exc"] == "IMP_LIMIT", results[5]
    assert results[5]["minor"] == MINOR_EVENT_TOO_LARGE
    assert results[5]["completed"].endswith("COMPLETED_NO")

    wait_until(lambda: sorted(consumer.ids()) == [0, 2, 3, 4, 6], "the events behind the poison one")
    assert consumer.ids() == [0, 2, 3, 4, 6]                       # in order, none twice, the poison one absent
    assert [event_id(ev) for ev in consumer.snapshot()] == [0, 2, 3, 4, 6]

    wait_until(lambda: proxy_status(nsjms_server, push_pid).get("dead_lettered") == 1, "the dead letter in status")
    reason = proxy_status(nsjms_server, push_pid)["last_dead_letter"]
    what, why = reason.split(": ", 1)
    assert what.startswith("seq=") and "(3000101 bytes)" in what
    # What the consumer's ORB did with a message above its limit: it closed the connection while the request was
    # being sent (the channel probed the consumer afterwards: it answered, so the failure is the event's).
    assert why.startswith(("COMM_FAILURE(omniORB.COMM_FAILURE_MarshalArguments", "MARSHAL(")), why
    log = nsjms_server.stderr_path.read_text(errors="replace")
    assert f"DEAD-LETTERED event {what}" in log


class AckingConsumer(StructuredPushConsumer):
    """Acknowledges every SequenceNumber it receives (NJI 4.2), from its own thread."""

    proxy: Any = None

    def push_structured_event(self, notification: Any) -> None:
        super().push_structured_event(notification)
        sn = header_value(notification, "SequenceNumber")
        threading.Thread(target=self.proxy.acknowledge, args=([sn],), daemon=True).start()


def test_poison_event_does_not_stop_an_acknowledged_connection(nsjms_server: Any, client_orb: Any) -> None:
    factory = client_orb.factory(nsjms_server.ior())
    qos = [prop("EventReliability", short(CosNotification.Persistent)),
           prop("ConnectionReliability", short(CosNotification.Persistent)),
           prop("DeliveryReliability", short(CosNotifyCommAck.Acknowledgment)),
           prop("Retries", long_(2)), prop("RetryInterval", time_t(0.3))]
    channel, _ = factory.create_channel(qos, [])
    proxy, push_pid = channel.default_consumer_admin.obtain_notification_push_supplier(
        CosNotifyChannelAdmin.STRUCTURED_EVENT)
    proxy = proxy._narrow(CosNotifyChannelAdminAck.StructuredProxyPushSupplierAck)
    consumer = AckingConsumer()
    consumer.proxy = proxy
    proxy.connect_structured_push_consumer(consumer._this())
    supplier_proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, S, Style.PUSH)

    results = push_from_process(client_orb.orb.object_to_string(supplier_proxy), [0, 3 * MB, 0, 0])
    assert all(r.get("ok") for r in results), results

    wait_until(lambda: sorted(consumer.ids()) == [0, 2, 3], "the events behind the poison one")
    assert consumer.ids() == [0, 2, 3]
    wait_until(lambda: proxy_status(nsjms_server, push_pid).get("dead_lettered") == 1, "the dead letter in status")
    assert "STOPPED" not in proxy_status(nsjms_server, push_pid), "Retries did not stop the connection"
