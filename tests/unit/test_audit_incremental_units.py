"""The incremental audit's decisions (audit/incremental.py): no database, no Spark."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from audit.incremental import DayResult, Group, IncrementalResult, due, metrics_text, recheck_at, verdict, write_metrics

T0 = datetime(2026, 3, 1, 23, 59, 58, tzinfo=UTC)
GRACE = timedelta(seconds=300)


def g(status: str, n: int = 1, oldest: datetime | None = T0, node: str = "-", bridge: int | None = 7) -> Group:
    return Group("channel_to_jms", bridge, node, status, n, oldest, None)


def test_verdict_fail_before_open_before_pass() -> None:
    assert verdict([g("delivered"), g("in_flight"), g("lost")]) == "fail"
    assert verdict([g("delivered"), g("duplicated")]) == "fail"
    assert verdict([g("delivered"), g("in_doubt")]) == "open"
    assert verdict([g("delivered"), g("dead_letter"), g("lost", 0)]) == "pass"
    assert verdict([]) == "pass"


def test_recheck_when_an_open_obligation_can_turn_lost_and_at_once_for_a_doubt() -> None:
    assert recheck_at([g("delivered"), g("lost")], GRACE) is None
    assert recheck_at([g("in_flight"), g("in_flight", oldest=T0 + timedelta(1))], GRACE) == T0 + GRACE
    doubt = T0 - timedelta(hours=5)
    assert recheck_at([g("in_flight"), g("in_doubt", oldest=doubt)], GRACE) == doubt


def test_due_on_new_changed_regraced_or_recheck_passed() -> None:
    stored = {"fingerprint": "5|9", "grace_s": 300.0, "recheck_at": T0 + GRACE}
    assert due("5|9", 300.0, T0, None)
    assert not due("5|9", 300.0, T0, stored)
    assert due("6|10", 300.0, T0, stored)
    assert due("5|9", 60.0, T0, stored)
    assert due("5|9", 300.0, T0 + GRACE, stored)
    assert not due("5|9", 300.0, T0 + GRACE, {**stored, "recheck_at": None})


def test_metrics_per_bridge_and_node_with_oldest_open_age_and_escaped_labels(tmp_path: Path) -> None:
    day = DayResult(T0.date(), "fail", (g("lost", 2), g("in_flight", 3, T0 + timedelta(seconds=40), node='n"1'),
                                        g("delivered", 5, bridge=None)), True)
    text = metrics_text(IncrementalResult(T0 + timedelta(seconds=100), (day,)))
    assert 'nsjms_audit_lost_obligations{direction="channel_to_jms",bridge="7",node="-"} 2' in text
    assert 'nsjms_audit_in_flight_obligations{direction="channel_to_jms",bridge="7",node="n\\"1"} 3' in text
    assert 'nsjms_audit_oldest_open_seconds{direction="channel_to_jms",bridge="7",node="n\\"1"} 60.000' in text
    assert 'nsjms_audit_oldest_open_seconds{direction="channel_to_jms",bridge="7",node="-"} 0.000' in text
    assert 'nsjms_audit_delivered_obligations{direction="channel_to_jms",bridge="",node="-"} 5' in text
    assert "nsjms_audit_failing_days 1" in text and text.endswith("\n")
    path = tmp_path / "a.prom"
    write_metrics(path, text)
    assert path.read_text() == text and oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["a.prom"]
