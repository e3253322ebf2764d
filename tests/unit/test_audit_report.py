"""The audit report as a person reads it (issue 28): the window is never "None .. None", and no throughput series
is drawn under another."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from audit import report


def _summ(lo: str | None, hi: str | None, obligations: int, first: str | None, last: str | None) -> dict[str, Any]:
    return {"window": {"from": lo, "to": hi}, "obligations": obligations,
            "throughput": {"first_minute": first, "last_minute": last}}


def test_an_open_window_names_the_rows_it_covered() -> None:
    text = report.window_text(_summ(None, None, 10, "2026-02-01 23:58:00+00:00", "2026-02-02 00:01:00+00:00"))
    assert "None" not in text
    assert text == ("the whole ledger: deliveries from 2026-02-01 23:58:00+00:00 to 2026-02-02 00:01:00+00:00 "
                    "(minutes, UTC)")
    assert report.window_text(_summ("2026-02-01", None, 10, "a", "b")).startswith("2026-02-01 .. the last row:")


def test_an_empty_window_says_so() -> None:
    assert report.window_text(_summ("2025-01-01", "2025-01-02", 0, None, None)) == (
        "2025-01-01 .. 2025-01-02: no ledger rows in it")


def test_two_directions_with_the_same_traffic_are_both_visible() -> None:
    minutes = [datetime(2026, 2, 1, 12, m, tzinfo=UTC) for m in range(3)]
    rows = [{"direction": d, "minute": m, "delivered": 60} for d in ("channel_to_jms", "jms_to_channel")
            for m in minutes]
    fig = report.throughput_figure(rows)
    panels = [ax for ax in fig.axes if ax.get_lines()]
    assert len(panels) == 2                                  # one panel each: neither line lies under the other
    assert sorted(ax.get_lines()[0].get_label() for ax in panels) == ["channel_to_jms", "jms_to_channel"]
    assert report._png(fig)[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_delivery_draws_one_labelled_panel() -> None:
    fig = report.throughput_figure([])
    assert len(fig.axes) == 1 and fig.axes[0].texts[0].get_text() == "no deliveries"
