"""Drain-and-handoff requests in PostgreSQL (router/cluster/handoff.py, migration 0010) on a real database: who
gets a drained node's channels, the release's fence, a rebalance after a join, least-loaded placement, and what a
drain reports. The nodes' part (stopping, loading) is tested with real nodes in test_cluster_drain.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from router.cluster import Fenced
from router.cluster import handoff as H
from router.cluster import members as M
from router.db import Database

from clusterkit import db_fixture, join, sql_channel, sql_owners  # noqa: F401 - db_fixture: the fixture "db"

pytestmark = pytest.mark.integration



_channel, _owners = sql_channel, sql_owners


def test_a_drain_spreads_the_channels_and_the_release_moves_them_fenced(db: Database) -> None:
    e1, _, _ = join(db, "n1"), join(db, "n2"), join(db, "n3")
    _channel(db, 1, "n1", bridges=2)
    _channel(db, 2, "n1")
    _channel(db, 3, "n1")
    _channel(db, 4, "n2")
    with db.unit_of_work() as conn:
        epoch, moves = H.request_drain(conn, "n1")
    assert epoch == e1
    assert [(m.channel_id, m.to_node, m.state) for m in moves] == \
        [(1, "n3", "requested"), (2, "n2", "requested"), (3, "n2", "requested")], "heaviest first, least loaded"
    with db.unit_of_work() as conn:
        assert H.draining(conn) == {"n1"}
        assert H.live_targets(conn) == ["n2", "n3"], "a draining member gets nothing new"
        again = H.request_drain(conn, "n1")[1]
    assert again == [], "a channel already being moved keeps its move"

    with db.unit_of_work() as conn:
        done = H.release(conn, moves[0], "n1", e1, 0.25)
    assert (done.state, done.to_node, done.bridges) == ("released", "n3", (100, 101))
    assert {k: v for k, v in _owners(db).items() if k[1] in (1, 100, 101)} == \
        {("channel", 1): "n3", ("bridge", 100): "n3", ("bridge", 101): "n3"}, "the channel and its bridges, together"
    with db.unit_of_work() as conn:
        assert [h.id for h in H.released_to(conn, "n3")] == [done.id]
        H.mark_started(conn, [done.id])
        assert H.released_to(conn, "n3") == []
        with pytest.raises(H.HandOffRefused):
            H.release(conn, moves[0], "n1", e1, 0.0)        # released once only
    with pytest.raises(Fenced), db.unit_of_work() as conn:
        H.release(conn, moves[1], "n1", e1 + 7, 0.0)         # not the live epoch: refused, nothing moves
    assert _owners(db)[("channel", 2)] == "n1"
    with db.unit_of_work() as conn:
        M.leave(conn, "n2", 1)                               # the chosen target left: the least loaded other one
        done2 = H.release(conn, moves[1], "n1", e1, 0.1)
    assert (done2.state, done2.to_node) == ("released", "n3")

    with db.unit_of_work() as conn:
        state = H.drain_state(conn, "n1", e1, [m.id for m in moves])
    assert not state.finished and state.owns.channels == (3,)
    assert state.verdict() == "failed", "a node that still owns a channel is not drained"


def test_a_drain_is_refused_without_another_live_member_and_for_a_dead_node(db: Database) -> None:
    join(db, "n1")
    _channel(db, 1, "n1")
    with pytest.raises(H.HandOffRefused, match="no other live member"), db.unit_of_work() as conn:
        H.request_drain(conn, "n1")
    with pytest.raises(H.HandOffRefused, match="not a member"), db.unit_of_work() as conn:
        H.request_drain(conn, "nobody")
    with db.unit_of_work() as conn:
        M.leave(conn, "n1", 1)
    with pytest.raises(H.HandOffRefused, match="not a live member"), db.unit_of_work() as conn:
        H.request_drain(conn, "n1")
    with db.unit_of_work() as conn:
        assert H.draining(conn) == set()


def test_a_rebalance_gives_a_joined_node_its_share_and_placement_picks_the_least_loaded(db: Database) -> None:
    join(db, "n1")
    for cid in (1, 2, 3, 4):
        _channel(db, cid, "n1")
    join(db, "n2")                                          # joins owning nothing: sticky, nothing moves by itself
    assert set(_owners(db).values()) == {"n1"}
    with db.unit_of_work() as conn:
        moves = H.request_rebalance(conn)
    assert sorted((m.from_node, m.to_node) for m in moves) == [("n1", "n2"), ("n1", "n2")]
    with db.unit_of_work() as conn:
        assert H.request_rebalance(conn) == [], "moves already requested are not requested twice"

    _channel(db, 5, "n2")
    with db.unit_of_work() as conn:                          # n1 owns 4, n2 owns 1: a new channel of n1's goes to n2
        conn.execute("INSERT INTO nsjms_channel (id, qos, admin_props) VALUES (6, '{}', '{}')")
        M.assign(conn, ("channel", 6), "n1")
        placed = H.place_new(conn, 6, "n1", 1)
        assert placed is not None and (placed.to_node, placed.reason) == ("n2", "placement")
        conn.execute("INSERT INTO nsjms_channel (id, qos, admin_props) VALUES (7, '{}', '{}')")
        M.assign(conn, ("channel", 7), "n2")
        assert H.place_new(conn, 7, "n2", 1) is None, "the creator is the least loaded: it keeps it"


def test_a_drain_is_clean_dirty_or_heuristic_by_what_the_node_leaves_in_doubt(db: Database, fresh_db: str) -> None:
    import psycopg
    from psycopg import sql

    from xa.xid import NodeId, branch_xid, new_gtrid

    e1, _ = join(db, "n1"), join(db, "n2")
    with db.unit_of_work() as conn:
        assert H.request_drain(conn, "n1") == (e1, [])                # it owns nothing: no move
        state = H.drain_state(conn, "n1", e1, [])
    assert not state.reported, "the verdict waits for the node's own report of its log"
    with db.unit_of_work() as conn:
        H.report_in_doubt(conn, "n1", e1, [])
        state = H.drain_state(conn, "n1", e1, [])
    assert (state.reported, state.finished, state.verdict()) == (True, True, "clean")

    gtrid = new_gtrid(NodeId("n1"))
    xid = branch_xid(gtrid, "pg")
    conn2 = psycopg.connect(fresh_db)
    conn2.tpc_begin(psycopg.Xid.from_parts(xid.format_id, xid.gtrid, xid.bqual))
    conn2.execute("SELECT 1")
    conn2.tpc_prepare()
    conn2.close()
    try:
        with db.unit_of_work() as conn:
            state = H.drain_state(conn, "n1", e1, [])
        assert state.verdict() == "dirty" and len(state.prepared) == 1, state
        assert gtrid in state.prepared[0], "the prepared branch of the node's xid is listed"
        with db.unit_of_work() as conn:
            H.report_in_doubt(conn, "n1", e1, [{"gtrid": gtrid, "status": "heuristic-commit", "action": "forget",
                                                "reason": "operator"}])
            state = H.drain_state(conn, "n1", e1, [])
        assert (state.verdict(), state.heuristic) == ("heuristic", [gtrid])
    finally:
        with psycopg.connect(fresh_db, autocommit=True) as conn3:
            for (gid,) in conn3.execute("SELECT gid FROM pg_prepared_xacts").fetchall():
                conn3.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


def _expire(db: Database, node: str) -> None:
    with db.unit_of_work() as conn:
        conn.execute("UPDATE nsjms_member SET lease_until = clock_timestamp() - interval '1 second' "
                     "WHERE node_id = %s", (node,))


def test_a_takeover_ends_the_dead_nodes_open_moves_so_its_next_incarnation_starts_none(db: Database) -> None:
    """Review finding (this session): a move released TO a node that then died stayed 'released'; the survivor
    claimed the channel and ran it, and the dead node's next incarnation started the same channel from that row: two
    nodes running one channel. A move requested FROM a dead node pinned its channel (no other move, no clean drain)."""
    from router.cluster.ownership import claim_all

    e1, e2, e3 = join(db, "n1"), join(db, "n2"), join(db, "n3")
    _channel(db, 1, "n1")
    _channel(db, 2, "n2")
    with db.unit_of_work() as conn:
        move = H.request_drain(conn, "n1")[1][0]
        released = H.release(conn, move, "n1", e1, 0.1)              # channel 1 released to n3 (least loaded) ...
    assert released.to_node == "n3" and _owners(db)[("channel", 1)] == "n3"
    _channel(db, 3, "n3")
    with db.unit_of_work() as conn:
        from_dead = H._insert(conn, 3, "n3", e3, "n2", "rebalance")  # ... a move n3 was to make ...
        live_move = H._insert(conn, 2, "n2", e2, "n1", "rebalance")  # ... and a live node's own move
    _expire(db, "n3")                                                # n3 dies before starting channel 1
    with db.unit_of_work() as conn:
        claim_all(conn, "n3", "n2", e2)
    assert _owners(db)[("channel", 1)] == "n2" and _owners(db)[("channel", 3)] == "n2", "the survivor owns them"
    with db.unit_of_work() as conn:
        assert H.released_to(conn, "n3") == [], "the dead node's next incarnation starts nothing of it"
        states = dict(conn.execute("SELECT id, state FROM nsjms_handoff").fetchall())
    assert (states[released.id], states[from_dead.id], states[live_move.id]) == ("failed", "failed", "requested")


def test_a_released_move_whose_channel_moved_on_is_not_started(db: Database) -> None:
    e1, _ = join(db, "n1"), join(db, "n2")
    _channel(db, 1, "n1")
    with db.unit_of_work() as conn:
        released = H.release(conn, H.request_drain(conn, "n1")[1][0], "n1", e1, 0.1)
        M.claim(conn, ("channel", 1), "n2", "n1")                    # moved on by other means meanwhile
        assert released.to_node == "n2" and H.released_to(conn, "n2") == []


def test_two_drain_requests_at_once_leave_one_move_per_channel(db: Database, fresh_db: str) -> None:
    """Review: the operator's drain and the drained node's own pass both requested a move of a channel created
    meanwhile; the second broke the one-open-move index and failed (the CLI exited 1 on a raw database error)."""
    join(db, "n1"), join(db, "n2")
    _channel(db, 1, "n1")
    other = Database(fresh_db, 1)
    other.open()
    try:
        with db.unit_of_work() as first:
            moves = H.request_drain(first, "n1")[1]                  # not committed yet ...
            assert [m.channel_id for m in moves] == [1]
            done = threading.Event()
            seen: list[Any] = []

            def second() -> None:
                with other.unit_of_work() as conn:
                    seen.append(H.request_drain(conn, "n1")[1])      # ... waits on the index, then finds it taken
                done.set()

            t = threading.Thread(target=second)
            t.start()
            assert not done.wait(0.5), "the second request waits for the first one's transaction"
        t.join(30)
        assert seen == [[]], seen
    finally:
        other.close()
    with db.unit_of_work() as conn:
        assert conn.execute("SELECT count(*) FROM nsjms_handoff WHERE channel_id = 1").fetchone() == (1,)
