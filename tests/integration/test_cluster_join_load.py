"""A channel's load into a node is all or nothing (docs/cluster.md, "Loading is all or nothing"), on PostgreSQL with
the node's own channel factory and POA in this process (real CORBA objects over the test ORB).

* The cause of the partial load seen with ``cluster.rebalance_on_join``: a request for a proxy of a channel being
  loaded (a client's, or one the old owner forwarded) makes omniORB run the POA's servant activator for that id, and
  while it runs ``activate_object_with_id`` of the same id raised ``ObjectAlreadyActive``. Made deterministic: the
  activator's owner look-up is held until the load reached that id (a counted point: the activation's wait), then
  released; the load must succeed and the proxy answer.
* A load that fails at a counted point (the first read of the channel's queued events, after its admins and
  proxies were activated) is undone whole: nothing of the channel is active or registered, it stays ``arriving``
  (a client is told TRANSIENT, never OBJECT_NOT_EXIST), another channel of the same load runs; the next load
  loads it whole. Before, the channel stayed registered half-loaded and the next load loaded nothing more.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from omniORB import CORBA, PortableServer

import CosNotifyChannelAdmin

from router.channel.ackstatus import STATUS_KEY
from router.channel.channel import EventChannelFactoryImpl
from router.channel.runtime import FACTORY_KEY, Runtime, admin_oid, channel_oid, proxy_oid
from router.channel.store import Store
from router.channel.txdelivery import drain
from router.cluster import members as M
from router.cluster.forward import OwnerRow, owner_lookup
from router.cluster.release import stop_channel
from router.db import Database, StoreError

from clusterkit import join
from conftest import ClientOrb
from stdclients import Form, Style, obtain_proxy_consumer, wait_until

pytestmark = pytest.mark.integration

ME = "na"


@dataclass
class Node:
    rt: Runtime
    factory: EventChannelFactoryImpl
    db: Database


class _NoBridges:
    def __init__(self) -> None:
        self.bridges: dict[int, Any] = {}

    def forget(self, bid: int) -> None:
        """Nothing to forget."""


@pytest.fixture
def node(fresh_db: str, client_orb: ClientOrb) -> Iterator[Node]:
    """A node's channel factory on ``fresh_db`` in this process (member ``na``), its persistent POA on the test ORB,
    the forwarder configured as a node configures it."""
    db = Database(fresh_db, 4)
    db.open()
    join(db, ME)
    rt = Runtime(client_orb.orb, db, Store())
    factory = EventChannelFactoryImpl(rt)
    factory.activate()

    def runs(obj: tuple[str, int]) -> bool:
        return obj[0] == "channel" and obj[1] in factory.channels and obj[1] not in factory.arriving

    rt.forwarder.configure(ME, owner_lookup(db), runs)
    try:
        yield Node(rt, factory, db)
    finally:
        rt.shutting_down.set()
        for cid in list(factory.channels):
            stop_channel(factory, _NoBridges(), cid, (), 10, drain)
        for key in (FACTORY_KEY, STATUS_KEY):
            try:
                rt.ins_poa.deactivate_object(key.encode())
            except PortableServer.POA.ObjectNotActive:
                pass
        rt.poa.destroy(True, True)
        db.close()


def _channel_with_proxy(node: Node) -> tuple[int, int]:
    """A channel owned by ``na`` with a structured push proxy consumer on its default supplier admin."""
    channel, cid = node.factory.create_channel([], [])
    _, pid = obtain_proxy_consumer(channel.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
    with node.db.unit_of_work() as conn:
        M.assign(conn, ("channel", int(cid)), ME)
    return int(cid), int(pid)


def _hand_away(node: Node, cid: int) -> None:
    """The channel stops here as a hand-off stops it (its rows stay), so the node loads it again."""
    assert stop_channel(node.factory, _NoBridges(), cid, (), 10, drain) == []
    assert cid not in node.factory.channels


def _active(node: Node, oid: str) -> bool:
    try:
        node.rt.poa.id_to_servant(oid.encode())
    except PortableServer.POA.ObjectNotActive:
        return False
    return True


def _proxy_ref(node: Node, cid: int, pid: int) -> Any:
    ref = node.rt.poa.create_reference_with_id(proxy_oid(cid, "S", 0, pid).encode(),
                                               CosNotifyChannelAdmin.StructuredProxyPushConsumer._NP_RepositoryId)
    return node.rt.orb.string_to_object(node.rt.orb.object_to_string(ref))


def test_a_request_being_incarnated_does_not_make_the_load_of_its_channel_fail(node: Node) -> None:
    cid, pid = _channel_with_proxy(node)
    _hand_away(node, cid)
    looking, go = threading.Event(), threading.Event()
    lookup = owner_lookup(node.db)

    def held_lookup(obj: tuple[str, int]) -> OwnerRow | None:
        looking.set()
        assert go.wait(60)
        return lookup(obj)

    node.rt.forwarder.configure(ME, held_lookup, node.rt.forwarder._loaded)
    answers: list[str] = []

    def client() -> None:
        try:
            _proxy_ref(node, cid, pid)._non_existent()
            answers.append("served")
        except CORBA.SystemException as exc:
            answers.append(type(exc).__name__)

    asker = threading.Thread(target=client, name="client")
    asker.start()
    assert looking.wait(30), "the proxy's id is being incarnated (its owner looked up)"
    node.factory.arrive([cid])
    outcome: list[Any] = []
    loader = threading.Thread(target=lambda: outcome.append(_adopt(node, cid)), name="loader")
    loader.start()
    # the counted point: the load reached the proxy's id while its incarnation is held (or the load ended)
    assert wait_until(lambda: not loader.is_alive() or getattr(node.rt.forwarder, "activation_waits", 0) >= 1, 30)
    go.set()
    loader.join(60)
    asker.join(60)
    assert outcome == [[cid]], f"the load of channel {cid} succeeded: {outcome}"
    assert answers == ["TRANSIENT"], "the request that arrived during the load was told to retry"
    assert _active(node, proxy_oid(cid, "S", 0, pid)), "the proxy is active"
    assert _proxy_ref(node, cid, pid)._non_existent() is False, "and serves its next request"


def _adopt(node: Node, *cids: int) -> Any:
    try:
        return node.factory.adopt(set(cids))
    except Exception as exc:  # noqa: BLE001 - the test asserts on it
        return exc


def test_a_load_that_fails_half_way_is_undone_and_the_next_one_loads_it_whole(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    bad, pid = _channel_with_proxy(node)
    good, _ = _channel_with_proxy(node)
    _hand_away(node, bad)
    _hand_away(node, good)
    load_queued = node.rt.store.load_queued
    reads: list[int] = []

    def failing(conn: Any, cid: int) -> Any:            # the counted point: the bad channel's first queue read,
        reads.append(cid)                               # after its admins and proxies were activated
        if cid == bad and reads.count(bad) == 1:
            raise StoreError("injected: the database went away while the channel was being loaded")
        return load_queued(conn, cid)

    monkeypatch.setattr(node.rt.store, "load_queued", failing)
    node.factory.arrive([bad, good])
    failed = _adopt(node, bad, good)
    oids = [channel_oid(bad), f"ch/{bad}/ff", admin_oid(bad, "S", 0), admin_oid(bad, "C", 0),
            proxy_oid(bad, "S", 0, pid)]
    assert [o for o in oids if _active(node, o)] == [], "nothing of the failed channel stays active"
    assert bad not in node.factory.channels and bad in node.factory.arriving, "unregistered, still arriving"
    with pytest.raises(CORBA.TRANSIENT):                # a client is told to retry, never OBJECT_NOT_EXIST
        _proxy_ref(node, bad, pid)._non_existent()
    with pytest.raises(CORBA.TRANSIENT):
        node.factory.get_event_channel(bad)
    assert good in node.factory.channels and good not in node.factory.arriving, "the other channel runs"
    assert getattr(failed, "failed", None) == [bad] and getattr(failed, "loaded", None) == [good], repr(failed)

    assert _adopt(node, bad, good) == [bad], "the next load loads it whole"
    assert all(_active(node, o) for o in oids)
    assert bad not in node.factory.arriving
    assert _proxy_ref(node, bad, pid)._non_existent() is False
