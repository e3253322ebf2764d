"""CORBA clients need not know which node owns what (docs/cluster.md, "CORBA addressing").

Two ``nsjms serve`` nodes on one PostgreSQL and one broker, each told the other's ORB address (``cluster.peers``).
Node ``na`` owns a persistent channel with a standard-stub structured push consumer connected on it.

1. **Forward**: a client asks node ``nb`` for that channel (``get_event_channel``); ``nb`` hands out its own
   reference, and the requests on it are answered ``LOCATION_FORWARD`` to ``na`` (omniORB's servant activator
   raising ``ForwardRequest``): the Python client and omniORB's C++ example supplier push through it and every
   event arrives at the consumer connected on ``na``.
2. **Every node's address in every reference** (checked with omniORB's ``catior``): ``na``'s references carry
   ``nb``'s address as ``TAG_ALTERNATE_IIOP_ADDRESS``.
3. **References from a dead node keep working**: ``na`` is SIGKILLed; the client's references obtained from ``na``
   (the factory, the channel, a proxy push consumer) and the one forwarded through ``nb`` are used again at once:
   omniORB tries the alternate address (``nb``), which answers ``TRANSIENT`` (retry; never ``OBJECT_NOT_EXIST``) until
   it took the channel over, then serves it. A ``corbaloc`` with two addresses whose first node is the dead one
   works, from Python and from the C++ example. Counted at the consumer (called back by ``nb`` after the
   takeover): every event pushed, none lost.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from test_client_examples import cpp_examples  # noqa: F401 - the session fixture building examples/cpp

from omniORB import CORBA

import CosNotification

from idl.generated import CosBridgeAdmin as BA

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
from clusterkit import EXPIRY_S, RENEW_S, start_node
from conftest import ClientOrb, free_port
from stdclients import Form, PullConsumerClient, Style, event_id, make_event, obtain_proxy_supplier, wait_until

pytestmark = pytest.mark.integration

CPP_COUNT = 5
T = TypeVar("T")


def _addresses(orb: Any, ref: Any) -> list[tuple[str, int]]:
    """The IIOP addresses of a reference as omniORB's own ``catior`` prints them: the profile's, then its
    alternates (independent of the project's IOR code)."""
    catior = Path(sys.executable).with_name("catior")
    out = subprocess.run([str(catior), str(orb.object_to_string(ref))], capture_output=True, text=True, timeout=60,
                         check=True, stdin=subprocess.DEVNULL).stdout
    found = [(h, int(p)) for h, p in re.findall(r"IIOP 1\.\d (\S+) (\d+) ", out)]
    return found + [(h, int(p)) for h, p in re.findall(r"TAG_ALTERNATE_IIOP_ADDRESS (\S+) (\d+)", out)]


def _retrying(call: Callable[[], T], seen: list[str], timeout: float = 90.0) -> T:
    """``call`` until it succeeds: a client's answer to TRANSIENT (retry) while the owner is dead; every
    exception is recorded in ``seen``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except (CORBA.TRANSIENT, CORBA.COMM_FAILURE, CORBA.OBJECT_NOT_EXIST) as exc:
            seen.append(f"{type(exc).__name__}({_minor(exc)}, {_COMPLETION[exc.completed]})")
            if isinstance(exc, CORBA.OBJECT_NOT_EXIST) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def make(i: int) -> Any:
    return make_event(i, reliability=CosNotification.Persistent)


_COMPLETION = {CORBA.COMPLETED_YES: "YES", CORBA.COMPLETED_NO: "NO", CORBA.COMPLETED_MAYBE: "MAYBE"}


def _minor(exc: Any) -> str:
    import omniORB.minorCodes as codes

    names = [n for n in dir(codes) if n.startswith(type(exc).__name__ + "_") and getattr(codes, n) == exc.minor]
    return names[0] if names else hex(exc.minor)


def _cpp_supply(binary: Path, factory: str, cid: int, text: str) -> list[str]:
    """omniORB's C++ example supplier (examples/cpp/supplier.cc) pushing CPP_COUNT events to channel ``cid``."""
    done = subprocess.run([str(binary), "--factory", factory, "--channel", str(cid), "--count", str(CPP_COUNT),
                           "--text", text], capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"C++ supplier exited {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout.splitlines()


def _received(consumer: Any) -> tuple[list[int], list[str]]:
    """The test events' numbers and the C++ events' ``text #seq`` bodies the consumer got."""
    ours, cpp = [], []
    for ev in consumer.snapshot():
        if ev.header.fixed_header.event_name.startswith("example-"):
            cpp.append(str(ev.remainder_of_body.value()))
        else:
            ours.append(event_id(ev))
    return ours, cpp


def test_any_node_answers_for_any_object_and_references_outlive_their_node(
        tmp_path: Path, fresh_db: str, broker_url: str, client_orb: ClientOrb, monkeypatch: pytest.MonkeyPatch,
        cpp_examples: dict[str, Path]) -> None:  # noqa: F811 - the fixture imported above
    orb = client_orb.orb
    pa, pb = free_port(), free_port()
    a = start_node(tmp_path, "na", fresh_db, broker_url, monkeypatch, port=pa, peers=f"127.0.0.1:{pb}")
    b = start_node(tmp_path, "nb", fresh_db, broker_url, monkeypatch, port=pb, peers=f"127.0.0.1:{pa}")
    try:
        factory_a = client_orb.factory(a.ior())
        assert _addresses(orb, factory_a) == [("127.0.0.1", pa), ("127.0.0.1", pb)], \
            "na's references carry nb's address as an alternate"
        channel_a, cid = persistent_channel(factory_a)
        consumer = structured_consumer(channel_a)            # connected on na, the channel's owner
        supplier_a = structured_supplier(channel_a)          # a proxy push consumer obtained from na
        assert _addresses(orb, supplier_a.proxy)[0] == ("127.0.0.1", pa)
        puller = PullConsumerClient(obtain_proxy_supplier(channel_a.default_consumer_admin, Form.STRUCTURED,
                                                          Style.PULL)[0], Form.STRUCTURED)
        puller.connect()                                     # a pull consumer of na's
        _, cbr = persistent_channel(factory_a)               # a bridge of na's (not started)
        _, bid = bridge_factory(client_orb, a).create_bridge(channel_ep(BA.SOURCE, cbr),
                                                             jms_ep(BA.SINK, unique_name("cluster.fwd")))

        # 1. nb answers for na's channel: its reference is forwarded to na
        factory_b = client_orb.factory(b.ior())
        assert cid in factory_b.get_all_channels(), "nb lists the cluster's channels, also those it does not run"
        channel_b = factory_b.get_event_channel(cid)
        assert _addresses(orb, channel_b)[0] == ("127.0.0.1", pb), "nb hands out its own reference"
        supplier_b = structured_supplier(channel_b)          # its calls are LOCATION_FORWARDed to na
        assert _addresses(orb, supplier_b.proxy)[0] == ("127.0.0.1", pa), "the proxy was made by na, the owner"
        for i in range(0, 10):
            supplier_b.push_one(make(i))
        for i in range(10, 20):
            supplier_a.push_one(make(i))
        cpp_first = _cpp_supply(cpp_examples["supplier"], f"corbaloc::127.0.0.1:{pb}/NotifyEventChannelFactory",
                                cid, "via-nb")
        assert cpp_first[0] == f"channel {cid}" and len(cpp_first) == 1 + CPP_COUNT, cpp_first
        assert consumer.wait_for(20 + CPP_COUNT, 60), _received(consumer)
        assert sorted(_received(consumer)[0]) == list(range(20)), "every event pushed through nb reached na"
        assert a.proc is not None and not [x for x in node_status(b).get("channels", []) if x["id"] == cid]
        bridge_b = bridge_factory(client_orb, b).get_bridge_with_id(bid)      # nb answers for na's bridge too
        assert _addresses(orb, bridge_b)[0] == ("127.0.0.1", pb)
        assert bridge_b.end_point_receiver.connector.channel_id == cbr        # (forwarded to na)
        assert wait_until(lambda: node_status(b).get("cluster", {}).get("forwarding", {}).get("forwarded", 0) > 0,
                          10), node_status(b).get("cluster")   # nb said LOCATION_FORWARD (status.json)
        pulled = [event_id(ev) for ev in puller.drain(20 + CPP_COUNT, 60)
                  if not ev.header.fixed_header.event_name.startswith("example-")]
        assert sorted(pulled) == list(range(20)), pulled

        # 3. na dies; the references obtained from it keep working through nb
        assert a.kill() != 0
        killed = time.monotonic()
        seen: list[str] = []
        for i in range(20, 30):                              # the proxy from na: alternate address nb
            _retrying(lambda i=i: supplier_a.push_one(make(i)), seen)
        took = time.monotonic() - killed
        for i in range(30, 40):                              # the reference nb handed out (forwarded to na before)
            _retrying(lambda i=i: supplier_b.push_one(make(i)), seen)
        again = _retrying(lambda: factory_a.get_event_channel(cid), seen)    # the factory reference from na
        supplier_again = structured_supplier(again)
        for i in range(40, 45):
            supplier_again.push_one(make(i))
        two = f"corbaloc::127.0.0.1:{pa},:127.0.0.1:{pb}/NotifyEventChannelFactory"   # its first node is down
        via_two = client_orb.factory(two).get_event_channel(cid)
        supplier_two = structured_supplier(via_two)
        for i in range(45, 50):
            supplier_two.push_one(make(i))
        cpp_second = _cpp_supply(cpp_examples["supplier"], two, cid, "two-addresses")
        assert _retrying(lambda: bridge_b.end_point_receiver, seen).connector.channel_id == cbr
        after: list[int] = []                                # the pull consumer's proxy, from na: served by nb
        deadline = time.monotonic() + 60
        while not set(range(20, 50)) <= set(after) and time.monotonic() < deadline:
            after.extend(event_id(ev) for ev in _retrying(puller.try_pull, seen)
                         if not ev.header.fixed_header.event_name.startswith("example-"))
        assert len(cpp_second) == 1 + CPP_COUNT, cpp_second
        assert not [x for x in seen if x.startswith("OBJECT_NOT_EXIST")], \
            f"a channel being taken over is never said not to exist: {seen}"
        print(f"\nna killed: the proxy reference from na accepted pushes again {took:.1f} s later (lease expiry "
              f"{EXPIRY_S} s, renewal {RENEW_S} s); exceptions the client retried: {len(seen)} "
              f"{seen}")
        assert wait_until(lambda: [(t["node_id"], t["channels"], t["bridges"]) for t in
                                   node_status(b).get("cluster", {}).get("takeovers", [])]
                          == [("na", sorted([cid, cbr]), [bid])], 10), node_status(b).get("cluster")

        want_cpp = [f"via-nb #{i}" for i in range(CPP_COUNT)] + [f"two-addresses #{i}" for i in range(CPP_COUNT)]
        assert consumer.wait_for(50 + 2 * CPP_COUNT, 90), _received(consumer)

        def complete() -> bool:
            ours, cpp = _received(consumer)
            return set(ours) == set(range(50)) and set(cpp) == set(want_cpp)

        assert wait_until(complete, 30), _received(consumer)
        ours, cpp = _received(consumer)
        print(f"consumer: {len(ours)} events for 50 pushed (distinct {len(set(ours))}), C++ {len(cpp)} for "
              f"{2 * CPP_COUNT}")
        assert set(ours) == set(range(50)) and set(cpp) == set(want_cpp), "none lost"
        assert sorted(i for i in ours if i >= 20) == list(range(20, 50)), \
            "each event pushed after the death exactly once (the survivor stored and delivered it)"
        assert sorted(x for x in cpp if x.startswith("two-")) == want_cpp[CPP_COUNT:]
        # events na had delivered may come again from nb: na's delivered-events journals are on its disk
        assert set(pulled + after) == set(range(50)), "the pull consumer lost nothing either"
        time.sleep(1)                                        # (a duplicate would come within the dispatch time)
        after.extend(event_id(ev) for ev in puller.try_pull()
                     if not ev.header.fixed_header.event_name.startswith("example-"))
        assert sorted(i for i in after if i >= 20) == list(range(20, 50)), sorted(after)
        print(f"pull consumer: {len(pulled)} pulled before the death, {len(after)} after")
    finally:
        a.stop()
        b.stop()

