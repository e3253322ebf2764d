"""PostgreSQL down under a running node: suppliers get a prompt, retryable TRANSIENT and nothing unstored is accepted.

The node runs on its own PostgreSQL cluster (so stopping it disturbs no other test). Persistent events are pushed
before, during and after an outage; a pull proxy supplier nobody pulls from holds them. During the outage every
push must fail with ``TRANSIENT`` / ``COMPLETED_NO`` (minor ``MINOR_STORE_UNAVAILABLE``) — not ``UNKNOWN``, and not
a client-side ``TIMEOUT`` after a long block. After the database is back pushes succeed again, and after a restart
of the node the queue holds exactly the events whose push returned normally.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from omniORB import CORBA

import CosNotification

from router.channel.boundary import MINOR_STORE_UNAVAILABLE
from router.node.services import EmbeddedPostgres

from conftest import NsjmsServer, free_port
from stdclients import (
    Form,
    PullConsumerClient,
    PushSupplierClient,
    Style,
    event_id,
    make_event,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    prop,
    short,
)

pytestmark = pytest.mark.integration

S = Form.STRUCTURED
PERSISTENT = CosNotification.Persistent
DEADLINE_S = 90.0


def wait_until(cond: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_database_down_gives_transient_and_accepts_only_stored_events(
        tmp_path: Path, own_pg: EmbeddedPostgres, broker_url: str, client_orb: Any) -> None:
    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=own_pg.dsn, broker_url=broker_url, port=free_port())
    server.start()
    try:
        factory = client_orb.factory(server.ior())
        qos = [prop("EventReliability", short(PERSISTENT)), prop("ConnectionReliability", short(PERSISTENT))]
        channel, _ = factory.create_channel(qos, [])
        pull_proxy, _ = obtain_proxy_supplier(channel.default_consumer_admin, S, Style.PULL)
        puller = PullConsumerClient(pull_proxy, S)
        puller.connect()                                   # holds every event; nobody pulls before the end
        supplier_proxy, _ = obtain_proxy_consumer(channel.default_supplier_admin, S, Style.PUSH)
        supplier = PushSupplierClient(supplier_proxy, S)
        supplier.connect()

        accepted: list[int] = []
        for i in range(5):
            supplier.push_one(make_event(i, reliability=PERSISTENT))
            accepted.append(i)

        own_pg.stop()
        refused: list[CORBA.SystemException] = []
        for i in range(5, 8):
            with pytest.raises(CORBA.TRANSIENT) as info:
                supplier.push_one(make_event(i, reliability=PERSISTENT))
            refused.append(info.value)
        supplier.push_one(make_event(100, reliability=CosNotification.BestEffort))   # needs no database: accepted
        with pytest.raises(CORBA.TRANSIENT) as info:    # any operation that needs the store, not only pushes
            channel.default_supplier_admin.obtain_notification_push_consumer(S.client_type)
        refused.append(info.value)
        for exc in refused:
            assert exc.completed == CORBA.COMPLETED_NO
            assert exc.minor == MINOR_STORE_UNAVAILABLE

        own_pg.start()
        next_id = 8

        def push_after_recovery() -> bool:
            # The pool reconnects in the background: until then the answer is still TRANSIENT (retryable).
            try:
                supplier.push_one(make_event(next_id, reliability=PERSISTENT))
            except CORBA.TRANSIENT as exc:
                assert exc.completed == CORBA.COMPLETED_NO
                return False
            return True

        wait_until(push_after_recovery, "a push to succeed after the database came back")
        accepted.append(next_id)
        for i in range(9, 12):
            supplier.push_one(make_event(i, reliability=PERSISTENT))
            accepted.append(i)

        server.stop()
        server.restart()
        got: list[int] = []

        def pulled_all() -> bool:
            try:
                got.extend(event_id(ev) for ev in puller.try_pull())
            except (CORBA.TRANSIENT, CORBA.COMM_FAILURE):
                pass                                       # the restarted server's endpoint is coming up
            return len(got) >= len(accepted)

        wait_until(pulled_all, "every accepted event after the restart")
        got.extend(event_id(ev) for ev in puller.try_pull())
        # Exactly the accepted persistent events, each once (the BestEffort one lived in memory only, NS 2.5.5.1).
        assert sorted(got) == accepted, "the queue must hold exactly the accepted persistent events, each once"
    finally:
        server.stop()


def test_a_disconnect_refused_during_an_outage_is_finished_by_the_retry(
        tmp_path: Path, own_pg: EmbeddedPostgres, broker_url: str, client_orb: Any) -> None:
    """A disconnect while PostgreSQL is down answers TRANSIENT; retried after the outage it removes the proxy for
    good, so the restarted node does not restore it (it used to: the retry answered OK without deleting the row)."""
    state = tmp_path / "state"
    state.mkdir()
    server = NsjmsServer(state_dir=state, pg_dsn=own_pg.dsn, broker_url=broker_url, port=free_port())
    server.start()
    try:
        factory = client_orb.factory(server.ior())
        qos = [prop("EventReliability", short(PERSISTENT)), prop("ConnectionReliability", short(PERSISTENT))]
        channel, cid = factory.create_channel(qos, [])
        admin = channel.default_consumer_admin
        pull_proxy, pid = obtain_proxy_supplier(admin, S, Style.PULL)
        PullConsumerClient(pull_proxy, S).connect()

        own_pg.stop()
        with pytest.raises(CORBA.TRANSIENT) as info:
            pull_proxy.disconnect_structured_pull_supplier()
        assert info.value.completed == CORBA.COMPLETED_NO
        own_pg.start()

        def disconnected() -> bool:
            try:
                pull_proxy.disconnect_structured_pull_supplier()
            except CORBA.TRANSIENT:
                return False                               # the pool is reconnecting
            return True

        wait_until(disconnected, "the retried disconnect to succeed after the database came back")
        assert pid not in admin.pull_suppliers

        server.stop()
        server.restart()

        def restored_ids() -> list[int] | None:
            try:
                return list(client_orb.factory(server.ior()).get_event_channel(cid).default_consumer_admin
                            .pull_suppliers)
            except (CORBA.TRANSIENT, CORBA.COMM_FAILURE):
                return None                                # the restarted server's endpoint is coming up

        answers: list[list[int]] = []

        def answered() -> bool:
            ids = restored_ids()
            if ids is not None:
                answers.append(ids)
            return ids is not None

        wait_until(answered, "the restarted node to answer")
        assert pid not in answers[0], "the disconnected proxy came back after the restart"
    finally:
        server.stop()
