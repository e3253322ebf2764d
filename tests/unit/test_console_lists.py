"""The console's lists that were not paged (the operator log, the audit reports) and a bridge's events/s chart."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from router.console.app import create_app
from router.console.auditruns import AuditRuns
from router.console.views import RateSampler
from router.routing.t2.ops import AUDIT_FILE
from router.security.auth import Role
from tests.unit.test_console_app import FakeBackend, issue, login


@pytest.fixture
def env(tmp_path: Path) -> Any:
    secrets = {name: issue(tmp_path, name, role).read_text().strip().partition(":")[2]
               for name, role in (("operator", Role.OPERATOR), ("reader", Role.READER))}
    backend = FakeBackend(tmp_path)
    snaps = iter([{"bridges": [{"id": 5, "forwarded": 0, "dead_lettered": 0}, {"id": 8, "forwarded": 0}]},
                  {"bridges": [{"id": 5, "forwarded": 8, "dead_lettered": 2}, {"id": 8, "forwarded": 100}]},
                  {"bridges": [{"id": 5, "forwarded": 20, "dead_lettered": 2}, {"id": 8, "forwarded": 100}]}])
    sampler = RateSampler(lambda: next(snaps), interval_s=2)
    for t in (100.0, 102.0, 104.0):
        sampler.sample(now=t)
    runs = AuditRuns(tmp_path / "audit", lambda out: [sys.executable, "-c", "pass"], spark=lambda: True)
    app = create_app(backend, sampler=sampler, audit_runs=runs)
    client = app.test_client()
    login(client, "reader", secrets["reader"])
    return backend, client, tmp_path


def test_the_operator_log_is_paged_filtered_and_sorted(env: Any) -> None:
    _, client, state = env
    with open(state / AUDIT_FILE, "w") as log:
        for i in range(120):
            log.write(json.dumps({"at": 1000.0 + i, "who": "alice" if i % 3 else "bob", "why": f"reason {i}",
                                  "action": "console bridge stop", "target": str(i), "result": "ok"}) + "\n")
    data = client.get("/audit?format=json").get_json()
    assert [e["target"] for e in data["entries"]][:3] == ["119", "118", "117"] and len(data["entries"]) == 50
    assert data["page"] == {"total": 120, "page": 1, "pages": 3, "per_page": 50, "sort": "at", "desc": True, "q": ""}
    assert data["read"] == 120
    bob = client.get("/audit?format=json&q=bob&per_page=500").get_json()
    assert bob["page"]["total"] == 40 and {e["who"] for e in bob["entries"]} == {"bob"}
    oldest = client.get("/audit?format=json&sort=at&page=3").get_json()
    assert [e["target"] for e in oldest["entries"]] == [str(i) for i in range(100, 120)]
    page = client.get("/audit?q=reason+7").get_data(as_text=True)
    assert "showing 21 of 21 item(s) (filtered), page 1 of 1" in page and "reason 77" in page  # 7, 17 .. 117
    assert client.get("/audit?format=json&limit=10").get_json()["page"]["total"] == 10     # the newest 10 read


def test_the_audit_reports_are_paged_filtered_and_sorted(env: Any) -> None:
    _, client, state = env
    for name in ("weekly-1", "weekly-2", "monthly"):
        (state / "audit" / name).mkdir(parents=True)
        (state / "audit" / name / "report.html").write_text(f"<p>{name}</p>")
    (state / "audit" / "monthly" / "summary.json").write_text(json.dumps({"window": {"from": "2026-02-01T00:00:00"
                                                                                      "+00:00", "to": None}}))
    data = client.get("/audit/reports?format=json&q=weekly&sort=name").get_json()
    assert [r["name"] for r in data["reports"]] == ["weekly-1", "weekly-2"] and data["page"]["total"] == 2
    assert [r["name"] for r in client.get("/audit/reports?format=json&sort=name&desc=1&per_page=2"
                                          ).get_json()["reports"]] == ["weekly-2", "weekly-1"]
    page = client.get("/audit/reports?q=2026-02-01").get_data(as_text=True)
    assert "showing 1 of 1 item(s) (filtered)" in page and "from 2026-02-01T00:00:00+00:00 to (open)" in page
    assert "the whole ledger" not in page


def test_a_bridges_page_charts_its_own_events_per_second(env: Any) -> None:
    _, client, _ = env
    assert client.get("/rates?bridge=5").get_json() == {"t": [102.0, 104.0], "bridges": {"5": [4.0, 6.0]},
                                                        "dead_lettered": [1.0, 0.0], "total": [], "of": 1}
    assert client.get("/rates?bridge=9").get_json() == {"t": [102.0, 104.0], "bridges": {}, "dead_lettered": [],
                                                        "total": [], "of": 0}
    assert client.get("/rates").get_json()["bridges"] == {"5": [4.0, 6.0], "8": [50.0, 0.0]}
    page = client.get("/bridges/5").get_data(as_text=True)
    assert 'id="rates" class="chart" data-src="/rates?bridge=5"' in page and "uPlot.iife.min.js" in page


def test_the_ledger_audit_page_charts_its_days(env: Any) -> None:
    _, client, _ = env
    page = client.get("/audit/days?days=9").get_data(as_text=True)
    assert '<div id="audit-chart" class="chart" data-src="/audit/days?days=9&amp;format=json">' in page
    assert "uPlot.iife.min.js" in page and "console.js" in page
