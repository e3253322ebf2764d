"""router/cluster/forward.py and router/cluster/ior.py: where a request for an object that is not active on this node
goes, and the IORs a forward carries (the IORs below were made by omniORB 4.3 and checked with its ``catior``)."""

from __future__ import annotations

from typing import Any

import pytest

from omniORB import CORBA, PortableServer

from router.cluster.forward import (
    Forward,
    Forwarder,
    Gone,
    OwnerRow,
    Retry,
    cluster_addresses,
    decide,
    endpoint_publish,
    filter_channel,
    filter_id,
    object_of,
)
from router.cluster.ior import IorError, addresses, decode, encode, retarget

#: omniORBpy, -ORBendPoint giop:tcp:127.0.0.1:47001
#: -ORBendPointPublish giop:tcp:127.0.0.1:47001,giop:tcp:127.0.0.1:47002,
#: a PERSISTENT/USER_ID POA "nsjms", id "ch/1", type "IDL:x:1.0"
WITH_ALTERNATE = (
    "IOR:010000000a00000049444c3a783a312e30000000010000000000000078000000010102000a0000003132372e302e302e310099b70b"
    "000000ff6e736a6d730063682f31000300000000000000080000000100000000545441010000001c0000000100000001000100010000"
    "00010001050901010001000000090101000300000014000000010000000a0000003132372e302e302e31009ab7")
#: omniORBpy's string_to_object("corbaloc::127.0.0.1:47001,:127.0.0.1:47002/NotifyEventChannelFactory")
CORBALOC_TWO = (
    "IOR:010000000100000000000000020000000000000031000000010100000a0000003132372e302e302e310099b7190000004e6f7469"
    "66794576656e744368616e6e656c466163746f7279000000010000002400000001000000010000000300000014000000010000000a00"
    "00003132372e302e302e31009ab7")


def test_an_omniorb_reference_decodes_with_its_alternate_and_encodes_back_unchanged() -> None:
    ior = decode(WITH_ALTERNATE)
    assert ior.type_id == "IDL:x:1.0"
    assert addresses(ior) == [("127.0.0.1", 47001), ("127.0.0.1", 47002)]
    profile = ior.profiles[0]
    assert not isinstance(profile, tuple) and profile.key == b"\xffnsjms\x00ch/1" and (profile.major, profile.minor) \
        == (1, 2)
    assert encode(ior) == WITH_ALTERNATE                      # byte for byte (little-endian, as omniORB wrote it)


def test_a_two_address_corbaloc_is_a_profile_and_a_multiple_components_profile() -> None:
    assert addresses(decode(CORBALOC_TWO)) == [("127.0.0.1", 47001), ("127.0.0.1", 47002)]


def test_retarget_moves_the_primary_address_and_replaces_the_alternates_keeping_everything_else() -> None:
    moved = decode(retarget(WITH_ALTERNATE, ("10.0.0.9", 5555), [("127.0.0.1", 47001), ("10.0.0.9", 5555),
                                                                     ("h3", 7)]))
    assert addresses(moved) == [("10.0.0.9", 5555), ("127.0.0.1", 47001), ("h3", 7)]   # the primary not repeated
    before, after = decode(WITH_ALTERNATE).profiles[0], moved.profiles[0]
    assert not isinstance(before, tuple) and not isinstance(after, tuple)
    assert after.key == before.key and moved.type_id == "IDL:x:1.0"
    assert [c for c in after.components if c[0] != 3] == [c for c in before.components if c[0] != 3]  # code sets...
    alone = decode(retarget(WITH_ALTERNATE, ("10.0.0.9", 5555), []))
    assert addresses(alone) == [("10.0.0.9", 5555)]


def test_malformed_references_are_refused() -> None:
    for bad in ("corbaloc::h:1/x", "IOR:zz", "IOR:", "IOR:0100000005000000"):
        with pytest.raises(IorError):
            decode(bad)
    with pytest.raises(IorError, match=r"IIOP 1\.0"):
        retarget(CORBALOC_TWO, ("h", 1), [("g", 2)])


def test_object_ids_map_to_their_unit_of_ownership() -> None:
    assert object_of("ch/3") == ("channel", 3)
    assert object_of("ch/3/C/1/2") == ("channel", 3)
    assert object_of("br/7") == ("bridge", 7)
    assert object_of("br/7/recv") == ("bridge", 7)
    assert object_of("ch/2147483647") == ("channel", 2**31 - 1)
    # review: an id beyond PostgreSQL's integer made every such request a failed statement and a logged warning
    for other in ("flt/4", "flt/factory", "chx/3", "ch/", "ch/x", "", "ch/2147483648", "br/99999999999999",
                  f"flt/{2**31 - 1}", "flt/x", "flt/99999999999999999999"):
        assert object_of(other) is None
    # a channel's filter factory and the filters it made belong to the channel (forwarded to its owner)
    assert object_of("ch/3/ff") == ("channel", 3)
    for cid, n in ((0, 1), (3, 5), (3, 2**31 + 7), (2**31 - 1, 2**40)):
        fid = filter_id(cid, n)
        assert fid < 2**63 and filter_channel(fid) == cid and object_of(f"flt/{fid}") == ("channel", cid)
    assert filter_id(3, 5) != filter_id(4, 5) and filter_id(3, 5) != filter_id(3, 6)
    assert filter_channel(4) is None and filter_channel(2**31 - 1) is None       # the node-level factory's
    with pytest.raises(ValueError):
        filter_id(2**31, 1)


def test_the_decision() -> None:
    assert decide(None, "b", False) == Gone()                                       # nobody owns it
    assert decide(OwnerRow("b", "h:1", True), "b", True) == Gone()                  # runs here, id not active
    assert isinstance(decide(OwnerRow("b", "h:1", True), "b", False), Retry)         # owned here, loading
    assert decide(OwnerRow("a", "10.0.0.1:2809", True), "b", False) == Forward("a", ("10.0.0.1", 2809))
    assert decide(OwnerRow("a", "[::1]:2809", True), "b", False) == Forward("a", ("::1", 2809))
    assert isinstance(decide(OwnerRow("a", "10.0.0.1:2809", False), "b", False), Retry)   # dead, not taken over
    assert isinstance(decide(OwnerRow("a", "", True), "b", False), Retry)                 # no address published


def test_endpoint_publish_lists_this_node_first() -> None:
    assert endpoint_publish(["127.0.0.1:1"]) == []
    assert endpoint_publish(["127.0.0.1:1", "h2:2", "::1:3"]) == [
        "-ORBendPointPublish", "giop:tcp:127.0.0.1:1,giop:tcp:h2:2,giop:tcp:[::1]:3"]


class _Conn:
    def __init__(self, rows: list[tuple[str]]) -> None:
        self.rows = rows

    def execute(self, query: str, params: Any) -> Any:
        return self

    def fetchall(self) -> list[tuple[str]]:
        return self.rows


def test_cluster_addresses_are_own_then_peers_then_members_without_repeats() -> None:
    got = cluster_addresses(_Conn([("h2:2",), ("h3:3",), ("bad",)]), "me", "h1:1", ["h3:3", "h4:4"])
    assert got == ["h1:1", "h3:3", "h4:4", "h2:2"]


@pytest.fixture(scope="module")
def poa() -> Any:
    orb = CORBA.ORB_init(["test"], CORBA.ORB_ID)
    root = orb.resolve_initial_references("RootPOA")
    return orb, root.create_POA("forward-test", None, [
        root.create_lifespan_policy(PortableServer.PERSISTENT),
        root.create_id_assignment_policy(PortableServer.USER_ID),
        root.create_request_processing_policy(PortableServer.USE_SERVANT_MANAGER)])


def test_incarnate_forwards_retries_or_says_not_found(poa: Any) -> None:
    orb, adapter = poa
    rows: dict[tuple[str, int], OwnerRow | None] = {("channel", 1): OwnerRow("a", "10.0.0.1:2809", True),
                                                    ("channel", 2): OwnerRow("a", "10.0.0.1:2809", False),
                                                    ("channel", 3): None}
    calls: list[tuple[str, int]] = []

    def lookup(obj: tuple[str, int]) -> OwnerRow | None:
        calls.append(obj)
        if obj == ("bridge", 9):
            raise OSError("PostgreSQL unreachable")
        return rows[obj]

    fwd = Forwarder(orb)
    with pytest.raises(CORBA.OBJECT_NOT_EXIST):
        fwd.incarnate(b"ch/1", adapter)                      # not configured: a node outside a cluster
    fwd.configure("b", lookup, lambda obj: False)
    with pytest.raises(PortableServer.ForwardRequest) as forwarded:
        fwd.incarnate(b"ch/1/C/1/4", adapter)
    text = orb.object_to_string(forwarded.value.forward_reference)
    assert addresses(decode(text)) == [("10.0.0.1", 2809)], "the owner alone: no bouncing back to this node"
    prof = decode(text).profiles[0]
    assert not isinstance(prof, tuple) and prof.key.endswith(b"ch/1/C/1/4")
    with pytest.raises(CORBA.TRANSIENT):
        fwd.incarnate(b"ch/2", adapter)                      # owner dead, not taken over: retry
    with pytest.raises(CORBA.OBJECT_NOT_EXIST):
        fwd.incarnate(b"ch/3", adapter)
    with pytest.raises(CORBA.TRANSIENT):
        fwd.incarnate(b"br/9/recv", adapter)                 # the owner cannot be read: retry, never "not found"
    with pytest.raises(CORBA.OBJECT_NOT_EXIST):
        fwd.incarnate(b"flt/4", adapter)                     # a filter of the node-level factory: no owner
    with pytest.raises(PortableServer.ForwardRequest):
        fwd.incarnate(f"flt/{filter_id(1, 9)}".encode(), adapter)   # a filter of channel 1: to its owner
    assert (fwd.forwarded, fwd.retried) == (2, 2)
    n = len(calls)
    with pytest.raises(PortableServer.ForwardRequest):
        fwd.incarnate(b"ch/1", adapter)
    assert len(calls) == n, "the owner row is cached"
    fwd.invalidate()
    with pytest.raises(PortableServer.ForwardRequest):
        fwd.incarnate(b"ch/1", adapter)
    assert len(calls) == n + 1, "a takeover here drops the cache"


def test_an_owned_here_row_is_read_again_not_cached() -> None:
    reads = []

    def lookup(obj: tuple[str, int]) -> OwnerRow | None:
        reads.append(obj)
        return OwnerRow("b", "h:1", True) if len(reads) == 1 else None      # then the channel was destroyed

    fwd = Forwarder(None)
    fwd.configure("b", lookup, lambda obj: False)
    assert isinstance(fwd.where(("channel", 5)), Retry)
    assert fwd.where(("channel", 5)) == Gone(), "a destroyed channel of this node is not found, not 'retry'"


def test_the_owner_cache_stays_bounded_whatever_ids_are_asked_for() -> None:
    """Review: requests reach the forwarder before any authentication, and every distinct id asked for stayed in
    its cache: a client could grow the node's memory without limit."""
    from router.cluster import forward as F

    fw = F.Forwarder(orb=None)
    fw.configure("b", lambda obj: None, lambda obj: False)
    for i in range(3 * F._CACHE_MAX):
        fw.where(("channel", i))
    assert len(fw._cache) <= F._CACHE_MAX


def test_a_starting_node_tells_a_request_for_an_id_not_restored_yet_to_retry() -> None:
    """Regression (CI, test_channel_crash): a pull consumer of the previous incarnation asked for its proxy while the
    restarted node was restoring (the POA's servant manager was asked before it was configured) and got
    OBJECT_NOT_EXIST, which ended the client: its events stayed queued."""
    from router.cluster import forward as F

    fw = F.Forwarder(orb=None)
    assert isinstance(fw.where(("channel", 0)), F.Gone), "a runtime outside a node: as before"
    fw.starting = True
    assert isinstance(fw.where(("channel", 0)), F.Retry)
    fw.configure("a", lambda obj: None, lambda obj: False)
    assert isinstance(fw.where(("channel", 0)), F.Gone), "configured: the owner decides (nobody: gone)"


def test_a_listing_while_postgresql_is_away_is_this_node_s_own_not_transient() -> None:
    """The review's finding: get_all_channels/get_all_bridges answered TRANSIENT while PostgreSQL was away, and
    ``nsjms status`` (which asks get_all_channels first) then said the node was not running (exit 3) instead of
    degraded (exit 8); the console's lists failed too. Now the node's own list, the others' unknown (logged)."""
    from collections.abc import Iterator
    from contextlib import contextmanager

    from router.cluster.forward import cluster_ids
    from router.db import StoreUnavailable

    class Away:
        @contextmanager
        def statement(self, timeout: float | None = None) -> Iterator[Any]:
            raise StoreUnavailable("injected: PostgreSQL away")
            yield None  # pragma: no cover

    assert cluster_ids(Away(), "channel", [3, 1]) == [1, 3]
    assert cluster_ids(Away(), "bridge", []) == []
