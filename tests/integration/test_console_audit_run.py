"""A real Spark audit run started from the console (issue 26): ``nsjms audit --from --to`` on the node's own
PostgreSQL ledger, started in Debian's Chromium by an operator, followed on its run page until it ends, its report
listed and opened.

The ledger holds two days written by the same synthetic generator: 2026-02-01 and 2026-02-05, whose dedupe ids are
the same (``c2j-0`` ...). The run asks for the window [2026-02-01, 2026-02-02): the audit passes (exit 0) with the
first day's obligations only. Had the window not reached the audit, each obligation would be delivered twice (a
duplicate each, exit 7, twice the obligations): the verdict itself shows the window was applied.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.sync_api import expect
from test_console_browser import browser, shot, sign_in  # noqa: F401 (browser: its Chromium fixture)

from audit.ledger import ensure_partitions
from audit.synth import SynthSpec, copy_to_postgres, generate
from router.routing.t2.ops import AUDIT_FILE

from conftest import NsjmsServer, free_port, started_node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

DAY = SynthSpec(deliveries=30, seed=3, start=datetime(2026, 2, 1, 12, 0, tzinfo=UTC), rate_per_s=1.0)
LATER = SynthSpec(deliveries=20, seed=4, start=datetime(2026, 2, 5, 12, 0, tzinfo=UTC), rate_per_s=1.0)
RUN_DEADLINE_S = 900.0   # Spark starts in about 30 s on a loaded 2-core machine; the job itself is small


@pytest.fixture
def node(tmp_path: Path, fresh_db: str, broker_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[NsjmsServer]:
    monkeypatch.setenv("NSJMS_CONSOLE_ENABLED", "true")
    monkeypatch.setenv("NSJMS_CONSOLE_PORT", str(free_port()))
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    with started_node(tmp_path / "state", fresh_db, broker_url) as server:   # the node installs the ledger's schema
        with psycopg.connect(fresh_db) as conn:
            for spec in (DAY, LATER):
                ensure_partitions(conn, spec.start.date(), 1)
                copy_to_postgres(generate(spec)[0], conn)
        yield server


def test_a_spark_audit_run_with_a_window_started_from_the_console(node: NsjmsServer,
                                                                  browser: Any) -> None:  # noqa: F811
    base = f"http://127.0.0.1:{os.environ['NSJMS_CONSOLE_PORT']}"
    page = sign_in(browser, base, node, "operator")
    page.goto(base + "/audit/reports")
    page.fill("#audit-from", "2026-02-01")
    page.fill("#audit-to", "2026-02-02T00:00:00Z")
    page.fill("#audit-why", "console test: audit February 1st")
    page.click("#audit-start button[type=submit]")
    page.wait_for_load_state()
    assert "/audit/reports/run-" in page.url, (page.url, page.content()[:2000])
    name = page.url.rsplit("/", 1)[1]
    window = {"from": "2026-02-01T00:00:00+00:00", "to": "2026-02-02T00:00:00+00:00"}

    # the run's page follows it (console.js polls its JSON) and shows it again once it ended: no reload here
    assert page.inner_text("#run-state") == "running" and "follows it" in page.inner_text("main")
    expect(page.locator("#run-state")).not_to_have_text("running", timeout=RUN_DEADLINE_S * 1000)
    expect(page.locator("#run-report")).to_be_visible()
    status = page.request.get(f"{base}/audit/reports/{name}?format=json").json()
    log = "\n".join(status.get("log", []))
    assert status["state"] == "done" and status["exit"] == 0 and status["report"], (status["state"], log)
    assert status["window"] == window and status["window_of"] == "report"   # what the report says it audited

    summary = page.request.get(f"{base}/audit/reports/{name}/files/summary.json").json()
    assert summary["obligations"] == DAY.deliveries, log           # the first day only
    assert summary["lost"] == summary["duplicated"] == 0
    assert summary["window"] == window

    listing = page.request.get(f"{base}/audit/reports?format=json").json()
    assert [(r["name"], r["state"], r["report"]) for r in listing["reports"]] == [(name, "done", True)]
    page.goto(base + "/audit/reports")
    assert f"from {window['from']} to {window['to']}" in page.inner_text("#audit-reports")
    shot(page, "auditreports")
    page.goto(f"{base}/audit/reports/{name}")
    assert page.inner_text("#run-state") == "done" and page.inner_text("#run-exit") == "0"
    assert page.inner_text("#run-window") == f"from {window['from']} to {window['to']}"
    shot(page, "auditrun")
    page.click("#run-report")                                       # the report opens, its plots embedded
    page.wait_for_load_state()
    assert page.url == f"{base}/audit/reports/{name}/files/report.html"
    html = page.content()
    assert html.count('src="data:image/png;base64,') >= 3 and "<h2>Per bridge</h2>" in html
    assert page.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")

    started = [e for e in map(json.loads, (node.state_dir / AUDIT_FILE).read_text().splitlines())
               if e.get("action") == "console audit start"]
    assert len(started) == 1 and started[0]["who"] == "operator", started
    assert started[0]["why"] == "console test: audit February 1st" and started[0]["target"] == name
    assert window["from"] in started[0]["result"] and window["to"] in started[0]["result"]
