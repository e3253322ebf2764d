"""router/cluster/placement.py: where drain, rebalance and least-loaded placement send channels (free of I/O)."""

from __future__ import annotations

import pytest

from router.cluster.placement import drain_moves, join_moves, least_loaded, rebalance_moves


def test_least_loaded_counts_owned_objects_and_breaks_ties_by_node_id() -> None:
    assert least_loaded({"a": 3, "b": 1, "c": 1}, ["a", "b", "c"]) == "b"
    assert least_loaded({"a": 3}, ["a", "z"]) == "z"                      # owning nothing counts 0
    assert least_loaded({"a": 0}, []) is None


def test_a_drained_nodes_channels_go_heaviest_first_to_the_least_loaded_target_at_each_turn() -> None:
    # channel 1 has 2 bridges (weight 3), 2 and 3 none; b owns 1 object, c none
    moves = drain_moves({1: 3, 2: 1, 3: 1}, {"a": 5, "b": 1}, ["b", "c"])
    assert moves == {1: "c", 2: "b", 3: "b"}                           # c: 0+3; b: 1+1, then b 2 vs c 3 -> b
    assert drain_moves({}, {}, []) == {}
    with pytest.raises(ValueError):
        drain_moves({1: 1}, {}, [])


def test_rebalance_gives_a_joining_node_its_share_and_stops_when_no_move_helps() -> None:
    units = {"a": {1: 2, 2: 2, 3: 1, 4: 1}, "b": {5: 2}}
    moves = rebalance_moves(units, ["a", "b", "c"])                   # c joined, owns nothing
    load = {"a": 6, "b": 2, "c": 0}
    for cid, frm, to in moves:
        w = units[frm][cid]
        load[frm] -= w
        load[to] += w
    assert max(load.values()) - min(load.values()) <= 2, (moves, load)
    assert moves[0] == (1, "a", "c"), "the unit nearest half the gap moves first (lowest id on a tie)"
    assert len({cid for cid, _, _ in moves}) == len(moves), "each channel moves at most once"


def test_rebalance_is_sticky_for_small_differences() -> None:
    assert rebalance_moves({"a": {1: 1, 2: 1}, "b": {3: 1}}, ["a", "b"]) == []   # 2 vs 1: no churn
    assert rebalance_moves({"a": {1: 3}}, ["a", "b"]) == []          # moving the one unit only swaps the gap
    assert rebalance_moves({"a": {1: 1, 2: 1}}, ["a"]) == []                    # alone: nothing to do
    assert rebalance_moves({"a": {1: 1, 2: 1}}, ["a", "b"]) == [(1, "a", "b")]


def test_rebalance_counts_moves_in_progress_at_their_destination() -> None:
    # b is already receiving 4 objects: a's 2 units of 1 stay where they are
    assert rebalance_moves({"a": {1: 1, 2: 1}}, ["a", "b"], fixed={"b": 4}) == []
    assert rebalance_moves({"a": {1: 1, 2: 1, 3: 1}}, ["a", "b"], fixed={"a": 2}) == [(1, "a", "b"), (2, "a", "b")]


def test_a_joining_node_gets_its_share_and_nothing_moves_between_the_others() -> None:
    """cluster.rebalance_on_join: only moves to the joiner, from the most loaded first, as many as bring it level."""
    units = {"a": {1: 2, 2: 2, 3: 1, 4: 1}, "b": {5: 1, 6: 1}}
    moves = join_moves(units, ["a", "b", "c"], "c")                 # a 6, b 2, c 0
    assert all(to == "c" for _, _, to in moves)
    load = {"a": 6, "b": 2, "c": 0}
    for cid, frm, to in moves:
        load[frm] -= units[frm][cid]
        load[to] += units[frm][cid]
    assert load == {"a": 3, "b": 2, "c": 3} and len(moves) == 2, (moves, load)
    assert join_moves({"a": {1: 2}, "b": {2: 2}}, ["a", "b", "c"], "c") == [], \
        "a unit as heavy as the gap stays: no move that only swaps the imbalance"
    assert join_moves({"a": {1: 1, 2: 1}}, ["a", "b"], "b") == [(1, "a", "b")]
    assert join_moves({"a": {1: 1, 2: 1, 3: 1}}, ["a"], "b") == [], "a joiner that is not live gets nothing"
    assert join_moves({"a": {1: 1, 2: 1, 3: 1}}, ["a", "b"], "b", fixed={"b": 2}) == [], \
        "moves already on their way to it count"
