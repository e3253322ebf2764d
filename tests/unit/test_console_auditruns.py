"""The console's audit reports page and audit runs (router/console/auditruns.py): roles, CSRF, path traversal
refused, one run at a time, the audit extra missing."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from router.console.app import create_app
from router.console.auditruns import AuditRuns, WindowRefused, parse_window
from router.console.views import RateSampler
from router.security.auth import Role
from tests.unit.test_console_app import FakeBackend, _csrf, issue, login

# a stand-in for `nsjms audit --out OUT`: prints, waits until the test lets it go, writes a report with a plot
FAKE_AUDIT = """
import json, pathlib, sys, time
out = pathlib.Path(sys.argv[1]); gate = pathlib.Path(sys.argv[2]); rest = sys.argv[3:]
print("audit: reading the ledger", json.dumps(rest), flush=True)
while not gate.exists():
    time.sleep(0.05)
(out / "plots").mkdir(parents=True)
(out / "plots" / "latency.png").write_bytes(b"PNG")
(out / "report.html").write_text("<html><style>b{}</style><b>lost 0</b></html>")
bound = {o: rest[rest.index(o) + 1] if o in rest else None for o in ("--from", "--to")}
(out / "summary.json").write_text(json.dumps({"window": {"from": bound["--from"], "to": bound["--to"]}}))
print("audit: 3 obligations, lost 0", flush=True)
"""


@pytest.fixture
def env(tmp_path: Path) -> Any:
    secrets = {name: issue(tmp_path, name, role).read_text().strip().partition(":")[2]
               for name, role in (("operator", Role.OPERATOR), ("reader", Role.READER))}
    backend = FakeBackend(tmp_path)
    gate = tmp_path / "gate"
    reports = tmp_path / "audit"
    spark = {"installed": True}
    runs = AuditRuns(reports, lambda out: [sys.executable, "-c", FAKE_AUDIT, str(out), str(gate)],
                     spark=lambda: spark["installed"])
    app = create_app(backend, sampler=RateSampler(backend.snapshot), audit_runs=runs)
    yield backend, app.test_client(), secrets, runs, gate, spark
    gate.touch()                    # a run a test left waiting ends, and is reaped (no process outlives the test)
    runs.wait(60)


def _wait_done(runs: AuditRuns, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = runs.status(name)
        if status["state"] != "running":
            return status
        time.sleep(0.05)
    raise AssertionError(f"audit run {name} did not end: {runs.status(name)}")


def test_operator_starts_one_run_at_a_time_and_sees_progress_and_report(env: Any) -> None:
    backend, client, secrets, runs, gate, _ = env
    login(client, "operator", secrets["operator"])
    page = client.get("/audit/reports").get_data(as_text=True)
    assert "no reports yet" in page and 'id="audit-start"' in page
    assert client.post("/audit/reports/start", data={"why": "weekly"}).status_code == 403    # no CSRF token
    assert client.post("/audit/reports/start", data={"csrf": _csrf(page)}).status_code == 400  # no reason
    resp = client.post("/audit/reports/start?format=json", data={"why": "weekly", "csrf": _csrf(page)})
    assert resp.status_code == 200
    name = resp.get_json()["name"]
    assert backend.audits[-1][:4] == ("operator", "weekly", "console audit start", name)
    second = client.post("/audit/reports/start?format=json", data={"why": "again", "csrf": _csrf(page)})
    assert second.status_code == 409 and "one run at a time" in second.get_json()["error"]
    assert backend.audits[-1][4].startswith("refused: an audit run is already going")
    running = client.get(f"/audit/reports/{name}?format=json").get_json()
    assert running["state"] == "running" and running["exit"] is None and not running["report"]
    gate.write_text("go")
    assert _wait_done(runs, name)["state"] == "done"
    done = client.get(f"/audit/reports/{name}").get_data(as_text=True)
    assert f'id="run-state" data-src="/audit/reports/{name}?format=json">done' in done
    assert "lost 0" in done and 'id="run-exit">0' in done
    assert f"/audit/reports/{name}/files/report.html" in done
    report = client.get(f"/audit/reports/{name}/files/report.html")
    assert report.status_code == 200 and b"<b>lost 0</b>" in report.data
    assert "script-src" not in report.headers["Content-Security-Policy"]
    assert client.get(f"/audit/reports/{name}/files/plots/latency.png").data == b"PNG"
    listing = client.get("/audit/reports?format=json").get_json()
    assert [(r["name"], r["state"], r["report"]) for r in listing["reports"]] == [(name, "done", True)]
    page = client.get("/audit/reports").get_data(as_text=True)
    again = client.post("/audit/reports/start?format=json", data={"why": "rerun", "csrf": _csrf(page)})
    assert (again.status_code == 200 and again.get_json()["name"] != name) or again.status_code == 409


def test_reader_sees_reports_but_cannot_start(env: Any, tmp_path: Path) -> None:
    backend, client, secrets, runs, _, _ = env
    (tmp_path / "audit" / "by-hand").mkdir(parents=True)
    (tmp_path / "audit" / "by-hand" / "report.html").write_text("<p>by hand</p>")
    login(client, "reader", secrets["reader"])
    page = client.get("/audit/reports").get_data(as_text=True)
    assert "by-hand" in page and 'id="audit-start"' not in page
    assert client.get("/audit/reports/by-hand/files/report.html").data == b"<p>by hand</p>"
    resp = client.post("/audit/reports/start", data={"why": "x", "csrf": _csrf(page)})
    assert resp.status_code == 403 and runs.running() == ""
    assert backend.audits[-1][2:] == ("console /audit/reports/start", "", "refused: needs the operator role")
    assert not any((tmp_path / "audit").glob("*.log"))


@pytest.mark.parametrize("url", [
    "/audit/reports/by-hand/files/../../secret.txt",
    "/audit/reports/by-hand/files/..%2F..%2Fsecret.txt",
    "/audit/reports/by-hand/files/%2Fetc%2Fpasswd",
    "/audit/reports/..%2F/files/secret.txt",
    "/audit/reports/by-hand/files/link.html",
    "/audit/reports/by-hand/files/plots",
    "/audit/reports/nothere/files/report.html",
    "/audit/reports/nothere",
])
def test_only_files_of_a_reports_listing_are_served(env: Any, tmp_path: Path, url: str) -> None:
    _, client, secrets, _, _, _ = env
    (tmp_path / "secret.txt").write_text("SECRET")
    base = tmp_path / "audit" / "by-hand"
    (base / "plots").mkdir(parents=True)
    (base / "report.html").write_text("<p>by hand</p>")
    (base / "link.html").symlink_to(tmp_path / "secret.txt")
    login(client, "reader", secrets["reader"])
    resp = client.get(url, follow_redirects=True)      # werkzeug merges a doubled slash with a redirect first
    assert resp.status_code == 404 and b"SECRET" not in resp.data


def test_start_refused_without_the_audit_extra(env: Any, tmp_path: Path) -> None:
    backend, client, secrets, runs, _, spark = env
    spark["installed"] = False
    login(client, "operator", secrets["operator"])
    page = client.get("/audit/reports").get_data(as_text=True)
    resp = client.post("/audit/reports/start?format=json", data={"why": "x", "csrf": _csrf(page)})
    assert resp.status_code == 409
    assert "the audit extra is not installed (pyspark)" in resp.get_json()["error"]
    assert "pyspark" in backend.audits[-1][4] and runs.running() == ""
    assert not (tmp_path / "audit").exists()


def test_a_run_with_a_window_passes_it_as_argv_and_shows_it(env: Any, tmp_path: Path) -> None:
    backend, client, secrets, runs, gate, _ = env
    login(client, "operator", secrets["operator"])
    page = client.get("/audit/reports").get_data(as_text=True)
    assert 'id="audit-from"' in page and 'id="audit-to"' in page
    resp = client.post("/audit/reports/start?format=json",
                       data={"why": "february", "csrf": _csrf(page), "from": "2026-02-01",
                             "to": "2026-03-01T01:00+01:00"})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    name = resp.get_json()["name"]
    window = {"from": "2026-02-01T00:00:00+00:00", "to": "2026-03-01T00:00:00+00:00"}
    assert resp.get_json()["window"] == window
    assert backend.audits[-1][2:] == ("console audit start", name,
                                      "started (--from 2026-02-01T00:00:00+00:00 --to 2026-03-01T00:00:00+00:00)")
    running = client.get(f"/audit/reports/{name}?format=json").get_json()
    assert running["window"] == window and running["window_of"] == "requested"
    gate.write_text("go")
    status = _wait_done(runs, name)
    # the command got the parsed bounds as argv items of their own (the stand-in prints what it was given)
    assert status["state"] == "done"
    assert json.dumps(["--from", window["from"], "--to", window["to"]]) in status["log"][0]
    done = client.get(f"/audit/reports/{name}").get_data(as_text=True)
    assert ('<span id="run-window">from 2026-02-01T00:00:00+00:00 to 2026-03-01T00:00:00+00:00</span>' in done
            and "what the report audited" in done)
    listing = client.get("/audit/reports").get_data(as_text=True)
    assert "from 2026-02-01T00:00:00+00:00 to 2026-03-01T00:00:00+00:00" in listing


def test_a_run_without_a_window_audits_the_whole_ledger(env: Any) -> None:
    _, client, secrets, runs, gate, _ = env
    login(client, "operator", secrets["operator"])
    page = client.get("/audit/reports").get_data(as_text=True)
    name = client.post("/audit/reports/start?format=json", data={"why": "all", "csrf": _csrf(page), "from": " ",
                                                                 "to": ""}).get_json()["name"]
    gate.write_text("go")
    assert _wait_done(runs, name)["log"][0] == "audit: reading the ledger []"
    page = client.get(f"/audit/reports/{name}").get_data(as_text=True)
    assert '<span id="run-window">the whole ledger</span>' in page


@pytest.mark.parametrize(("start", "end", "words"), [
    ("yesterday", "", "from: not an ISO 8601 date or date-time: 'yesterday'"),
    ("2026-02-01; rm -rf /", "", "from: not an ISO 8601"),
    ("", "$(id)", "to: not an ISO 8601"),
    ("--help", "", "from: not an ISO 8601"),
    ("2026-02-01", "--out=/tmp/x", "to: not an ISO 8601"),
    ("2026-02-08", "2026-02-01", "is not before to"),
    ("2026-02-01T00:00Z", "2026-02-01T01:00+01:00", "is not before to"),       # the same instant: empty
    ("2026-02-01" + " " * 2 + "0" * 60, "", "longer than 40 characters"),
    ("2026-13-01", "", "from: not an ISO 8601"),
])
def test_a_bad_window_is_refused_before_anything_starts(env: Any, tmp_path: Path, start: str, end: str,
                                                        words: str) -> None:
    backend, client, secrets, runs, _, _ = env
    login(client, "operator", secrets["operator"])
    page = client.get("/audit/reports").get_data(as_text=True)
    audits = len(backend.audits)
    resp = client.post("/audit/reports/start?format=json",
                       data={"why": "x", "csrf": _csrf(page), "from": start, "to": end})
    assert resp.status_code == 400 and words in resp.get_json()["error"], resp.get_json()
    assert runs.running() == "" and not (tmp_path / "audit").exists() and len(backend.audits) == audits


def test_parse_window_is_utc_and_open_where_empty() -> None:
    assert parse_window().argv() == []
    assert parse_window("2026-02-01T12:30:00Z").argv() == ["--from", "2026-02-01T12:30:00+00:00"]
    assert parse_window("", "2026-02-01T12:30:00-02:00").as_dict() == {"from": None, "to": "2026-02-01T14:30:00+00:00"}
    with pytest.raises(WindowRefused):
        parse_window("2026-02-02", "2026-02-01")
