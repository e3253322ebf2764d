"""``nsjms txn`` on an in-doubt transaction left by the real data path: a node routing channel → JMS in T2 is
SIGKILLed at the crash point ``t2.after_decision`` (COMMIT durable, nothing committed); with the node stopped the
operator lists it as JSON, sees the safe action, commits it with the CLI (PostgreSQL's branch committed, the outbox
re-sent with its dedupe ids), and the restarted node delivers the rest: every event exactly once at a Java JMS
consumer, no prepared transaction left."""

from __future__ import annotations

import collections
import json
import signal
import threading
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest
import stomp

from omniORB import CORBA

import CosNotification

from idl.generated import CosBridgeAdmin as BA
from idl.generated import NsjmsAdmin
from router.cli import main
from router.routing.t2.ops import AUDIT_FILE

from bridgekit import channel_ep, event_numbers, jms_ep, prepared_gids, reconnect_client
from conftest import Rig, free_port
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


# ------------------------------------------------------------------------------ undecided: the heuristic commit
class StompCounter:
    """An independent stomp.py consumer of one queue: every message's ``$event_name`` and ``nsjms_dedupe_id``."""

    def __init__(self, broker_url: str, queue: str) -> None:
        parts = urlsplit(broker_url)
        self.got: list[tuple[int, str]] = []
        self._cond = threading.Condition()
        self.conn = stomp.Connection12([(parts.hostname, parts.port)], auto_content_length=False)
        counter = self

        class Listener(stomp.ConnectionListener):  # type: ignore[misc]
            def on_message(self, frame: Any) -> None:
                with counter._cond:
                    counter.got.append((int(frame.headers["$event_name"][1:]), frame.headers["nsjms_dedupe_id"]))
                    counter._cond.notify_all()

        self.conn.set_listener("count", Listener())
        self.conn.connect(wait=True)
        self.conn.subscribe(f"/queue/{queue}", id="1", ack="auto")

    def wait_for(self, numbers: set[int], timeout: float) -> list[tuple[int, str]]:
        with self._cond:
            self._cond.wait_for(lambda: numbers <= {n for n, _ in self.got}, timeout)
            return list(self.got)

    def close(self) -> None:
        self.conn.disconnect()


def test_heuristic_commit_of_an_undecided_t2_shows_its_events_and_resends_them(
        rig: Rig, fresh_db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31: the node dies after PREPARE, before its decision (crash point ``t2.after_prepare``): the prepared
    branch holds a batch of 10 events whose outbox rows nobody else can read. The listing shows the 10 events and
    their destination; a commit without --heuristic is refused with that count (exit 4, nothing done, logged);
    with --heuristic the branch commits and its outbox rows are re-sent; a rollback after it says so (exit 4).
    An independent stomp.py consumer counts every event: none lost, a duplicate only with its dedupe id."""
    n, batch = 30, 10
    queue = f"txn.undecided.{uuid.uuid4().hex[:8]}"
    channel, cid = rig.factory.create_channel([prop("EventReliability", short(PERSISTENT)),
                                               prop("ConnectionReliability", short(PERSISTENT))], [])
    bridge, bid = rig.bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, queue))
    managed = bridge._narrow(NsjmsAdmin.ManagedBridge)
    managed.enable_transaction(batch, 30)
    bridge.start_bridge()
    proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
    supplier = PushSupplierClient(proxy, Form.STRUCTURED)
    supplier.connect()
    bridge.stop_bridge()
    for i in range(n):
        supplier.push_one(make_event(i, reliability=PERSISTENT))
    rig.server.stop()
    monkeypatch.setenv("NSJMS_CRASH_AT", "t2.after_prepare")
    rig.server.start()
    reconnect_client(managed)
    try:
        bridge.start_bridge()                        # its first T2 kills the node after PREPARE, before deciding
    except CORBA.Exception:
        pass
    assert rig.server.proc is not None and rig.server.proc.wait(60) == -signal.SIGKILL
    monkeypatch.delenv("NSJMS_CRASH_AT")
    assert len(prepared_gids(fresh_db)) == 1

    monkeypatch.setenv("NSJMS_POSTGRES_DSN", fresh_db)
    monkeypatch.setenv("NSJMS_BROKER_URL", rig.server.broker_url)
    state = ["--state-dir", str(rig.server.state_dir)]
    capsys.readouterr()
    assert main(["txn", "list", "--json", *state]) == 0
    [view] = json.loads(capsys.readouterr().out)["transactions"]
    gtrid = view["gtrid"]
    assert (view["status"], view["decision"], view["action"]) == ("undecided", None, "rollback")
    assert (view["events"], view["events_known"]) == (batch, True), "the real count of the prepared branch"
    assert view["destinations"] == [f"/queue/{queue}"] and view["bridges"] == [bid]
    assert main(["txn", "list", *state]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(gtrid))
    assert f" {batch} " in line and f"it holds {batch} channel event(s) for /queue/{queue}" in line

    assert main(["txn", "commit", gtrid, "--yes", "--why", "need them", "--who", "ops", *state]) == 4
    err = capsys.readouterr().err
    assert "Add --heuristic" in err and f"commits {batch} event(s) to /queue/{queue}" in err
    assert len(prepared_gids(fresh_db)) == 1, "refused: nothing done"

    monkeypatch.setenv("NSJMS_BROKER_URL", f"stomp://127.0.0.1:{free_port()}")     # no broker there
    assert main(["txn", "commit", gtrid, "--heuristic", "--yes", "--why", "need them", *state]) == 4
    err = capsys.readouterr().err
    assert "nothing done" in err and f"re-sends {batch} message(s)" in err and "cannot be reached" in err
    assert len(prepared_gids(fresh_db)) == 1, "never a commit whose re-send cannot be done"
    monkeypatch.setenv("NSJMS_BROKER_URL", rig.server.broker_url)

    counter = StompCounter(rig.server.broker_url, queue)
    try:
        assert main(["txn", "commit", gtrid, "--heuristic", "--yes", "--why", "need them", "--who", "ops",
                     *state]) == 0
        out = capsys.readouterr().out
        assert f"resent {gtrid}/broker" in out and f"committed {batch} event(s) heuristically" in out
        assert prepared_gids(fresh_db) == []
        first = counter.wait_for(set(range(batch)), 30)
        assert sorted(first) == [(i, f"{gtrid}/{i}") for i in range(batch)], "the batch, each with its dedupe id"

        assert main(["txn", "rollback", gtrid, "--yes", "--why", "undo", *state]) == 4
        assert "committed heuristically by ops" in capsys.readouterr().err
        assert main(["txn", "list", "--json", *state]) == 0
        [after] = json.loads(capsys.readouterr().out)["transactions"]
        assert (after["status"], after["action"]) == ("heuristic-commit", "forget")
        entries = [json.loads(x) for x in (rig.server.state_dir / AUDIT_FILE).read_text().splitlines()]
        assert [e["action"] for e in entries] == ["commit", "heuristic-commit", "heuristic-commit", "rollback"]
        assert all(entries[i]["result"].startswith("refused:") for i in (0, 1, 3))
        assert entries[2]["result"]["resent"] == [f"{gtrid}/broker"] and entries[2]["result"]["events"] == batch

        rig.server.restart()                         # the rest of the queue goes out as usual
        reconnect_client(managed)
        try:
            bridge.start_bridge()
        except BA.BridgeAlreadyStarted:
            pass
        got = counter.wait_for(set(range(n)), 120)
    finally:
        counter.close()
    numbers = [i for i, _ in got]
    assert set(numbers) == set(range(n)), f"lost {sorted(set(range(n)) - set(numbers))}"
    for i, count in collections.Counter(numbers).items():
        if count > 1:
            assert len({d for j, d in got if j == i}) == 1, f"event {i} duplicated without its dedupe id"
    assert wait_until(lambda: prepared_gids(fresh_db) == [], 20)
