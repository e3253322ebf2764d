"""A node cut from PostgreSQL forwards to the owners it last read, or answers TRANSIENT, never OBJECT_NOT_EXIST
(docs/cluster.md, "A node cut from PostgreSQL forwards").

PostgreSQL runs in a network namespace with two veth links (clusterkit's ``two_links``): node ``na`` reaches it over
the first, node ``nc`` over the second. Both lease for 20 s. ``na`` owns persistent channel X with a standard-stub
push consumer connected; a push supplier is connected to a proxy consumer of X. The client pushes through a
reference to that proxy addressed to ``nc`` (a fresh object reference for each push, so each push asks ``nc``):
``nc`` forwards to ``na``. Then ``nc``'s link is cut (packets dropped). A push through ``nc`` is forwarded to
``na`` from the owner ``nc`` last read (its look-up cannot reach PostgreSQL), and the event reaches the consumer;
a proxy of channel Y, made on ``na`` after the cut (``nc`` never read its owner), answers ``TRANSIENT``, not
``OBJECT_NOT_EXIST``. Counted at the push consumer: every event pushed arrives exactly once. Needs root (network
namespaces): a machine without them fails the test, never a skip."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from omniORB import CORBA

import CosNotifyChannelAdmin

from router.cluster.ior import retarget

import clusterkit
from bridgekit import node_status, persistent_channel, structured_consumer
from clusterkit import (
    PERSISTENT,
    Links,
    numbers,
    start_node,
    two_links_fixture,  # noqa: F401 - the fixture "two_links", imported so pytest finds it
)
from conftest import ClientOrb
from stdclients import Form, PushSupplierClient, Style, make_event, obtain_proxy_consumer, wait_until

pytestmark = pytest.mark.integration

LEASE_S = 20           # the cut node forwards from what it last read for at most its lease expiry


def _via(client_orb: ClientOrb, ior: str, port: int) -> Any:
    """A fresh reference to the object of ``ior`` addressed to the node at 127.0.0.1:``port`` alone."""
    text = retarget(ior, ("127.0.0.1", port), [])
    ref = client_orb.orb.string_to_object(text)
    return ref._narrow(CosNotifyChannelAdmin.StructuredProxyPushConsumer)


def test_a_node_cut_from_postgres_forwards_to_the_owner_it_last_read_or_answers_transient(
        tmp_path: Path, two_links: Links, broker_url: str, client_orb: ClientOrb,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clusterkit, "EXPIRY_S", LEASE_S)
    na = start_node(tmp_path, "na", two_links.dsn, broker_url, monkeypatch)
    nc = start_node(tmp_path, "nc", two_links.dsn2, broker_url, monkeypatch)
    try:
        factory = client_orb.factory(na.ior())
        x, _ = persistent_channel(factory)
        consumer = structured_consumer(x)
        proxy, _ = obtain_proxy_consumer(x.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
        PushSupplierClient(proxy, Form.STRUCTURED).connect()
        ior = client_orb.orb.object_to_string(proxy)

        _via(client_orb, ior, nc.port).push_structured_event(make_event(0, reliability=PERSISTENT))
        assert wait_until(lambda: numbers(consumer.snapshot()) == [0], 30), "forwarded by nc to na, delivered"
        assert wait_until(lambda: node_status(nc).get("cluster", {}).get("forwarding", {}).get("forwarded", 0) >= 1,
                          30), "nc forwarded it"

        two_links.cut()
        cut_at = time.monotonic()
        time.sleep(1.5)        # past the 1 s owner cache (router/cluster/forward.py): nc must ask PostgreSQL
        pushed = [0]
        for i in (1, 2, 3):
            _via(client_orb, ior, nc.port).push_structured_event(make_event(i, reliability=PERSISTENT))
            pushed.append(i)
        forwarded_s = time.monotonic() - cut_at
        assert forwarded_s < LEASE_S, "within the cut node's lease (the test's premise)"
        assert wait_until(lambda: sorted(numbers(consumer.snapshot())) == pushed, 30), numbers(consumer.snapshot())

        y, _ = persistent_channel(factory)           # made after the cut: nc never read its owner
        y_proxy, _ = obtain_proxy_consumer(y.default_supplier_admin, Form.STRUCTURED, Style.PUSH)
        with pytest.raises(CORBA.TRANSIENT):
            _via(client_orb, client_orb.orb.object_to_string(y_proxy), nc.port)._non_existent()
        status = node_status(nc).get("cluster", {}).get("forwarding", {})
        print(f"\ncut from PostgreSQL: the pushes through nc forwarded to na {forwarded_s:.1f} s after the cut "
              f"(lease {LEASE_S} s); nc's forwarding {status}")
        assert sorted(numbers(consumer.snapshot())) == pushed, "every event exactly once"
    finally:
        two_links.restore()
        for node in (nc, na):
            node.stop()
