"""Node-scoped xids: format, foreign detection, branch qualifiers, dedupe ids."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg import Xid

from xa.errors import ForeignXid, UsageError
from xa.xid import FORMAT_ID, NodeId, branch_xid, dedupe_id, is_ours, new_gtrid, parse_gtrid, require_ours

NODE = NodeId("node-1")
nodes = st.from_regex(r"[A-Za-z0-9_-]{1,32}", fullmatch=True)


def test_gtrid_shape_and_uniqueness() -> None:
    ids = {new_gtrid(NODE) for _ in range(1000)}
    assert len(ids) == 1000
    for gtrid in ids:
        parsed = parse_gtrid(gtrid)
        assert parsed is not None and parsed.node == "node-1" and str(parsed) == gtrid


@given(nodes)
def test_longest_node_fits_the_xa_limits(node: str) -> None:
    xid = branch_xid(new_gtrid(NodeId(node)), "b" * 64)
    assert len(xid.gtrid) <= 64
    again = Xid.from_string(str(xid))  # what tpc_recover() will parse back
    assert (again.format_id, again.gtrid, again.bqual) == (FORMAT_ID, xid.gtrid, xid.bqual)
    assert is_ours(again, NodeId(node))


def test_foreign_xids_are_recognised() -> None:
    ours = branch_xid(new_gtrid(NODE), "outbox")
    assert is_ours(ours, NODE)
    assert require_ours(ours, NODE) is ours
    other_node = branch_xid(new_gtrid(NodeId("node-2")), "outbox")
    other_format = Xid.from_parts(42, ours.gtrid, "outbox")
    unparsed = Xid.from_string("some-app-gid")
    not_nsjms = Xid.from_parts(FORMAT_ID, "random-gtrid", "x")
    for xid in (other_node, other_format, unparsed, not_nsjms):
        assert not is_ours(xid, NODE)
        with pytest.raises(ForeignXid):
            require_ours(xid, NODE)


def test_node_prefix_is_not_enough() -> None:
    """node-1 must not claim node-10's xids."""
    assert not is_ours(branch_xid(new_gtrid(NodeId("node-10")), "b"), NODE)


@pytest.mark.parametrize("bad", ["", "a" * 33, "a:b", "a b", "é"])
def test_bad_node_ids(bad: str) -> None:
    with pytest.raises(UsageError):
        NodeId(bad)


@pytest.mark.parametrize("bad", ["", "a" * 65, "a b", "a/b"])
def test_bad_branch_names(bad: str) -> None:
    with pytest.raises(UsageError):
        branch_xid(new_gtrid(NODE), bad)


def test_dedupe_ids_are_deterministic_and_distinct() -> None:
    g1, g2 = new_gtrid(NODE), new_gtrid(NODE)
    assert dedupe_id(g1, 3) == dedupe_id(g1, 3) == f"{g1}/3"
    ids = {dedupe_id(g, i) for g in (g1, g2) for i in range(100)}
    assert len(ids) == 200
    with pytest.raises(UsageError):
        dedupe_id(g1, -1)
    with pytest.raises(UsageError):
        dedupe_id("not-a-gtrid", 0)


def test_gtrid_from_injected_sources() -> None:
    gtrid = new_gtrid(NODE, wall_ms=lambda: 0x0123456789AB, random_bytes=lambda n: b"\xff" * n)
    assert gtrid == "node-1:0123456789abffffffffffff"
