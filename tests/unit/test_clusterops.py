"""router/cli/clusterops.py: the text nsjms cluster drain prints (the JSON is DrainState.as_dict with the result)."""

from __future__ import annotations

from router.cli.clusterops import _render_drain


def test_a_dirty_drain_lists_what_is_left_and_says_what_happens_to_it() -> None:
    out = {"node_id": "n1", "epoch": 3, "result": "dirty",
           "moves": [{"channel": 4, "bridges": [7], "from": "n1", "to": "n2", "state": "started", "error": None,
                      "handoff_s": 1.25, "stop_s": 0.02}],
           "still_owns": {"channels": [], "bridges": []},
           "in_doubt": [{"gtrid": "n1:abc", "status": "commit-logged", "action": "resend"}],
           "prepared": ["n1:abc (gid 1_x_y)"], "decided": ["n1:abc"]}
    lines = _render_drain(out).splitlines()
    assert lines[0] == "drain of n1 (epoch 3): DIRTY"
    assert lines[1] == "  channel 4 + bridges [7]: n1 -> n2 started in 1.2 s (stop 0.02 s)"
    assert "  in doubt: n1:abc commit-logged (safe action: resend)" in lines
    assert "  prepared branch left in PostgreSQL: n1:abc (gid 1_x_y)" in lines
    assert "  decision row left: n1:abc" in lines
    assert "a survivor does from PostgreSQL" in lines[-1]


def test_a_drain_of_a_node_owning_nothing() -> None:
    out = {"node_id": "n1", "epoch": 1, "result": "clean", "moves": [],
           "still_owns": {"channels": [], "bridges": []}, "in_doubt": [], "prepared": [], "decided": []}
    assert _render_drain(out).splitlines() == ["drain of n1 (epoch 1): CLEAN", "  (it owned no channel)"]
