"""router.node.status.DatabaseFacts: the database's parts of the node's snapshot never block the status loop (issue 31:
a silent network cut to PostgreSQL stopped status.json from being rewritten for 100 s)."""

from __future__ import annotations

import threading
from typing import Any

from router.node.status import DatabaseFacts


def test_a_part_that_hangs_does_not_block_the_snapshot_and_a_failing_part_says_why() -> None:
    release = threading.Event()
    calls = {"n": 0}

    def hanging() -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] > 1:                 # the first answer came; the next query hangs (the network was cut)
            assert release.wait(30)
        return {"events": 7}

    def failing() -> dict[str, Any]:
        raise ConnectionError("server closed the connection unexpectedly")

    facts = DatabaseFacts({"store": hanging, "transactions": failing}, period_s=0.01)
    facts.refresh()
    facts.start()
    try:
        got = facts.get()                  # answers at once although the refresh thread is stuck in hanging()
        assert got["store"]["events"] == 7
        assert got["transactions"]["error"] == "ConnectionError: server closed the connection unexpectedly"
    finally:
        facts.stop()
        release.set()


def test_a_part_never_answered_is_empty() -> None:
    facts = DatabaseFacts({"store": lambda: {"events": 1}})
    assert facts.get() == {"store": {}}


def test_render_says_when_the_database_parts_are_old_or_failed() -> None:
    from router.node.status import render_transactions

    line = render_transactions({"in_doubt": 0, "outbox": 1, "inbox": 2, "as_of": 0.0})
    assert line.endswith("inbox 2 rows (as of 00:00:00Z: the database did not answer since)")
    assert "as of" not in render_transactions({"in_doubt": 0, "outbox": 1, "inbox": 2})


def test_render_cluster_names_members_takeovers_and_a_fenced_node() -> None:
    from router.node.status import render_cluster

    line = render_cluster({"epoch": 3, "fenced": False, "error": None,
                           "members": [{"node_id": "na", "state": "live", "lease_left_s": 18.24},
                                       {"node_id": "nb", "state": "fenced", "lease_left_s": -3.0}],
                           "takeovers": [{"node_id": "nb", "at": 0.0, "channels": [0], "bridges": [0]}]})
    assert line == ("cluster     epoch 3; members na live 18.2s, nb fenced; took over nb 00:00:00Z (channels [0], "
                    "bridges [0])")
    assert render_cluster({"epoch": 1, "fenced": True, "error": "node 'na' epoch 1 is fenced"}) == \
        "cluster     FENCED: node 'na' epoch 1 is fenced; it stops"
