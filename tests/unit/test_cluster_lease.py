"""router/cluster/lease.py: the cluster's decisions, free of I/O."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from router.cluster.lease import LeaseSettings, MemberView, claims, expired, owner_for_new

NOW = datetime(2026, 12, 6, 8, 0, tzinfo=UTC)


def _m(node: str, state: str, left_s: float) -> MemberView:
    return MemberView(node, 1, state, "", NOW + timedelta(seconds=left_s), NOW, NOW)


def test_settings_need_a_lease_that_survives_two_missed_renewals() -> None:
    assert LeaseSettings() == LeaseSettings(2.0, 20.0)
    LeaseSettings(1.0, 3.0)
    with pytest.raises(ValueError, match="expiry_s >= 3 x renew_s"):
        LeaseSettings(1.0, 2.9)
    with pytest.raises(ValueError):
        LeaseSettings(0.0, 10.0)


def test_expired_are_lapsed_live_leases_and_members_that_left() -> None:
    members = [_m("a", "live", 5), _m("b", "live", -0.1), _m("c", "left", 30), _m("d", "fenced", -9),
               _m("e", "live", 0)]
    assert expired(members) == ["b", "c", "e"]               # a fenced member was taken over already
    assert [m.live for m in members] == [True, False, False, False, False]


def test_a_new_object_goes_to_the_least_loaded_live_node() -> None:
    assert owner_for_new({"a": 3, "b": 1, "c": 1}, ["a", "b", "c"]) == "b"   # ties by node id
    assert owner_for_new({"a": 3}, ["a", "z"]) == "z"                        # a node owning nothing counts 0
    with pytest.raises(ValueError):
        owner_for_new({}, [])


def test_a_dead_nodes_objects_are_spread_least_loaded_first_deterministically() -> None:
    objects = [("bridge", 2), ("channel", 1), ("bridge", 1), ("channel", 2)]
    out = claims(objects, {"n2": 1, "n3": 0}, ["n2", "n3"])
    assert out == {("bridge", 1): "n3", ("bridge", 2): "n2", ("channel", 1): "n3", ("channel", 2): "n2"}
    assert claims(reversed(objects), {"n2": 1, "n3": 0}, ["n3", "n2"]) == out
    with pytest.raises(ValueError):
        claims(objects, {}, [])
