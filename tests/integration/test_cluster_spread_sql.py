"""A dead node's work spread over the survivors, in PostgreSQL (router/cluster/spread.py, migration 0012) on a real
database: the fence's transaction assigns each channel with its bridges to the least loaded live member (never a
draining one), the other survivors' shares wait ``claimed`` until the recovery ran, nothing is ever unowned or owned
twice, and a survivor that dies with a claimed share is taken over like any member. The nodes' part (loading their
shares) is tested with real nodes in test_cluster_takeover.py."""

from __future__ import annotations

import pytest

from router.cluster import NotExpired
from router.cluster import handoff as H
from router.cluster.ownership import Owned
from router.cluster.report import cluster_report
from router.cluster.spread import claim_spread, release_recovered
from router.db import Database

from clusterkit import db_fixture, join, sql_channel, sql_owners  # noqa: F401 - db_fixture: the fixture "db"

pytestmark = pytest.mark.integration


_channel, _owners = sql_channel, sql_owners


def _expire(db: Database, node: str) -> None:
    with db.unit_of_work() as conn:
        conn.execute("UPDATE nsjms_member SET lease_until = clock_timestamp() - interval '1 second' "
                     "WHERE node_id = %s", (node,))


def _handoffs(db: Database) -> list[tuple[int, str, str, str, str]]:
    with db.unit_of_work() as conn:
        return [(int(c), str(f), str(t), str(r), str(s)) for c, f, t, r, s in conn.execute(
            "SELECT channel_id, from_node, to_node, reason, state FROM nsjms_handoff ORDER BY id").fetchall()]


def test_a_dead_nodes_channels_are_spread_over_the_survivors_least_loaded_first(db: Database) -> None:
    """n1 dies owning four channels (one with two bridges); n2 fences it. Heaviest first, each to the least loaded
    survivor at its turn: before, all of them went to n2. n3's shares wait ``claimed`` (n3 does not load them) until
    the recovery of n1 ran; then they are ``released`` to n3, which loads them with the hand-off's start path."""
    _, e2, _ = join(db, "n1"), join(db, "n2"), join(db, "n3")
    _channel(db, 1, "n1", bridges=2)
    for cid in (2, 3, 4):
        _channel(db, cid, "n1")
    _channel(db, 9, "n2")                                    # n2 starts one object ahead
    _expire(db, "n1")
    with db.unit_of_work() as conn:
        spread = claim_spread(conn, "n1", "n2", e2)
    assert spread.epoch == 2
    # channel 1 (weight 3) to n3 (0 < 1); then 2 -> n2 (1 < 3), 3 -> n2 (2 < 3), 4 -> n2 or n3 (3 = 3: by id, n2)
    assert spread.mine == Owned((2, 3, 4), ())
    assert spread.others == {"n3": Owned((1,), (100, 101))}
    owners = _owners(db)
    assert {k: v for k, v in owners.items() if v == "n3"} == \
        {("channel", 1): "n3", ("bridge", 100): "n3", ("bridge", 101): "n3"}, "a channel moves with its bridges"
    assert "n1" not in owners.values(), "nothing left to the dead node"
    assert _handoffs(db) == [(1, "n1", "n3", "takeover", "claimed")]
    with db.unit_of_work() as conn:
        assert H.released_to(conn, "n3") == [], "claimed: not loaded before the dead node's recovery"
        assert [h["state"] for h in cluster_report(conn)["handoffs"]] == ["claimed"], "the status lists it"
        assert release_recovered(conn, ["n1"]) == [(1, "n3")]
        (row,) = H.released_to(conn, "n3")
    assert (row.channel_id, row.bridges, row.reason) == (1, (100, 101), "takeover")


def test_the_spread_skips_draining_members_and_falls_back_to_the_fencer(db: Database) -> None:
    _, e2, _ = join(db, "n1"), join(db, "n2"), join(db, "n3")
    _channel(db, 1, "n1")
    _channel(db, 2, "n1")
    with db.unit_of_work() as conn:
        conn.execute("INSERT INTO nsjms_drain (node_id, epoch) VALUES ('n3', 1)")
    _expire(db, "n1")
    with db.unit_of_work() as conn:
        spread = claim_spread(conn, "n1", "n2", e2)
    assert spread.mine == Owned((1, 2), ()) and spread.others == {}, "a draining member gets nothing"
    # the fencer itself draining and alone: the work still needs a live owner, the fencer's
    _channel(db, 3, "n3")
    with db.unit_of_work() as conn:
        conn.execute("INSERT INTO nsjms_drain (node_id, epoch) VALUES ('n2', %s)", (e2,))
    _expire(db, "n3")
    with db.unit_of_work() as conn:
        spread = claim_spread(conn, "n3", "n2", e2)
    assert spread.mine == Owned((3,), ())


def test_a_second_takeover_claims_nothing_and_a_live_node_is_not_taken_over(db: Database) -> None:
    e1, e2, e3 = join(db, "n1"), join(db, "n2"), join(db, "n3")
    _channel(db, 1, "n1")
    with pytest.raises(NotExpired), db.unit_of_work() as conn:
        claim_spread(conn, "n1", "n2", e2)                   # a sticky assignment: a live lease moves nothing
    assert _owners(db)[("channel", 1)] == "n1"
    _expire(db, "n1")
    with db.unit_of_work() as conn:
        first = claim_spread(conn, "n1", "n2", e2)
    with db.unit_of_work() as conn:
        second = claim_spread(conn, "n1", "n3", e3)          # it found n1 fenced already
    assert first and not second
    assert e1 == 1


def test_a_survivor_that_dies_holding_a_claimed_share_is_taken_over_with_it(db: Database) -> None:
    """n2 fenced n1 and gave channel 1 to n3 (claimed); n3 dies before loading it. The takeover of n3 claims
    channel 1 too and fails the claimed row: the channel is never left to a dead node, nor loaded twice."""
    _, e2, _ = join(db, "n1"), join(db, "n2"), join(db, "n3")
    _channel(db, 1, "n1")
    _channel(db, 2, "n1")
    _expire(db, "n1")
    with db.unit_of_work() as conn:
        spread = claim_spread(conn, "n1", "n2", e2)
    assert spread.others == {"n3": Owned((2,), ())} and spread.mine == Owned((1,), ())
    _expire(db, "n3")
    with db.unit_of_work() as conn:
        again = claim_spread(conn, "n3", "n2", e2)
        assert release_recovered(conn, ["n1", "n3"]) == [], "the failed share is not released"
    assert again.mine == Owned((2,), ())
    assert _handoffs(db) == [(2, "n1", "n3", "takeover", "failed")]
    assert set(_owners(db).values()) == {"n2"}


def test_a_dead_nodes_open_moves_end_before_its_channels_are_shared_out(db: Database) -> None:
    """The review's finding: n1 had asked to move its channels (a drain: rows ``requested``) and died before
    releasing them. The spread recorded a survivor's share (``claimed``) while the channel's ``requested`` row was
    still open, the unique index of open moves refused it, the fence's transaction rolled back, and every later pass
    failed the same way: the channels stayed owned by the dead node. Now its open moves end first."""
    _, e2, _, _ = join(db, "n1"), join(db, "n2"), join(db, "n3"), join(db, "n4")
    for cid in (1, 2, 3):
        _channel(db, cid, "n1")
    with db.unit_of_work() as conn:
        for cid in (1, 2, 3):
            conn.execute("INSERT INTO nsjms_handoff (channel_id, from_node, from_epoch, to_node, reason, state, "
                         "bridges) VALUES (%s, 'n1', 1, 'n2', 'drain', 'requested', '{}')", (cid,))
    _expire(db, "n1")
    with db.unit_of_work() as conn:
        spread = claim_spread(conn, "n1", "n2", e2)
    assert spread.mine == Owned((1,), ()) and spread.others == {"n3": Owned((2,), ()), "n4": Owned((3,), ())}
    assert "n1" not in _owners(db).values()
    assert sorted(h for h in _handoffs(db) if h[4] != "failed") == \
        [(2, "n1", "n3", "takeover", "claimed"), (3, "n1", "n4", "takeover", "claimed")]
    assert [h[4] for h in _handoffs(db)[:3]] == ["failed"] * 3, "the dead node's drain ended"


def test_a_claimed_share_of_a_node_that_rejoined_is_released_by_any_node(db: Database) -> None:
    """The fencer died before it released the shares, and the dead node restarted meanwhile (it recovers its own
    transactions): the share is released at the next pass of any node (``release_recovered`` with no member)."""
    _, e2, _ = join(db, "n1"), join(db, "n2"), join(db, "n3")
    _channel(db, 1, "n1")
    _channel(db, 2, "n1")
    _expire(db, "n1")
    with db.unit_of_work() as conn:
        claim_spread(conn, "n1", "n2", e2)
        assert release_recovered(conn, []) == [], "still fenced: only its recovery releases it"
    assert join(db, "n1") == 3                                # rejoins (epoch 2 was the fence's)
    with db.unit_of_work() as conn:
        assert release_recovered(conn, []) == [(2, "n3")]


def test_an_open_claimed_share_blocks_other_moves_of_its_channel(db: Database) -> None:
    """At most one open move per channel, a claimed one included (the index of migration 0012): a rebalance does
    not request a move of a channel whose takeover share is not loaded yet."""
    _, e2, _ = join(db, "n1"), join(db, "n2"), join(db, "n3")
    for cid in (1, 2, 3, 4):
        _channel(db, cid, "n1")
    _expire(db, "n1")
    with db.unit_of_work() as conn:
        spread = claim_spread(conn, "n1", "n2", e2)
    claimed = set(spread.others["n3"].channels)
    with db.unit_of_work() as conn:
        for cid in claimed:
            assert H._insert(conn, cid, "n3", 1, "n2", "rebalance") is None
        moves = H.request_rebalance(conn)
    assert not {m.channel_id for m in moves} & claimed


def test_a_joining_node_requests_its_share_only_moves_to_it(db: Database) -> None:
    """cluster.rebalance_on_join (router/cluster/handoff.py request_join): n3 joins owning nothing; moves to it
    from the most loaded members, as many as bring it level, nothing between n1 and n2; asked again (a second
    node's request, or a retry), the moves in progress count and nothing more moves."""
    join(db, "n1"), join(db, "n2")
    _channel(db, 1, "n1", bridges=1)
    for cid in (2, 3, 4):
        _channel(db, cid, "n1")
    _channel(db, 5, "n2")
    _channel(db, 6, "n2")
    join(db, "n3")
    with db.unit_of_work() as conn:
        moves = H.request_join(conn, "n3")
    assert {(m.to_node, m.reason, m.state) for m in moves} == {("n3", "join", "requested")}
    assert [(m.channel_id, m.from_node) for m in moves] == [(1, "n1")], \
        "n1 (5 objects) gives the unit nearest half the gap (channel 1 and its bridge: 3 / 2 after), n2 keeps its own"
    with db.unit_of_work() as conn:
        assert H.request_join(conn, "n3") == [], "asked again: what is on its way counts"
        conn.execute("INSERT INTO nsjms_drain (node_id, epoch) VALUES ('n2', 1)")
    join(db, "n4")
    with db.unit_of_work() as conn:
        assert all(m.from_node != "n2" for m in H.request_join(conn, "n4")), "a draining member is left alone"
