"""Channel → JMS routing transactions (T2, NJI 2.7.2 / 2.7.3.1 / 2.7.5.1) on a real node: CORBA clients over IIOP,
PostgreSQL, ActiveMQ over STOMP, a Java JMS consumer over OpenWire.

The bridge's ``enable_transaction`` makes its channel proxy deliver each batch in a T2 (router.channel.txdelivery):
the queue rows are deleted in the PostgreSQL branch, one outbox row per message, the messages sent in one STOMP
transaction (the broker branch), committed after the durable decision. Every message carries its dedupe id
(``nsjms_dedupe_id`` = ``<gtrid>/<index>``).

Faults: the broker frozen (SIGSTOP) while a T2 waits for it, past its TransactionTimeout; a broker that refuses the
destination (rollback-only); ``disable_transaction`` during an active T2; a SIGKILL of the node at the crash points
``t2.after_decision`` and ``t2.after_broker_commit`` followed by a restart on the same state.
"""

from __future__ import annotations

import collections
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_bridge_poison import RefusingBroker

from omniORB import CORBA

import CosNotification

from idl.generated import BridgeTransactionMgmt as BTM
from idl.generated import CosBridgeAdmin as BA

from bridgekit import (
    JavaTool,
    bridge_factory,
    bridge_status,
    dedupe_ids,
    event_numbers,
    managed_bridge,
    prepared_count,
    reconnect_client,
    row_count,
    structured_supplier,
    t2_bridge,
    unique_name,
)
from conftest import NsjmsServer, Rig, running_rig
from stdclients import make_event, wait_until

pytestmark = pytest.mark.integration

PERSISTENT = CosNotification.Persistent
TIMEOUT_S = 60.0
#: the channel's own delivery id (router.routing.ledger.CHANNEL_DEDUPE_SQL), which a message sent outside a T2 carries
CHANNEL_ID = re.compile(r"e\d+/c\d+/a\d+/p\d+")


def _outbox(dsn: str) -> int:
    return row_count(dsn, "nsjms_outbox")


def _broker_pid(rig: Rig) -> int:
    return int(rig.broker.pid_file.read_text().strip())


# ------------------------------------------------------------------------------------------------ exactly once
def test_events_arrive_exactly_once_with_their_dedupe_ids(nsjms_server: NsjmsServer, client_orb: Any,
                                                         factory: Any, java_tool: JavaTool, fresh_db: str) -> None:
    bf = bridge_factory(client_orb, nsjms_server)
    queue = unique_name("t2.out")
    _bridge, bid, channel = t2_bridge(bf, factory, queue, 10, 30)
    supplier = structured_supplier(channel)
    for i in range(60):
        supplier.push_one(make_event(i, reliability=PERSISTENT))
    got = java_tool.consume("queue", queue, 60, TIMEOUT_S)
    assert event_numbers(got) == list(range(60)), "each event once, in order"
    dedupe = dedupe_ids(got)
    assert len(set(dedupe)) == 60, "one dedupe id per message"
    by_txn = collections.Counter(d.rsplit("/", 1)[0] for d in dedupe)
    assert all(n <= 10 for n in by_txn.values()), f"TransactionEvents = 10 caps a T2: {by_txn}"
    for gtrid, n in by_txn.items():
        assert sorted(int(d.rsplit("/", 1)[1]) for d in dedupe if d.startswith(gtrid + "/")) == list(range(n))
    assert wait_until(lambda: bridge_status(nsjms_server, bid).get("t2_committed", 0) == len(by_txn), 20), \
        bridge_status(nsjms_server, bid)
    assert bridge_status(nsjms_server, bid).get("forwarded") == 60
    assert wait_until(lambda: _outbox(fresh_db) == 0, 30), "the outbox rows of ended T2s are purged"
    assert prepared_count(fresh_db) == 0
    assert java_tool.consume("queue", queue, 1, 2.0) == [], "nothing more"


# ------------------------------------------------------------------------------------------------ timeout
def test_a_transaction_timeout_rolls_back_and_the_events_are_delivered_later(rig: Rig, fresh_db: str) -> None:
    queue = unique_name("t2.timeout")
    _bridge, bid, channel = t2_bridge(rig.bf, rig.factory, queue, 10, 2)
    supplier = structured_supplier(channel)
    assert wait_until(lambda: bridge_status(rig.server, bid).get("active") is True, 30)
    pid = _broker_pid(rig)
    os.kill(pid, signal.SIGSTOP)                 # the T2's STOMP frames wait for a frozen broker
    try:
        for i in range(3):
            supplier.push_one(make_event(i, reliability=PERSISTENT))
        assert wait_until(lambda: bridge_status(rig.server, bid).get("t2_overdue", 0) >= 1, 30), \
            bridge_status(rig.server, bid)
    finally:
        os.kill(pid, signal.SIGCONT)
    got = rig.java.consume("queue", queue, 3, TIMEOUT_S)
    assert sorted(event_numbers(got)) == [0, 1, 2] and len(got) == 3, "delivered later, each once"
    status = bridge_status(rig.server, bid)
    assert wait_until(lambda: "deadline" in (bridge_status(rig.server, bid).get("t2_last_rollback") or ""), 20), status
    assert prepared_count(fresh_db) == 0
    assert rig.java.consume("queue", queue, 1, 2.0) == [], "the rolled-back T2's messages never arrive"


# ------------------------------------------------------------------------------------------------ rollback-only
@pytest.fixture
def refusing(tmp_path: Path, fresh_db: str, client_orb: Any, java_tool: JavaTool) -> Iterator[Rig]:
    with running_rig(tmp_path, fresh_db, client_orb, java_tool, RefusingBroker) as rig:
        yield rig


def test_a_refused_send_rolls_back_and_nothing_is_lost(refusing: Rig, fresh_db: str) -> None:
    """The broker refuses every SEND to ``refused.*``: the bridge marks the T2 rollback-only (NJI 2.7.4), it rolls
    back, the events go one per T2, and each is dead-lettered by the bridge inside its own T2, with the reason."""
    _bridge, bid, channel = t2_bridge(refusing.bf, refusing.factory, "refused.t2", 10, 30)
    supplier = structured_supplier(channel)
    for i in range(3):
        supplier.push_one(make_event(i, reliability=PERSISTENT))
    dead = refusing.java.consume("queue", "nsjms.DLQ", 3, TIMEOUT_S, f"nsjms_dlq_bridge = '{bid}'")
    assert len(dead) == 3, f"{len(dead)} of 3 refused events dead-lettered"
    for m in dead:
        assert "not authorized" in m["properties"]["nsjms_dlq_reason"]["value"], m["properties"]
        assert "nsjms_dedupe_id" in m["properties"], "the dead letter is a message of a T2"
    assert wait_until(lambda: bridge_status(refusing.server, bid).get("t2_rolled_back", 0) >= 1, 20)
    assert "refused" in (bridge_status(refusing.server, bid).get("t2_last_rollback") or "")
    assert prepared_count(fresh_db) == 0


# ------------------------------------------------------------------------------------------------ disable
def test_disable_during_an_active_t2_raises_transaction_active_and_takes_effect_after(rig: Rig) -> None:
    queue = unique_name("t2.disable")
    bridge, bid, channel = t2_bridge(rig.bf, rig.factory, queue, 10, 0)
    managed = managed_bridge(bridge)
    supplier = structured_supplier(channel)
    assert wait_until(lambda: bridge_status(rig.server, bid).get("active") is True, 30)
    pid = _broker_pid(rig)
    os.kill(pid, signal.SIGSTOP)
    try:
        supplier.push_one(make_event(0, reliability=PERSISTENT))
        assert wait_until(lambda: bridge_status(rig.server, bid).get("t2_active", 0) == 1, 30), \
            bridge_status(rig.server, bid)
        with pytest.raises(BTM.TransactionActive):
            managed.disable_transaction()
    finally:
        os.kill(pid, signal.SIGCONT)
    got = rig.java.consume("queue", queue, 1, TIMEOUT_S)
    t2_id = got[0]["properties"]["nsjms_dedupe_id"]["value"]     # a T2's message id: <gtrid>/<index>
    assert event_numbers(got) == [0] and not CHANNEL_ID.match(t2_id), ("the active T2 finished", t2_id)
    assert wait_until(lambda: bridge_status(rig.server, bid).get("transaction_events") == 0, 20), \
        bridge_status(rig.server, bid)
    supplier.push_one(make_event(1, reliability=PERSISTENT))
    got = rig.java.consume("queue", queue, 1, TIMEOUT_S)
    plain_id = got[0]["properties"]["nsjms_dedupe_id"]["value"]  # without T2: the channel's delivery id (issue 31)
    assert event_numbers(got) == [1] and CHANNEL_ID.match(plain_id), ("no T2 after the disable", plain_id)
    managed.enable_transaction(5, 10)                     # enabled again
    with pytest.raises(BTM.TransactionAlreadyActive):
        managed.enable_transaction(5, 10)


# ------------------------------------------------------------------------------------------------ SIGKILL
@pytest.mark.parametrize("point", ["t2.after_decision", "t2.after_broker_commit"])
def test_sigkill_at_a_t2_crash_point_loses_nothing(rig: Rig, fresh_db: str, monkeypatch: pytest.MonkeyPatch,
                                                  point: str) -> None:
    """The node dies at ``point`` in its first T2; restarted on the same state, recovery finishes that T2 (the
    PostgreSQL branch committed, the outbox rows re-sent: same dedupe ids). 0 lost; duplicates only for
    ``t2.after_broker_commit`` (the broker had committed), each with its original's dedupe id."""
    n = 30
    queue = unique_name("t2.kill")
    bridge, _bid, channel = t2_bridge(rig.bf, rig.factory, queue, 10, 30)
    managed = managed_bridge(bridge)
    supplier = structured_supplier(channel)
    bridge.stop_bridge()                         # the events wait in the bridge's (suspended) proxy queue
    for i in range(n):
        supplier.push_one(make_event(i, reliability=PERSISTENT))
    rig.server.stop()
    monkeypatch.setenv("NSJMS_CRASH_AT", point)
    rig.server.start()
    reconnect_client(managed)
    try:
        bridge.start_bridge()                    # its first T2 kills the node at ``point``
    except CORBA.Exception:
        pass
    assert rig.server.proc is not None and rig.server.proc.wait(TIMEOUT_S) == -signal.SIGKILL, "died at the point"
    monkeypatch.delenv("NSJMS_CRASH_AT")
    rig.server.restart()
    reconnect_client(managed)
    try:
        bridge.start_bridge()                    # unless the node stored "started" before it died
    except BA.BridgeAlreadyStarted:
        pass
    got = rig.java.consume("queue", queue, n + 10, 20.0)
    ids = event_numbers(got)
    assert sorted(set(ids)) == list(range(n)), f"lost: {sorted(set(range(n)) - set(ids))}"
    dups = [i for i, c in collections.Counter(ids).items() if c > 1]
    if point == "t2.after_decision":
        assert dups == [], "the broker had not committed: recovery re-sent the outbox rows once"
    else:
        assert 1 <= len(dups) <= 10, "the broker-commit window: at most one T2 (TransactionEvents = 10)"
        for i in dups:
            copies = [m for m in got if event_numbers([m]) == [i]]
            assert len({m["properties"]["nsjms_dedupe_id"]["value"] for m in copies}) == 1, \
                "a duplicate carries its original's dedupe id"
    assert wait_until(lambda: prepared_count(fresh_db) == 0, 20), "no prepared transaction left"
    assert wait_until(lambda: _outbox(fresh_db) == 0, 30)
