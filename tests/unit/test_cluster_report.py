"""router.cluster.report.render: the text of `nsjms cluster status` (the JSON is cluster_report's dict as is)."""

from __future__ import annotations

from router.cluster.report import render


def test_render_shows_members_what_they_own_their_in_doubt_work_and_unowned_objects() -> None:
    report = {"members": [
        {"node_id": "na", "state": "fenced", "epoch": 2, "address": "h1:2809", "lease_left_s": -12.0,
         "since_renewal_s": 16.0, "fenced_by": "nb", "fenced_at": "2026-12-06T12:00:00+00:00",
         "owns": {"channels": [], "bridges": []}, "in_doubt": {"prepared": 1, "decided": 1}},
        {"node_id": "nb", "state": "live", "epoch": 1, "address": "h2:2809", "lease_left_s": 19.5,
         "since_renewal_s": 0.5, "fenced_by": None, "fenced_at": None,
         "owns": {"channels": [0, 2], "bridges": [0]}, "in_doubt": {"prepared": 0, "decided": 0},
         "draining": True}],
        "unowned": {"channels": [5], "bridges": []},
        "handoffs": [{"channel": 2, "from": "nb", "to": "nc", "reason": "drain", "state": "requested"}]}
    lines = render(report).splitlines()
    assert lines[0].split()[:3] == ["NODE", "STATE", "EPOCH"]
    assert lines[1].split() == ["na", "fenced", "2", "-12.0s", "16.0s", "ago", "-", "-", "1p/1d", "h1:2809",
                                "(fenced", "by", "nb)"]
    assert lines[2].split() == ["nb", "live", "1", "19.5s", "0.5s", "ago", "0,2", "0", "0p/0d", "h2:2809",
                                "(draining)"]
    assert lines[3].startswith("unowned: channels 5, bridges -")
    assert lines[4] == "hand-off (drain): channel 2 nb -> nc, requested"
    assert "(no member" in render({"members": [], "unowned": {"channels": [], "bridges": []}})
