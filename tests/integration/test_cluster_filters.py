"""Three nodes: filters follow their channel, references from one node reach every node's objects
(docs/cluster.md, "CORBA addressing").

Three ``nsjms serve`` nodes on one PostgreSQL and one broker, each told the others' ORB addresses. Channel ``x`` is
created on ``nb``, channels ``y`` and ``z`` on ``nc`` (``z`` with a bridge); the client then works only with
references it obtained from ``na``:

1. **Cluster-wide listings**: ``na``'s ``get_all_channels`` lists ``x``, ``y`` and ``z`` (it runs none of them) and
   its ``get_all_bridges`` the bridge of ``nc``; ``get_event_channel`` gives ``na``'s references, forwarded to the
   owners.
2. **Filters belong to their channel**: a filter made after every node started, by ``y``'s
   ``default_filter_factory`` (through ``na``'s reference: made on ``nc``), is attached to the proxy of a
   standard-stub push consumer of ``y``. Its reference re-addressed to ``na`` or ``nb`` alone is forwarded to ``nc``
   (before: ``OBJECT_NOT_EXIST``, filters had no owner).
3. **Filters across a takeover**: ``nc`` is SIGKILLed; a survivor takes ``y`` over and loads its filters as
   PostgreSQL has them (before: only the filters that existed when the survivor started, so the proxy's filter
   could not answer and every later event was dropped). The client's filter reference and its push references to
   ``y`` (obtained from ``na``) keep working; events pushed after the death are filtered exactly as before it;
   omniORB's C++ example supplier pushes to ``y`` through ``corbaloc::na``. Channel ``x`` on ``nb`` is untouched.
4. **Filters across a hand-off**: the survivor is drained (``nsjms cluster drain``): ``y`` moves to the other
   live node, which loads the filter; a constraint added there is seen through the drained node (it retired its
   copy and forwards), and events are filtered as before.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from test_client_examples import cpp_examples  # noqa: F401 - the session fixture building examples/cpp
from test_cluster_forward import CPP_COUNT, _addresses, _cpp_supply, _received, _retrying, make

import CosNotification
import CosNotifyFilter

from idl.generated import CosBridgeAdmin as BA
from router.cluster.ior import retarget

from bridgekit import (
    bridge_factory,
    channel_ep,
    jms_ep,
    node_status,
    persistent_channel,
    structured_consumer,
    structured_supplier,
    unique_name,
)
from clusterkit import cli, start_nodes, stop_nodes
from conftest import ClientOrb
from stdclients import (
    TEST_DOMAIN,
    TEST_TYPE,
    Form,
    StructuredPushConsumer,
    Style,
    connect_push_consumer,
    obtain_proxy_supplier,
    wait_until,
)

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
KEPT = "$tag != 't3'"                  # the filter drops every 7th event (tag t3), keeps the C++ example's


def _passes(i: int) -> bool:
    return i % 7 != 3


def _exp(domain: str, type_name: str, expr: str) -> Any:
    return CosNotifyFilter.ConstraintExp([CosNotification.EventType(domain, type_name)], expr)


def _at(orb: Any, ref: Any, port: int) -> Any:
    """``ref`` re-addressed to the node at ``port`` alone (a reference that names a node not serving it)."""
    text = retarget(str(orb.object_to_string(ref)), (HOST, port), [])
    return orb.string_to_object(text)._narrow(CosNotifyFilter.Filter)


def _constraints(flt: Any) -> list[tuple[int, str]]:
    return sorted((int(c.constraint_id), str(c.constraint_expression.constraint_expr))
                  for c in flt.get_all_constraints())


def test_three_nodes_filters_follow_their_channel_and_references_from_one_node_reach_every_node(
        tmp_path: Path, fresh_db: str, broker_url: str, client_orb: ClientOrb,
        cpp_examples: dict[str, Path]) -> None:  # noqa: F811 - the fixture imported above
    orb = client_orb.orb
    a, b, c = start_nodes(tmp_path, ["na", "nb", "nc"], fresh_db, broker_url, peers=True)   # on HOST
    pa, pb, pc = a.port, b.port, c.port
    try:
        _, x = persistent_channel(client_orb.factory(b.ior()))                 # owned by nb
        _, y = persistent_channel(client_orb.factory(c.ior()))                 # owned by nc
        _, z = persistent_channel(client_orb.factory(c.ior()))
        _, bid = bridge_factory(client_orb, c).create_bridge(channel_ep(BA.SOURCE, z),
                                                             jms_ep(BA.SINK, unique_name("cluster.flt")))

        # 1. na lists the cluster's channels and bridges, and hands out references to them
        factory_a = client_orb.factory(a.ior())
        assert {x, y, z} <= set(factory_a.get_all_channels()), "na lists channels it does not run"
        assert not node_status(a).get("channels"), "na runs none of them"
        assert bid in bridge_factory(client_orb, a).get_all_bridges()
        chan_x, chan_y = factory_a.get_event_channel(x), factory_a.get_event_channel(y)
        assert _addresses(orb, chan_y)[0] == (HOST, pa), "na's own reference (forwarded to nc)"

        # 2. a filter of y's, made after every node started; a consumer of y filtered by it
        flt = chan_y.default_filter_factory.create_filter("EXTENDED_TCL")
        flt.add_constraints([_exp(TEST_DOMAIN, TEST_TYPE, KEPT), _exp("nsjms.example", "ExampleEvent", "TRUE")])
        want = _constraints(flt)
        assert _addresses(orb, flt)[0] == (HOST, pc), "made by nc, y's owner"
        for port in (pa, pb):                    # a reference naming a node that does not serve it: forwarded
            assert _constraints(_at(orb, flt, port)) == want
        proxy, _ = obtain_proxy_supplier(chan_y.default_consumer_admin, Form.STRUCTURED, Style.PUSH)
        proxy.add_filter(flt)
        consumer_y = StructuredPushConsumer()
        connect_push_consumer(proxy, Form.STRUCTURED, consumer_y)
        consumer_x = structured_consumer(chan_x)
        supplier_x, supplier_y = structured_supplier(chan_x), structured_supplier(chan_y)
        for i in range(14):
            supplier_y.push_one(make(i))
            supplier_x.push_one(make(i))
        before = sorted(i for i in range(14) if _passes(i))
        assert wait_until(lambda: sorted(_received(consumer_y)[0]) == before, 60), _received(consumer_y)
        assert consumer_x.wait_for(14, 60)

        # 3. nc dies; a survivor takes y (and its filter) over
        assert c.kill() != 0
        killed = time.monotonic()
        seen: list[str] = []
        for i in range(14, 28):
            _retrying(lambda i=i: supplier_y.push_one(make(i)), seen)         # the proxy reference nc made
            supplier_x.push_one(make(i))                                       # nb's channel: untouched
        took = time.monotonic() - killed
        assert _retrying(lambda: _constraints(flt), seen) == want, "the client's filter reference (nc's) works"
        assert flt.match_structured(make(3)) is False and flt.match_structured(make(4)) is True
        def runs_y() -> list[Any]:                           # (status.json is written every few seconds)
            return [n for n in (a, b) if y in [ch["id"] for ch in node_status(n).get("channels", [])]]

        assert wait_until(lambda: len(runs_y()) == 1, 30), "one survivor runs y"
        owner = runs_y()
        for port in (pa, pb):                    # served by the survivor, forwarded by the other node
            assert _retrying(lambda port=port: _constraints(_at(orb, flt, port)), seen) == want
        cpp = _cpp_supply(cpp_examples["supplier"], f"corbaloc::{HOST}:{pa}/NotifyEventChannelFactory", y, "via-na")
        assert cpp[0] == f"channel {y}" and len(cpp) == 1 + CPP_COUNT, cpp

        want_y = [i for i in range(28) if _passes(i)]
        want_cpp = [f"via-na #{i}" for i in range(CPP_COUNT)]

        def complete() -> bool:
            ours, got_cpp = _received(consumer_y)
            return set(ours) == set(want_y) and sorted(got_cpp) == want_cpp

        assert wait_until(complete, 90), _received(consumer_y)
        assert consumer_x.wait_for(28, 60)
        time.sleep(1)                                        # (an event the filter let through would come by now)
        ours, got_cpp = _received(consumer_y)
        print(f"\nnc killed: y's proxy reference from na accepted pushes again {took:.1f} s later; consumer of y: "
              f"{len(ours)} events (distinct {len(set(ours))}) of 28 pushed, {len(want_y)} pass the filter; C++ "
              f"{len(got_cpp)}; exceptions the client retried: {len(seen)} {seen}")
        assert not [i for i in ours if not _passes(i)], "the filter dropped the same events after the takeover"
        assert sorted(i for i in ours if i >= 14) == [i for i in want_y if i >= 14], \
            "each event pushed after the death that passes the filter exactly once"
        assert sorted(got_cpp) == want_cpp
        assert set(_received(consumer_x)[0]) == set(range(28)), "nb's channel lost nothing"

        # 4. the survivor is drained: y and its filter move to the other live node by hand-off
        survivor, other = (a, b) if owner[0] is a else (b, a)
        out = cli(fresh_db, survivor.state_dir, "drain", "na" if survivor is a else "nb")
        assert out.returncode == 0 and json.loads(out.stdout)["result"] == "clean", out.stdout + out.stderr[-2000:]
        assert wait_until(lambda: runs_y() == [other], 30), "y runs on the other live node"
        _at(orb, flt, other.port).add_constraints([_exp("nsjms.other", "Other", "TRUE")])   # at the new owner
        want = _constraints(_at(orb, flt, other.port))
        assert len(want) == 3
        assert _constraints(_at(orb, flt, survivor.port)) == want, \
            "the node that gave y away forwards its filter (it does not serve its own stale copy)"
        assert _retrying(lambda: _constraints(flt), seen) == want
        for i in range(28, 42):
            _retrying(lambda i=i: supplier_y.push_one(make(i)), seen)
        want_y = [i for i in range(42) if _passes(i)]
        assert wait_until(complete, 90), _received(consumer_y)
        ours = _received(consumer_y)[0]
        assert not [i for i in ours if not _passes(i)], "filtered the same after the hand-off"
        assert sorted(i for i in ours if i >= 28) == [i for i in want_y if i >= 28]
        assert not [s for s in seen if s.startswith("OBJECT_NOT_EXIST")], seen
    finally:
        stop_nodes([a, b, c])
