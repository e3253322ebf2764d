"""Run as a second, unprivileged local user (tests/integration/test_second_user.py): what can she do to a node with
nothing but the well-known port and stubs from the repository's IDL? Prints one JSON document."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import omniORB  # noqa: F401
from omniORB import CORBA

import CosNotification
import CosNotifyChannelAdmin
import CosNotifyComm__POA

from idl.generated import CosBridgeAdmin as BA
from idl.generated import NsjmsAdmin


def readable(paths: list[str]) -> dict[str, str]:
    out = {}
    for p in paths:
        try:
            path = Path(p)
            if path.is_dir():
                list(path.iterdir())
            else:
                path.read_bytes()
            out[p] = "read"
        except PermissionError:
            out[p] = "denied"
        except FileNotFoundError:
            out[p] = "missing"
    return out


def attempt(fn: Any) -> str:
    try:
        fn()
        return "done"
    except CORBA.NO_PERMISSION as exc:
        return "NO_PERMISSION" + ("" if exc.completed == CORBA.COMPLETED_NO else "?")
    except Exception as exc:  # noqa: BLE001 — reported
        return type(exc).__name__


class Consumer(CosNotifyComm__POA.StructuredPushConsumer):
    def __init__(self) -> None:
        self.got: list[str] = []
        self.cond = threading.Condition()

    def push_structured_event(self, ev: Any) -> None:
        with self.cond:
            self.got.append(ev.header.fixed_header.event_name)
            self.cond.notify_all()

    def disconnect_structured_push_consumer(self) -> None:
        pass

    def offer_change(self, added: Any, removed: Any) -> None:
        pass


class Supplier(CosNotifyComm__POA.StructuredPushSupplier):
    def disconnect_structured_push_supplier(self) -> None:
        pass

    def subscription_change(self, added: Any, removed: Any) -> None:
        pass


def event(i: int) -> Any:
    fixed = CosNotification.FixedEventHeader(CosNotification.EventType("Test", "Probe"), f"e{i}")
    return CosNotification.StructuredEvent(CosNotification.EventHeader(fixed, []), [],
                                           CORBA.Any(CORBA.TC_string, f"payload {i}"))


def main() -> int:
    port, cid, state = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    orb = CORBA.ORB_init(["probe", "-ORBendPoint", "giop:tcp:127.0.0.1:", "-ORBclientCallTimeOutPeriod", "20000"],
                         CORBA.ORB_ID)
    poa = orb.resolve_initial_references("RootPOA")
    poa._get_the_POAManager().activate()
    base = f"corbaloc::127.0.0.1:{port}"
    factory = orb.string_to_object(f"{base}/NotifyEventChannelFactory")._narrow(
        CosNotifyChannelAdmin.EventChannelFactory)
    bf = orb.string_to_object(f"{base}/BridgeFactory")._narrow(BA.BridgeFactory)
    txn = orb.string_to_object(f"{base}/TransactionAdmin")._narrow(NsjmsAdmin.TransactionAdmin)
    result: dict[str, Any] = {"files": readable([state, f"{state}/endpoints.json", f"{state}/credentials",
                                                 f"{state}/credentials/operator.token",
                                                 f"{state}/credentials/principals.json"]
                                                + sys.argv[4:])}
    src = BA.ExternalEndpoint(BA.SOURCE, BA.ExternalEndpointConnector(BA.STRUCTURED_EVENT, cid), BA.PUSH,
                              BA.STRUCTURED_EVENT)
    dest = BA.JMSDestination(BA.QUEUE, "payroll.private", "")
    snk = BA.ExternalEndpoint(BA.SINK, BA.ExternalEndpointConnector(destination=dest), BA.PUSH, BA.JMS_MESSAGE)
    result["create_bridge"] = attempt(lambda: bf.create_bridge(src, snk))
    result["list_bridges"] = attempt(bf.get_all_bridges)
    result["create_channel"] = attempt(lambda: factory.create_channel([], []))
    channel = factory.get_event_channel(cid)
    result["set_admin"] = attempt(lambda: channel.set_admin(
        [CosNotification.Property("MaxQueueLength", CORBA.Any(CORBA.TC_long, 1))]))
    result["destroy_channel"] = attempt(channel.destroy)
    result["txn_list"] = attempt(txn.list_json)
    result["txn_commit"] = attempt(lambda: txn.resolve("0" * 32, "commit", "alice@ops1", "forged"))
    result["txn_rollback"] = attempt(lambda: txn.resolve("0" * 32, "rollback", "alice@ops1", "forged"))
    result["txn_commit_xid"] = attempt(lambda: txn.resolve_xid("orphan", "commit", "alice@ops1", "forged"))
    result["txn_forget"] = attempt(lambda: txn.forget("0" * 32, "alice@ops1"))
    # a standard supplier and consumer of the same user still move events
    consumer = Consumer()
    cref = consumer._this()
    proxy, _ = channel.default_consumer_admin.obtain_notification_push_supplier(
        CosNotifyChannelAdmin.STRUCTURED_EVENT)
    proxy = proxy._narrow(CosNotifyChannelAdmin.StructuredProxyPushSupplier)
    proxy.connect_structured_push_consumer(cref)
    pc, _ = channel.default_supplier_admin.obtain_notification_push_consumer(CosNotifyChannelAdmin.STRUCTURED_EVENT)
    pc = pc._narrow(CosNotifyChannelAdmin.StructuredProxyPushConsumer)
    pc.connect_structured_push_supplier(Supplier()._this())
    for i in range(5):
        pc.push_structured_event(event(i))
    deadline = time.monotonic() + 60
    with consumer.cond:
        while len(consumer.got) < 5 and time.monotonic() < deadline:
            consumer.cond.wait(0.5)
    result["received"] = sorted(consumer.got)
    proxy.disconnect_structured_push_supplier()
    pc.disconnect_structured_push_consumer()
    print(json.dumps(result))
    orb.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
