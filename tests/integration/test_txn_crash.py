"""``nsjms txn`` on an in-doubt transaction left by the real data path: a node routing channel → JMS in T2 is
SIGKILLed at the crash point ``t2.after_decision`` (COMMIT durable, nothing committed); with the node stopped the
operator lists it as JSON, sees the safe action, commits it with the CLI (PostgreSQL's branch committed, the outbox
re-sent with its dedupe ids), and the restarted node delivers the rest: every event exactly once at a Java JMS
consumer, no prepared transaction left."""

from __future__ import annotations

import collections
import json
import signal
import uuid

import pytest

from omniORB import CORBA

import CosNotification

from idl.generated import CosBridgeAdmin as BA
from idl.generated import NsjmsAdmin
from router.cli import main

from bridgekit import channel_ep, event_numbers, jms_ep, prepared_gids, reconnect_client
from conftest import Rig
from stdclients import Form, PushSupplierClient, Style, make_event, obtain_proxy_consumer, prop, short, wait_until

pytestmark = pytest.mark.integration
PERSISTENT = CosNotification.Persistent


def test_offline_commit_of_a_t2_killed_after_its_decision(rig: Rig, fresh_db: str, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    n, batch = 30, 10
    queue = f"txn.kill.{uuid.uuid4().hex[:8]}"
    channel, cid = rig.factory.create_channel([prop("EventReliability", short(PERSISTENT)),
                                               prop("ConnectionReliability", short(PERSISTENT))], [])
    bridge, _ = rig.bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, queue))
    managed = bridge._narrow(NsjmsAdmin.ManagedBridge)
    managed.enable_transaction(batch, 30)
    bridge.start_bridge()                            # its proxy on the channel exists from here on
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
    supplier = PushSupplierClient(proxy, Form.STRUCTURED)
    supplier.connect()
    bridge.stop_bridge()
    for i in range(n):                               # the bridge is stopped: the events wait in its proxy queue
        supplier.push_one(make_event(i, reliability=PERSISTENT))
    rig.server.stop()
    monkeypatch.setenv("NSJMS_CRASH_AT", "t2.after_decision")
    rig.server.start()
    reconnect_client(managed)
    try:
        bridge.start_bridge()                        # its first T2 kills the node after the decision
    except CORBA.Exception:
        pass
    assert rig.server.proc is not None and rig.server.proc.wait(60) == -signal.SIGKILL
    monkeypatch.delenv("NSJMS_CRASH_AT")
    assert len(prepared_gids(fresh_db)) == 1

    # the node is stopped (its endpoints.json is still there): nsjms txn works offline under the state lock
    monkeypatch.setenv("NSJMS_POSTGRES_DSN", fresh_db)
    monkeypatch.setenv("NSJMS_BROKER_URL", rig.server.broker_url)
    state = ["--state-dir", str(rig.server.state_dir)]
    capsys.readouterr()
    assert main(["txn", "list", "--json", *state]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["mode"] == "offline"
    [view] = listing["transactions"]
    assert (view["status"], view["decision"], view["action"]) == ("commit-logged", "commit", "commit")
    assert "COMMIT logged; prepared branches" in view["reason"]
    assert any(b["state"] == "prepared" for b in view["branches"])
    assert any(b["one_phase"] and b["state"] == "not-confirmed" for b in view["branches"])
    gtrid = view["gtrid"]

    assert main(["txn", "rollback", gtrid, "--yes", "--why", "wrong", *state]) == 4
    assert "the decision COMMIT is logged" in capsys.readouterr().err
    assert main(["txn", "commit", gtrid, "--yes", "--why", "runbook: finish the logged commit", *state]) == 0
    out = capsys.readouterr().out
    assert "resent" in out and gtrid in out
    assert prepared_gids(fresh_db) == []

    rig.server.restart()
    reconnect_client(managed)
    try:
        bridge.start_bridge()
    except BA.BridgeAlreadyStarted:
        pass
    got = rig.java.consume("queue", queue, n + batch, 20.0)
    ids = event_numbers(got)
    assert sorted(ids) == list(range(n)), f"lost {sorted(set(range(n)) - set(ids))}, duplicated " \
                                          f"{[i for i, c in collections.Counter(ids).items() if c > 1]}"
    first = [m for m in got if m["properties"]["nsjms_dedupe_id"]["value"].startswith(gtrid + "/")]
    assert len(first) == batch, "the T2 committed by the operator: its batch, each with its dedupe id"
    assert wait_until(lambda: prepared_gids(fresh_db) == [], 20)
