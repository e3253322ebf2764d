"""The console's web layer without a node: login, sessions, CSRF, roles, headers, paging (router/console).

The backend is a recording stand-in; the node-backed pages are tested in a real browser by
tests/integration/test_console_browser.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from router.auth import Principal, Role, issue
from router.console.app import COOKIE, Sessions, create_app
from router.console.backend import ConsoleRefused
from router.console.views import RateSampler, paginate, read_operator_log


class FakeBackend:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.calls: list[tuple[Any, ...]] = []
        self.audits: list[tuple[Any, ...]] = []

    def snapshot(self) -> dict[str, Any]:
        return {"time": 0, "channels": [{"id": 1, "events_held": 3,
                                         "proxy_suppliers": [{"admin": 0, "id": 0, "queued": 2}]}],
                "bridges": [{"id": 5, "source": "channel:1", "sink": "queue:q", "state": "active", "forwarded": 9}],
                "services": {"postgres": {"reachable": True}, "broker": {"reachable": False, "error": "refused"}},
                "transactions": {"in_doubt": 1, "oldest_in_doubt_s": 75.0}}

    def endpoints(self) -> dict[str, Any]:
        return {"node_id": "node1", "pid": 1}

    def channels(self, who: Principal) -> list[dict[str, Any]]:
        return [{"id": i, "events_held": i % 7, "proxy_suppliers": 1, "queued": i} for i in range(120)]

    def channel(self, who: Principal, cid: int) -> dict[str, Any]:
        if cid != 1:
            raise ConsoleRefused(f"no channel with id {cid}")
        return {"id": 1, "qos": {"EventReliability": 1}, "admin": {"MaxQueueLength": 0}, "events_held": 3,
                "consumer_admins": [], "supplier_admins": [], "snapshot_age_s": 1.0}

    def bridges(self, who: Principal) -> list[dict[str, Any]]:
        return [{"id": 5, "source": "channel:1", "sink": "queue:q", "state": "active", "started": True,
                 "reason": None, "channel_id": 1, "channel_exists": True, "last_error": None, "forwarded": 9,
                 "dead_lettered": 0, "transactions": {}}]

    def bridge_action(self, who: Principal, bid: int, action: str, why: str) -> dict[str, Any]:
        self.calls.append(("bridge", who.name, bid, action, why))
        return {"id": bid, "stopped": True}

    def transactions(self) -> dict[str, Any]:
        return {"node": "node1", "mode": "online", "time": 0, "orphans": [], "foreign": 0, "errors": [],
                "transactions": [self.transaction("node1:abc")]}

    def transaction(self, gtrid: str) -> dict[str, Any]:
        return {"gtrid": gtrid, "status": "prepared", "decision": None, "decided_at": None, "deadline": None,
                "age_s": 80.0, "action": "rollback", "reason": "no decision logged", "branches": [], "outbox": [],
                "inbox": [], "heuristics": [], "in_doubt": True, "bridges": [5], "channels": [1],
                "destinations": ["queue:q"], "events": 1}

    def txn_action(self, who: Principal, gtrid: str, action: str, why: str) -> dict[str, Any]:
        self.calls.append(("txn", who.name, gtrid, action, why))
        if action == "commit":
            raise ConsoleRefused("ROLLBACK is logged")
        return {"gtrid": gtrid, "action": action}

    def dead_letters(self, channel: int | None) -> dict[str, Any]:
        rows = [{"id": 7, "channel_id": 1, "side": "C", "admin_id": 0, "proxy_id": 0, "event_name": "d/t/e2",
                 "reason": "bad parameter", "exception": "BAD_PARAM", "attempts": 3, "dead_at": 0.0}]
        return {"node": "node1", "channel": channel, "total": 1,
                "dead_letters": [r for r in rows if channel in (None, r["channel_id"])]}

    def dead_letter(self, dl_id: int) -> dict[str, Any]:
        if dl_id != 7:
            raise ConsoleRefused(f"no dead letter {dl_id}")
        return {**self.dead_letters(None)["dead_letters"][0], "dedupe_id": "x", "received_at": 0.0, "priority": 0,
                "persistent": True, "size": 10, "retry": "back into the queue of proxy supplier 0",
                "event": {"form": "structured", "filterable_data": {"n": "2"}}}

    def dead_letter_action(self, who: Principal, dl_id: int, action: str, why: str) -> dict[str, Any]:
        self.calls.append(("deadletter", who.name, dl_id, action, why))
        return {"id": dl_id, "retried": True}

    def audit(self, who: str, why: str, action: str, target: str, result: Any) -> None:
        self.audits.append((who, why, action, target, result))


@pytest.fixture
def env(tmp_path: Path) -> tuple[FakeBackend, FlaskClient, dict[str, str]]:
    secrets = {name: issue(tmp_path, name, role).read_text().strip().partition(":")[2]
               for name, role in (("operator", Role.OPERATOR), ("reader", Role.READER))}
    backend = FakeBackend(tmp_path)
    app = create_app(backend, sampler=RateSampler(backend.snapshot))
    return backend, app.test_client(), secrets


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, html
    return m.group(1)


def login(client: FlaskClient, name: str, secret: str) -> Any:
    token = _csrf(client.get("/login").get_data(as_text=True))
    return client.post("/login", data={"csrf": token, "name": name, "secret": secret, "next": "/bridges"})


def test_unauthenticated_redirects_to_login_and_json_is_401(env: Any) -> None:
    _, client, _ = env
    resp = client.get("/channels?q=3")
    assert resp.status_code == 302 and resp.headers["Location"].startswith("/login?next=")
    assert client.get("/channels?format=json").status_code == 401
    assert client.post("/bridges/5/stop", data={"why": "x"}).status_code == 401


def test_login_wrong_secret_refused_and_logged_without_secret(env: Any) -> None:
    backend, client, secrets = env
    resp = login(client, "operator", "wrong-" + secrets["operator"])
    assert resp.status_code == 401 and COOKIE not in resp.headers.get("Set-Cookie", "")
    assert backend.audits[-1][2:] == ("console login", "127.0.0.1", "refused: unknown name or wrong secret")
    assert secrets["operator"] not in repr(backend.audits)


def test_login_without_its_csrf_token_refused(env: Any) -> None:
    _, client, secrets = env
    resp = client.post("/login", data={"name": "operator", "secret": secrets["operator"]})
    assert resp.status_code == 403


def test_operator_acts_with_csrf_and_reason(env: Any) -> None:
    backend, client, secrets = env
    resp = login(client, "operator", secrets["operator"])
    assert resp.status_code == 302 and resp.headers["Location"] == "/bridges"
    cookie = resp.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie
    page = client.get("/bridges/5").get_data(as_text=True)
    assert "Stop bridge 5" in page
    assert client.post("/bridges/5/stop", data={"why": "maintenance"}).status_code == 403  # no CSRF token
    assert backend.calls == []
    resp = client.post("/bridges/5/stop", data={"why": "maintenance", "csrf": _csrf(page)})
    assert resp.status_code == 302
    assert backend.calls == [("bridge", "operator", 5, "stop", "maintenance")]


def test_reader_has_no_buttons_and_post_is_403(env: Any) -> None:
    backend, client, secrets = env
    login(client, "reader", secrets["reader"])
    page = client.get("/bridges/5").get_data(as_text=True)
    assert "Stop bridge" not in page and "Destroy bridge" not in page
    txn = client.get("/transactions/node1:abc?confirm=rollback").get_data(as_text=True)
    assert "confirm_gtrid" not in txn
    token = _csrf(page)
    assert client.post("/bridges/5/stop", data={"why": "x", "csrf": token}).status_code == 403
    assert client.post("/transactions/node1:abc/rollback",
                       data={"why": "x", "csrf": token, "confirm_gtrid": "node1:abc"}).status_code == 403
    assert backend.calls == []
    assert backend.audits[-1][0] == "reader" and backend.audits[-1][4] == "refused: needs the operator role"


def test_txn_action_needs_reason_and_confirmation_and_shows_refusal(env: Any) -> None:
    backend, client, secrets = env
    login(client, "operator", secrets["operator"])
    page = client.get("/transactions/node1:abc?confirm=commit").get_data(as_text=True)
    assert "node1:abc" in page and 'id="confirm_gtrid"' in page
    token = _csrf(page)
    url = "/transactions/node1:abc/commit"
    assert client.post(url, data={"csrf": token, "confirm_gtrid": "node1:abc"}).status_code == 400
    assert client.post(url, data={"csrf": token, "why": "w", "confirm_gtrid": "node1:abd"}).status_code == 400
    assert backend.calls == []
    resp = client.post(url, data={"csrf": token, "why": "checked", "confirm_gtrid": "node1:abc"})
    assert resp.status_code == 409 and "ROLLBACK is logged" in resp.get_data(as_text=True)
    resp = client.post("/transactions/node1:abc/rollback",
                       data={"csrf": token, "why": "checked", "confirm_gtrid": "node1:abc"})
    assert resp.status_code == 200 and 'id="result">Done.' in resp.get_data(as_text=True)
    assert backend.calls[-1] == ("txn", "operator", "node1:abc", "rollback", "checked")


def test_secure_headers_and_json(env: Any) -> None:
    _, client, secrets = env
    login(client, "reader", secrets["reader"])
    resp = client.get("/")
    csp = resp.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert resp.headers["X-Frame-Options"] == "DENY" and resp.headers["Cache-Control"] == "no-store"
    assert "<script>" not in resp.get_data(as_text=True)  # no inline script anywhere
    data = client.get("/?format=json").get_json()
    assert data["transactions"]["in_doubt"] == 1 and data["queued"] == 2
    page = client.get("/channels?format=json&sort=queued&desc=1&per_page=10&page=2").get_json()
    assert page["total"] == 120 and [r["id"] for r in page["rows"]] == list(range(109, 99, -1))
    assert client.get("/channels/2?format=json").status_code == 404


def test_logout_ends_session_and_rotation_ends_it(env: Any, tmp_path: Path) -> None:
    _, client, secrets = env
    login(client, "operator", secrets["operator"])
    assert client.get("/bridges").status_code == 200
    issue(tmp_path, "operator", Role.READER)   # role changed: the session ends at its next request
    assert client.get("/bridges").status_code == 302


def test_sessions_expire() -> None:
    now = [0.0]
    sessions = Sessions(idle_s=60, max_s=300, clock=lambda: now[0])
    sid, _ = sessions.open(Principal("operator", Role.OPERATOR))
    for _ in range(4):
        now[0] += 59
        assert sessions.get(sid) is not None
    now[0] += 61
    assert sessions.get(sid) is None
    sid, _ = sessions.open(Principal("operator", Role.OPERATOR))
    for _ in range(6):
        now[0] += 50
    assert sessions.get(sid) is None


def test_paginate_filters_sorts_and_clamps() -> None:
    rows = [{"id": i, "name": f"n{i}", "v": None if i == 2 else i % 3} for i in range(10)]
    p = paginate(rows, q="n1", fields=("name",))
    assert [r["id"] for r in p.rows] == [1]
    p = paginate(rows, sort="v", per_page=3, page=99)
    assert p.page == p.pages == 4 and p.rows[-1]["id"] == 2   # None sorts last
    assert paginate(rows, sort="nope").sort == "id"


def test_rate_sampler_series() -> None:
    snaps = iter([{"bridges": [{"id": 1, "forwarded": 0}]}, {"bridges": [{"id": 1, "forwarded": 10}]},
                  {"bridges": [{"id": 1, "forwarded": 30}, {"id": 2, "forwarded": 4}]}])
    s = RateSampler(lambda: next(snaps), interval_s=2)
    for t in (100.0, 102.0, 104.0):
        s.sample(now=t)
    assert s.series() == {"t": [102.0, 104.0], "bridges": {"1": [5.0, 10.0], "2": [None, None]}}


def test_read_operator_log(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_text('{"who": "a"}\nnot json\n{"who": "b"}\n')
    assert [e["who"] for e in read_operator_log(path)] == ["b", "a"]
    assert read_operator_log(tmp_path / "missing") == []


def test_console_configuration() -> None:
    from router.config import ConfigError, load_config

    cfg = load_config(env={})
    assert (cfg.console.enabled, cfg.console.host, cfg.console.port) == (False, "127.0.0.1", 8460)
    cfg = load_config(env={"NSJMS_CONSOLE_ENABLED": "true", "NSJMS_CONSOLE_PORT": "9000",
                           "NSJMS_CONSOLE_TLS_CERT": "/c.pem", "NSJMS_CONSOLE_TLS_KEY": "/k.pem"})
    assert (cfg.console.enabled, cfg.console.port, cfg.console.tls_key) == (True, 9000, "/k.pem")
    with pytest.raises(ConfigError, match=r"console\.tls_key .*needs both"):
        load_config(env={"NSJMS_CONSOLE_TLS_CERT": "/c.pem"})
    with pytest.raises(ConfigError, match=r"console\.port"):
        load_config(env={"NSJMS_CONSOLE_PORT": "0"})


def test_dead_letters_listed_shown_retried_by_operator_only(env: Any) -> None:
    backend, client, secrets = env
    login(client, "reader", secrets["reader"])
    assert client.get("/deadletters?format=json&channel=2").get_json()["page"]["total"] == 0
    page = client.get("/deadletters/7").get_data(as_text=True)
    assert "bad parameter" in page and "back into the queue of proxy supplier 0" in page and 'id="dl-retry"' not in page
    assert client.post("/deadletters/7/retry", data={"why": "x", "csrf": _csrf(page)}).status_code == 403
    client.post("/logout", data={"csrf": _csrf(page)})
    login(client, "operator", secrets["operator"])
    page = client.get("/deadletters/7").get_data(as_text=True)
    assert 'id="dl-retry"' in page
    assert client.post("/deadletters/7/retry", data={"csrf": _csrf(page)}).status_code == 400   # no reason
    assert client.post("/deadletters/7/retry", data={"why": "fixed", "csrf": _csrf(page)}).status_code == 200
    assert backend.calls == [("deadletter", "operator", 7, "retry", "fixed")]
    assert client.get("/deadletters/8").status_code == 404


def test_failed_sign_ins_are_throttled(env: Any) -> None:
    backend, client, secrets = env
    for _ in range(20):
        assert login(client, "operator", "wrong").status_code == 401
    assert login(client, "operator", secrets["operator"]).status_code == 429   # even the right secret, for a while
    assert len([a for a in backend.audits if a[2] == "console login"]) == 20     # the flood is not logged line by line


def test_login_throttle_window() -> None:
    from router.console.app import LoginThrottle

    now = [0.0]
    throttle = LoginThrottle(limit=2, window_s=60, clock=lambda: now[0])
    throttle.failed()
    throttle.failed()
    assert throttle.blocked()
    now[0] += 61
    assert not throttle.blocked()
