"""Who may do what over IIOP (docs/security.md): the admin surfaces refuse an unauthenticated caller with
NO_PERMISSION (COMPLETED_NO), a reader may only read, an operator may act; standard NS suppliers and consumers work
without any credential. The test process switches the credential its ORB presents (``use_token``)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from omniORB import CORBA

import CosNotifyChannelAdmin

from idl.generated import CosBridgeAdmin as BA
from idl.generated import NsjmsAdmin
from router.security.auth import token_path, use_token

from bridgekit import bridge_factory, channel_ep, jms_ep, unique_name
from conftest import TEST_ADMIN_TOKEN, NsjmsServer
from stdclients import (
    Form,
    PushSupplierClient,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    make_event,
    obtain_proxy_consumer,
    obtain_proxy_supplier,
    persistent_qos,
)


@contextlib.contextmanager
def presenting(token: str) -> Iterator[None]:
    use_token(token)
    try:
        yield
    finally:
        use_token(TEST_ADMIN_TOKEN)


def refused(fn: Any) -> None:
    with pytest.raises(CORBA.NO_PERMISSION) as info:
        fn()
    assert info.value.completed == CORBA.COMPLETED_NO


def txn_admin(client_orb: Any, server: NsjmsServer) -> Any:
    assert server.endpoints is not None
    ref = client_orb.orb.string_to_object(server.endpoints["transaction_admin"]["corbaloc"])
    return ref._narrow(NsjmsAdmin.TransactionAdmin)


@pytest.fixture
def admin(nsjms_server: NsjmsServer, client_orb: Any, factory: Any) -> tuple[Any, Any, Any, int]:
    bf = bridge_factory(client_orb, nsjms_server)
    channel, cid = factory.create_channel(persistent_qos(), [])      # as the test operator
    return bf, channel, txn_admin(client_orb, nsjms_server), cid


@pytest.mark.parametrize("token", ["", "nsjms-tests:wrong-secret", "nobody:x"], ids=["none", "wrong", "unknown"])
def test_no_admin_operation_without_a_valid_credential(admin: Any, factory: Any, token: str) -> None:
    bf, channel, txn, cid = admin
    bridge, bid = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, unique_name("auth.q")))
    with presenting(token):
        refused(lambda: bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, unique_name("auth.q"))))
        refused(bf.get_all_bridges)
        refused(bridge.start_bridge)
        refused(bridge.destroy)
        refused(lambda: factory.create_channel([], []))
        refused(channel.destroy)
        refused(lambda: channel.set_admin([]))
        refused(lambda: channel.set_qos([]))
        refused(txn.list_json)
        refused(txn.recover)
        refused(lambda: txn.resolve("0" * 32, "commit", "alice@ops1", "forged"))
        refused(lambda: txn.resolve_xid("x", "commit", "alice@ops1", "forged"))
        refused(lambda: txn.forget("0" * 32, "alice@ops1"))
    assert bf.get_all_bridges() == [bid]              # nothing happened
    assert cid in factory.get_all_channels()


def test_standard_clients_need_no_credential(admin: Any, factory: Any) -> None:
    _, _, _, cid = admin
    with presenting(""):
        channel = factory.get_event_channel(cid)
        consumer = StructuredPushConsumer()
        consumer_admin = channel.new_for_consumers(CosNotifyChannelAdmin.AND_OP)[0]
        proxy, _ = obtain_proxy_supplier(consumer_admin, Form.STRUCTURED, Style.PUSH)
        connect_push_consumer(proxy, Form.STRUCTURED, consumer)
        supplier_admin = channel.new_for_suppliers(CosNotifyChannelAdmin.AND_OP)[0]
        supplier_proxy, _ = obtain_proxy_consumer(supplier_admin, Form.STRUCTURED, Style.PUSH)
        supplier = PushSupplierClient(supplier_proxy, Form.STRUCTURED)
        supplier.connect()
        supplier.push_all([make_event(i) for i in range(5)])
        assert consumer.wait_for(5, 30.0), f"received {consumer.count}"
        assert sorted(consumer.ids()) == list(range(5))


def test_reader_reads_and_operator_acts(admin: Any, nsjms_server: NsjmsServer) -> None:
    bf, channel, txn, cid = admin
    reader = token_path(nsjms_server.state_dir, "reader").read_text().strip()
    operator = token_path(nsjms_server.state_dir, "operator").read_text().strip()
    with presenting(reader):
        assert bf.get_all_bridges() == []
        assert "transactions" in json.loads(txn.list_json())
        refused(lambda: bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, unique_name("auth.q"))))
        refused(txn.recover)
        refused(channel.destroy)
    with presenting(operator):
        bridge, _ = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, unique_name("auth.q")))
        bridge.destroy()
        assert bf.get_all_bridges() == []
        channel.destroy()


def test_operator_log_names_the_authenticated_principal(admin: Any, nsjms_server: NsjmsServer) -> None:
    """The ``who`` a caller sends is ignored: a refusal for an unknown transaction still comes back, and the node's
    log of the attempt names the principal (the operator log itself: tests/unit/test_auth.py)."""
    _, _, txn, _ = admin
    with pytest.raises(NsjmsAdmin.TransactionRefused):
        txn.forget("f" * 32, "alice@ops1")
    txn.recover()                                     # review finding: recover was logged with who=""
    entries = [json.loads(line) for line in (nsjms_server.state_dir / "txn-operator.log").read_text().splitlines()]
    assert [(e["action"], e["who"]) for e in entries if e["action"] in ("forget", "recover")] == [
        ("forget", "nsjms-tests"), ("recover", "nsjms-tests")], entries


def test_cli_without_a_readable_credential_is_refused_cleanly(nsjms_server: NsjmsServer) -> None:
    """The CLI presents STATE/credentials/operator.token; without it the node refuses, and the CLI says so (exit 4,
    no traceback)."""
    import subprocess
    import sys

    token = token_path(nsjms_server.state_dir, "operator")
    ok = subprocess.run([sys.executable, "-m", "router.cli", "bridge", "list", "--state-dir",
                         str(nsjms_server.state_dir)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    token.rename(token.with_suffix(".away"))
    refused_run = subprocess.run([sys.executable, "-m", "router.cli", "bridge", "list", "--state-dir",
                                  str(nsjms_server.state_dir)], capture_output=True, text=True, timeout=120)
    assert refused_run.returncode == 4, refused_run.stdout + refused_run.stderr
    assert "refused: not authorised" in refused_run.stderr and "Traceback" not in refused_run.stderr


def test_orphan_commit_is_refused_anonymously_and_logged_as_the_principal(admin: Any,
                                                                          nsjms_server: NsjmsServer) -> None:
    """Issue 30's case: an orphaned prepared PostgreSQL branch. Anonymous: NO_PERMISSION and the branch stays
    prepared; authenticated: committed, and the operator log names the principal, not the ``who`` sent."""
    import subprocess
    import sys

    from psycopg import Xid

    from xa.xid import FORMAT_ID

    from bridgekit import prepare_foreign, prepared_gids

    _, _, txn, _ = admin
    dsn = nsjms_server.pg_dsn
    first = prepare_foreign(dsn, Xid.from_parts(FORMAT_ID, "hand-made-1", "outbox"))
    second = prepare_foreign(dsn, Xid.from_parts(FORMAT_ID, "hand-made-2", "outbox"))
    with presenting(""):
        refused(lambda: txn.resolve_xid(first, "commit", "alice@ops1", "forged"))
    assert first in prepared_gids(dsn)
    txn.resolve_xid(first, "commit", "alice@ops1", "test: commit the orphan")
    assert first not in prepared_gids(dsn)
    run = subprocess.run([sys.executable, "-m", "router.cli", "txn", "rollback", "--xid", second, "--yes", "--why",
                          "test", "--who", "alice@ops1", "--state-dir", str(nsjms_server.state_dir)],
                         capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "NSJMS_POSTGRES_DSN": dsn})
    assert run.returncode == 0, run.stdout + run.stderr
    assert second not in prepared_gids(dsn)
    entries = [json.loads(x) for x in (nsjms_server.state_dir / "txn-operator.log").read_text().splitlines()]
    assert [(e["who"], e["target"]) for e in entries] == [("nsjms-tests", first), ("operator", second)]


def test_a_bridges_endpoints_refuse_a_remote_caller_without_a_credential(admin: Any, client_orb: Any,
                                                                          nsjms_server: NsjmsServer) -> None:
    """Review finding (issue 30): a bridge's endpoint servants have guessable object keys (``br/<id>/send``); an
    anonymous local user pulled a JMS -> channel bridge's messages through them (which the channel then
    acknowledged: lost) or pushed into a channel -> JMS bridge's destination without broker credentials. Remote
    callers now need an operator; the node's own channel (colocated calls) still moves events through them."""
    import CosNotifyComm

    bf, _, _, cid = admin
    _, to_jms = bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, unique_name("auth.out")))
    _, from_jms = bf.create_bridge(jms_ep(BA.SOURCE, unique_name("auth.in")), channel_ep(BA.SINK, cid, BA.PULL))

    def endpoint(bid: int, side: str, iface: Any) -> Any:
        key = f"%ffnsjms%00br/{bid}/{side}"
        return client_orb.orb.string_to_object(f"corbaloc::127.0.0.1:{nsjms_server.port}/{key}")._narrow(iface)

    sender = endpoint(from_jms, "send", CosNotifyComm.StructuredPullSupplier)
    receiver = endpoint(to_jms, "recv", CosNotifyComm.StructuredPushConsumer)
    with presenting(""):
        refused(sender.try_pull_structured_event)
        refused(sender.disconnect_structured_pull_supplier)
        refused(lambda: receiver.push_structured_event(make_event(1)))
        refused(receiver.disconnect_structured_push_consumer)
    status, _ = sender.try_pull_structured_event()   # the operator may (nothing is waiting: no bridge started)
    assert status is not None


def test_a_bridges_channel_side_proxy_is_guarded_and_other_clients_proxies_are_not(admin: Any,
                                                                                    factory: Any) -> None:
    """Review finding (issue 30): an anonymous local user could destroy or re-configure a bridge's channel-side
    proxy (ids are small integers) and so drop the events it holds. Remote callers now need an operator for the
    admins and proxies that belong to a bridge; a standard client's own proxies stay open (NS has no auth)."""
    bf, _, _, cid = admin
    bf.create_bridge(channel_ep(BA.SOURCE, cid), jms_ep(BA.SINK, unique_name("auth.guarded")))
    with presenting(""):
        anon_channel = factory.get_event_channel(cid)
        bridge_proxies = [(a, a.get_proxy_supplier(p)) for a in map(anon_channel.get_consumeradmin,
                                                                    anon_channel.get_all_consumeradmins())
                          for p in a._get_push_suppliers()]
        assert len(bridge_proxies) == 1, "the fresh channel's only proxy supplier is the bridge's"
        bridge_admin, proxy = bridge_proxies[0]
        proxy = proxy._narrow(CosNotifyChannelAdmin.StructuredProxyPushSupplier)
        refused(lambda: proxy.set_qos([]))
        refused(proxy.suspend_connection)
        refused(proxy.remove_all_filters)
        refused(proxy.disconnect_structured_push_supplier)
        refused(lambda: bridge_admin.set_qos([]))
        # a standard client's own admin and proxy: no credential needed
        own_admin = anon_channel.new_for_consumers(CosNotifyChannelAdmin.AND_OP)[0]
        own_proxy, _ = obtain_proxy_supplier(own_admin, Form.STRUCTURED, Style.PUSH)
        own_proxy.set_qos([])
        own_admin.destroy()
    proxy.set_qos([])                                 # the operator may
