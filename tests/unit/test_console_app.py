"""The console's web layer without a node: login, sessions, CSRF, roles, headers, paging (router/console).

The backend is a recording stand-in; the node-backed pages are tested in a real browser by
tests/integration/test_console_browser.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from router.console.app import COOKIE, Sessions, create_app
from router.console.backend import BridgeSpec, ConsoleRefused
from router.console.views import RateSampler, paginate, read_operator_log
from router.security.auth import Principal, Role, issue

ORPHAN = "1853188657_Z29uZTox_cGc="      # an orphan's GID: characters a URL path must carry


def _member(node: str) -> dict[str, Any]:
    return {"node_id": node, "state": "live", "epoch": 3, "address": f"{node}:2809", "lease_left_s": 18.0,
            "since_renewal_s": 1.0, "owns": {"channels": [1], "bridges": [5, 6]},
            "in_doubt": {"prepared": 1, "decided": 0}}


class FakeBackend:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.calls: list[tuple[Any, ...]] = []
        self.audits: list[tuple[Any, ...]] = []
        self.asked: list[list[int] | None] = []       # the bridge ids a page asked the node about
        self.bridge_ids = [5]
        self.members = ["node1"]

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

    def bridges(self, who: Principal, ids: Sequence[int] | None = None) -> list[dict[str, Any]]:
        self.asked.append(None if ids is None else list(ids))
        return [{"id": bid, "source": "channel:1", "sink": "queue:q", "state": "active", "started": True,
                 "reason": None, "channel_id": 1, "channel_exists": True, "last_error": None, "forwarded": 9,
                 "dead_lettered": 0, "transactions": {}} for bid in ([5] if ids is None else ids)
                if bid in self.bridge_ids]

    def bridge_index(self, who: Principal) -> list[dict[str, Any]]:
        return [{"id": bid, "source": "channel:1", "sink": f"queue:q{bid}", "state": "active", "reason": None,
                 "last_error": None, "forwarded": bid, "dead_lettered": 0} for bid in self.bridge_ids]

    def bridge_action(self, who: Principal, bid: int, action: str, why: str) -> dict[str, Any]:
        self.calls.append(("bridge", who.name, bid, action, why))
        if bid == 8:
            raise ConsoleRefused("no bridge with id 8")
        return {"id": bid, "stopped": True}

    def transactions(self) -> dict[str, Any]:
        return {"node": "node1", "mode": "online", "time": 0, "foreign": 0, "errors": [],
                "orphans": [{"gid": ORPHAN, "format_id": 1853188657, "gtrid": "gone:1", "bqual": "pg",
                             "prepared_at": 0.0, "age_s": 900.0, "owner": "nsjms", "reason": "names no transaction"}],
                "transactions": [self.transaction("node1:abc")]}

    def transaction(self, gtrid: str) -> dict[str, Any]:
        return {"gtrid": gtrid, "status": "prepared", "decision": "commit" if gtrid == "node1:logged" else None,
                "decided_at": None, "deadline": None,
                "age_s": 80.0, "action": "rollback", "reason": "no decision logged", "branches": [], "outbox": [],
                "inbox": [], "heuristics": [], "in_doubt": True, "bridges": [5], "channels": [1],
                "destinations": ["queue:q"], "events": 1}

    def txn_action(self, who: Principal, gtrid: str, action: str, why: str) -> dict[str, Any]:
        self.calls.append(("txn", who.name, gtrid, action, why))
        if action == "commit":
            raise ConsoleRefused("no COMMIT is logged ... Add --heuristic to commit it")
        return {"gtrid": gtrid, "action": action}

    def orphan_action(self, who: Principal, gid: str, action: str, why: str) -> dict[str, Any]:
        self.calls.append(("orphan", who.name, gid, action, why))
        if action == "rollback":
            raise ConsoleRefused(f"{gid} belongs to another node or application: nsjms never touches it")
        return {"gid": gid, "gtrid": "gone:1", "action": action, "heuristic": True}

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

    def broker_dead_letters(self, queue: str, scan: int = 1000) -> dict[str, Any]:
        rows = [{"id": f"ID:b-{i}:1", "queue": queue, "reason": f"expired {i}", "origin": "message", "bridge": 5,
                 "source": "/queue/in", "at": 0.0, "size": 4, "preview": "late", "headers": {"mark": "x"},
                 "retry_to": "/queue/in", "retry": "back to /queue/in"}
                for i in range(60 if queue == "nsjms.DLQ" else 0)]
        return {"node": "node1", "queue": queue, "total": min(len(rows), scan), "complete": len(rows) <= scan,
                "offset": 0, "dead_letters": rows[:scan]}

    def broker_dead_letter(self, queue: str, message_id: str) -> dict[str, Any]:
        rows = [r for r in self.broker_dead_letters(queue)["dead_letters"] if r["id"] == message_id]
        if not rows:
            raise ConsoleRefused(f"no message {message_id} on {queue}")
        return rows[0]

    def broker_dead_letter_action(self, who: Principal, queue: str, message_id: str, action: str,
                                  why: str) -> dict[str, Any]:
        self.calls.append(("broker deadletter", who.name, queue, message_id, action, why))
        if message_id == "ID:gone":
            raise ConsoleRefused(f"no message {message_id} on {queue}")
        return {"id": message_id, "queue": queue, "retried": True, "to": "/queue/in"}

    def audit(self, who: str, why: str, action: str, target: str, result: Any) -> None:
        self.audits.append((who, why, action, target, result))

    def channel_create(self, who: Principal, qos: Sequence[str], admin: Sequence[str], why: str) -> dict[str, Any]:
        self.calls.append(("channel create", who.name, tuple(qos), tuple(admin), why))
        if "EventReliability=Persistent" in qos and "ConnectionReliability=Persistent" not in qos:
            raise ConsoleRefused("--qos EventReliability: UNAVAILABLE_VALUE: needs ConnectionReliability=Persistent")
        return {"id": 4}

    def channel_destroy(self, who: Principal, cid: int, why: str) -> dict[str, Any]:
        self.calls.append(("channel destroy", who.name, cid, why))
        return {"id": cid, "destroyed": True}

    def bridge_create(self, who: Principal, spec: BridgeSpec, why: str) -> dict[str, Any]:
        self.calls.append(("bridge create", who.name, spec, why))
        return {"id": 6, "started": spec.start}

    def bridge_transaction(self, who: Principal, bid: int, setting: str, why: str) -> dict[str, Any]:
        self.calls.append(("bridge transaction", who.name, bid, setting, why))
        if bid == 9:
            raise ConsoleRefused("bridge 9 refuses routing transactions (UnsupportedTransaction)")
        return {"id": bid, "transaction": None if setting == "off" else {"events": 5, "timeout_s": 30}}

    def cluster(self) -> dict[str, Any]:
        return {"members": [_member(n) for n in self.members], "error": None}

    def audit_days(self, limit: int) -> dict[str, Any]:
        self.calls.append(("audit days", limit))
        return {"days": [{"day": "2026-12-06", "verdict": "open", "rows": 12, "delivered": 5, "lost": 0,
                          "duplicated": 0, "in_doubt": 1, "in_flight": 0, "dead_letter": 0, "discarded": 0,
                          "expired": 0, "as_of": 0.0, "audited_at": 0.0, "grace_s": 300.0, "recheck_at": None,
                          "ids": []}],
                "bridges": [{"direction": "channel_to_jms", "bridge_id": 5, "delivered": 5, "lost": 0,
                             "duplicated": 0, "in_doubt": 1, "in_flight": 0, "dead_letter": 0, "discarded": 0,
                             "expired": 0}], "totals": {"delivered": 5}, "error": None}


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
    assert resp.status_code == 409 and "no COMMIT is logged" in resp.get_data(as_text=True)
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
    assert s.series() == {"t": [102.0, 104.0], "bridges": {"1": [5.0, 10.0], "2": [None, None]},
                          "total": [5.0, 10.0], "of": 2}
    assert s.series(busiest=1) == {"t": [102.0, 104.0], "bridges": {"1": [5.0, 10.0]}, "total": [5.0, 10.0], "of": 2}


def test_read_operator_log(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_text('{"who": "a"}\nnot json\n{"who": "b"}\n')
    assert [e["who"] for e in read_operator_log(path)] == ["b", "a"]
    assert read_operator_log(tmp_path / "missing") == []


def test_console_configuration() -> None:
    from router.node.config import ConfigError, load_config

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


# --------------------------------------------------------------------------------- actions added for issue 26
def operator_page(env: Any, path: str = "/bridges") -> tuple[FakeBackend, FlaskClient, str]:
    backend, client, secrets = env
    login(client, "operator", secrets["operator"])
    page = client.get(path).get_data(as_text=True)
    return backend, client, page


def test_action_form_checks_reason_and_confirmation_once() -> None:
    from werkzeug.datastructures import MultiDict

    from router.console.app import FormRefused, action_form, selected_ids

    with pytest.raises(FormRefused, match="a reason is required"):
        action_form(MultiDict({"why": "  "}))
    assert action_form(MultiDict({"why": " checked "})) == "checked"
    with pytest.raises(FormRefused, match="confirm by typing the channel id 3"):
        action_form(MultiDict({"why": "w", "confirm_id": "4"}), confirm=("confirm_id", "3", "channel id"))
    assert action_form(MultiDict({"why": "w", "confirm_id": "3"}), confirm=("confirm_id", "3", "channel id")) == "w"
    assert selected_ids(MultiDict([("ids", "5"), ("ids", "2"), ("ids", "5")])) == [5, 2]
    with pytest.raises(FormRefused, match="select at least one"):
        selected_ids(MultiDict())
    with pytest.raises(FormRefused, match="not an id"):
        selected_ids(MultiDict([("ids", "5 OR 1=1")]))
    with pytest.raises(FormRefused, match="at most 500 items"):
        selected_ids(MultiDict([("ids", str(i)) for i in range(501)]))


def test_every_post_route_needs_the_csrf_token_and_the_operator_role(env: Any) -> None:
    backend, client, secrets = env
    login(client, "reader", secrets["reader"])
    token = _csrf(client.get("/bridges").get_data(as_text=True))
    app = client.application
    posts = [r for r in app.url_map.iter_rules() if "POST" in (r.methods or set()) and
             r.endpoint not in ("login_post", "logout")]
    assert {r.endpoint for r in posts} >= {"channel_create", "channel_destroy", "bridge_create", "bridge_action",
                                           "bridge_transaction", "bridges_selected", "transaction_action",
                                           "dead_letter_action", "dead_letters_selected", "orphan_action",
                                           "broker_dead_letter_action", "broker_dead_letters_selected"}
    values = {"cid": 1, "bid": 5, "action": "stop", "gtrid": "node1:abc", "dl_id": 7, "gid": ORPHAN,
              "queue": "nsjms.DLQ"}
    for rule in posts:
        url = rule.build({k: v for k, v in values.items() if k in rule.arguments})[1]
        form = {"why": "x", "confirm_gtrid": "node1:abc", "confirm_id": "1", "ids": "5", "action": "stop",
                "source": "channel:1", "sink": "queue:q", "setting": "5:30"}
        assert client.post(url, data=form).status_code == 403, url                  # no CSRF token
        assert client.post(url, data={**form, "csrf": token}).status_code == 403, url  # a reader
    assert backend.calls == []
    refused = [a for a in backend.audits if a[4] == "refused: needs the operator role"]
    assert len(refused) == len(posts) and {a[0] for a in refused} == {"reader"}


def test_channel_create_and_destroy(env: Any) -> None:
    backend, client, page = operator_page(env, "/channels")
    assert 'id="channel-create"' in page
    token = _csrf(page)
    assert client.post("/channels/create", data={"csrf": token, "qos": "EventReliability=Persistent"}
                       ).status_code == 400                                       # no reason
    qos = "EventReliability=Persistent\r\nConnectionReliability=Persistent"
    resp = client.post("/channels/create", data={"csrf": token, "why": "new feed", "qos": qos,
                                                 "admin": "MaxQueueLength=10"})
    assert resp.status_code == 302 and resp.headers["Location"] == "/channels/4"
    assert backend.calls[-1] == ("channel create", "operator", ("EventReliability=Persistent",
                                 "ConnectionReliability=Persistent"), ("MaxQueueLength=10",), "new feed")
    resp = client.post("/channels/create", data={"csrf": token, "why": "w", "qos": "EventReliability=Persistent"})
    assert resp.status_code == 409 and "refused: --qos EventReliability: UNAVAILABLE_VALUE" in resp.get_data(
        as_text=True)
    channel = client.get("/channels/1").get_data(as_text=True)
    assert 'id="channel-destroy"' in channel and 'id="confirm_id"' in channel
    calls = len(backend.calls)
    assert client.post("/channels/1/destroy", data={"csrf": token, "why": "old", "confirm_id": "2"}
                       ).status_code == 400
    assert client.post("/channels/1/destroy", data={"csrf": token, "confirm_id": "1"}).status_code == 400
    assert len(backend.calls) == calls
    resp = client.post("/channels/1/destroy?format=json", data={"csrf": token, "why": "old", "confirm_id": "1"})
    assert resp.get_json() == {"id": 1, "destroyed": True}
    assert backend.calls[-1] == ("channel destroy", "operator", 1, "old")


def test_bridge_create_and_routing_transactions_on_off(env: Any) -> None:
    backend, client, page = operator_page(env)
    assert 'id="bridge-create"' in page and 'id="bridges-stop"' in page and 'id="select-bridge-5"' in page
    token = _csrf(page)
    form = {"csrf": token, "why": "feed", "source": "channel:1", "sink": "queue:q", "channel_form": "structured",
            "channel_style": "push", "jms_style": "push", "transaction": "5:30", "no_start": "1"}
    resp = client.post("/bridges/create", data=form)
    assert resp.status_code == 302 and resp.headers["Location"] == "/bridges/6"
    assert backend.calls[-1] == ("bridge create", "operator", BridgeSpec("channel:1", "queue:q", start=False,
                                                                         transaction="5:30"), "feed")
    assert client.post("/bridges/create", data={**form, "channel_form": "xml"}).status_code == 400
    detail = client.get("/bridges/5").get_data(as_text=True)
    assert 'id="bridge-t2-on"' in detail and 'id="bridge-t2-off"' not in detail
    resp = client.post("/bridges/5/transaction", data={"csrf": token, "why": "t2", "setting": "5:30"})
    assert resp.status_code == 302 and backend.calls[-1] == ("bridge transaction", "operator", 5, "5:30", "t2")
    resp = client.post("/bridges/5/transaction?format=json", data={"csrf": token, "why": "t2", "setting": "off"})
    assert resp.get_json() == {"id": 5, "transaction": None}
    resp = client.post("/bridges/9/transaction", data={"csrf": token, "why": "t2", "setting": "5"})
    assert resp.status_code == 409 and "UnsupportedTransaction" in resp.get_data(as_text=True)


def test_bridge_page_offers_disable_when_transactions_are_on(env: Any) -> None:
    backend, client, secrets = env
    original = backend.bridges
    backend.bridges = lambda who, ids=None: [  # type: ignore[method-assign]
        {**original(who, ids)[0], "transactions": {"transaction_events": 5}}]
    login(client, "operator", secrets["operator"])
    detail = client.get("/bridges/5").get_data(as_text=True)
    assert 'id="bridge-t2-off"' in detail and 'id="bridge-t2-on"' not in detail and "on: 5 event(s)" in detail
    assert "5 event(s)" in client.get("/bridges").get_data(as_text=True)


def test_heuristic_commit_is_the_clis_commit_heuristic(env: Any) -> None:
    backend, client, page = operator_page(env, "/transactions/node1:abc?confirm=commit")
    assert 'id="heuristic"' in page and "WARNING: no COMMIT is logged (safe action &#39;rollback&#39;)" in page
    assert "commits 1 event(s) to queue:q" in page and '<td id="txn-events">1</td>' in page
    backend_txn = backend.transaction
    backend.transaction = lambda gtrid: {**backend_txn(gtrid), "events": 0, "events_known": False}  # type: ignore[method-assign]
    unknown = client.get("/transactions/node1:abc?confirm=commit").get_data(as_text=True)
    assert "commits ? event(s)" in unknown and '<td id="txn-events">? (a prepared branch' in unknown  # as the CLI
    backend.transaction = backend_txn  # type: ignore[method-assign]
    token = _csrf(page)
    url = "/transactions/node1:abc/commit"
    resp = client.post(url, data={"csrf": token, "why": "checked", "confirm_gtrid": "node1:abc"})
    assert resp.status_code == 409 and "Add --heuristic" in resp.get_data(as_text=True)
    assert backend.calls[-1][3] == "commit"
    resp = client.post(url, data={"csrf": token, "why": "checked", "confirm_gtrid": "node1:abc", "heuristic": "1"})
    assert resp.status_code == 200 and backend.calls[-1] == ("txn", "operator", "node1:abc", "heuristic-commit",
                                                             "checked")
    assert client.post(url, data={"csrf": token, "why": "", "confirm_gtrid": "node1:abc", "heuristic": "1"}
                       ).status_code == 400
    # a logged COMMIT: no heuristic choice offered; rollback ignores the box
    assert 'id="heuristic"' not in client.get("/transactions/node1:logged?confirm=commit").get_data(as_text=True)
    client.post("/transactions/node1:abc/rollback", data={"csrf": token, "why": "w", "confirm_gtrid": "node1:abc",
                                                          "heuristic": "1"})
    assert backend.calls[-1][3] == "rollback"


def test_selected_bridges_and_dead_letters(env: Any) -> None:
    backend, client, page = operator_page(env)
    token = _csrf(page)
    resp = client.post("/bridges/selected", data={"csrf": token, "why": "window", "action": "stop",
                                                  "ids": ["5", "8"]})
    html = resp.get_data(as_text=True)
    assert resp.status_code == 200 and "1 of 2 refused" in html and "refused: no bridge with id 8" in html
    assert backend.calls[-2:] == [("bridge", "operator", 5, "stop", "window"), ("bridge", "operator", 8, "stop",
                                                                                 "window")]
    calls = len(backend.calls)
    assert client.post("/bridges/selected", data={"csrf": token, "why": "w", "action": "stop"}).status_code == 400
    assert client.post("/bridges/selected", data={"csrf": token, "action": "stop", "ids": "5"}).status_code == 400
    assert client.post("/bridges/selected", data={"csrf": token, "why": "w", "action": "explode", "ids": "5"}
                       ).status_code == 400
    assert len(backend.calls) == calls
    listing = client.get("/deadletters").get_data(as_text=True)
    assert 'id="select-dl-7"' in listing and 'id="deadletters-retry"' in listing
    resp = client.post("/deadletters/selected?format=json", data={"csrf": token, "why": "fixed", "action": "retry",
                                                                  "ids": ["7"]})
    assert resp.get_json() == {"results": [{"id": 7, "ok": True, "result": {"id": 7, "retried": True}}]}
    assert backend.calls[-1] == ("deadletter", "operator", 7, "retry", "fixed")


def test_reader_sees_no_action_forms(env: Any) -> None:
    _, client, secrets = env
    login(client, "reader", secrets["reader"])
    for path, ids in (("/channels", ("channel-create",)), ("/channels/1", ("channel-destroy", "confirm_id")),
                      ("/bridges", ("bridge-create", "bridges-selected", "select-bridge-5")),
                      ("/bridges/5", ("bridge-t2-on", "bridge-t2-off")),
                      ("/deadletters", ("deadletters-selected", "select-dl-7")),
                      ("/transactions/node1:abc?confirm=commit", ("heuristic",))):
        page = client.get(path).get_data(as_text=True)
        for element in ids:
            assert f'id="{element}"' not in page, (path, element)


def test_audit_days_page(env: Any) -> None:
    backend, client, secrets = env
    login(client, "reader", secrets["reader"])
    page = client.get("/audit/days").get_data(as_text=True)
    assert "2026-12-06" in page and "<strong>open</strong>" in page and 'href="/bridges/5"' in page
    assert client.get("/audit/days?format=json&days=9999").get_json()["days"][0]["verdict"] == "open"
    assert backend.calls[-1] == ("audit days", 366)


def test_audit_days_view_sums_the_stored_verdicts() -> None:
    from datetime import UTC, date, datetime

    from audit.incremental import DayResult, Group, StoredDay
    from router.console.backend import audit_days_view

    t = datetime(2026, 12, 6, 10, tzinfo=UTC)
    d1 = DayResult(date(2026, 12, 6), "fail", (Group("channel_to_jms", 5, "n1", "delivered", 7, t, None),
                                               Group("channel_to_jms", 5, "n1", "lost", 1, t, None, ("d-1",))),
                   False, 9, None)
    d2 = DayResult(date(2026, 12, 5), "pass", (Group("channel_to_jms", 5, "-", "delivered", 3, t, None),
                                               Group("jms_to_channel", None, "-", "delivered", 2, t, None)),
                   False, 5, None)
    view = audit_days_view([StoredDay(d1, t, t, 300.0), StoredDay(d2, t, t, 300.0)])
    assert [(d["day"], d["verdict"], d["delivered"], d["lost"], d["ids"]) for d in view["days"]] == [
        ("2026-12-06", "fail", 7, 1, ["d-1"]), ("2026-12-05", "pass", 5, 0, [])]
    assert [(b["direction"], b["bridge_id"], b["delivered"], b["lost"]) for b in view["bridges"]] == [
        ("channel_to_jms", 5, 10, 1), ("jms_to_channel", None, 2, 0)]
    assert view["totals"]["delivered"] == 12 and audit_days_view([])["days"] == []


def test_orphaned_branch_decided_with_the_clis_rules_and_words(env: Any) -> None:
    """``nsjms txn commit|rollback --xid GID`` from the routing-transactions page: operator role, typed GID, reason;
    the CLI's summary shown before it; the node's refusal in its words (it was listed, not actionable)."""
    from router.cli.txn import orphan_summary

    backend, client, secrets = env
    login(client, "reader", secrets["reader"])
    listing = client.get("/transactions").get_data(as_text=True)
    assert f'href="/orphans/{ORPHAN}"' in listing
    page = client.get(f"/orphans/{ORPHAN}?confirm=commit").get_data(as_text=True)
    assert "names no transaction" in page and "confirm_gid" not in page and "ask-commit" not in page
    token = _csrf(page)
    assert client.post(f"/orphans/{ORPHAN}/commit", data={"csrf": token, "why": "x",
                                                          "confirm_gid": ORPHAN}).status_code == 403
    client.post("/logout", data={"csrf": token})
    login(client, "operator", secrets["operator"])
    page = client.get(f"/orphans/{ORPHAN}").get_data(as_text=True)
    assert 'id="ask-commit"' in page and 'id="ask-rollback"' in page and "heuristic" not in page.lower()
    page = client.get(f"/orphans/{ORPHAN}?confirm=commit").get_data(as_text=True)
    assert orphan_summary(ORPHAN) in page
    token = _csrf(page)
    url = f"/orphans/{ORPHAN}/commit"
    assert client.post(url, data={"csrf": token, "confirm_gid": ORPHAN}).status_code == 400          # no reason
    assert client.post(url, data={"csrf": token, "why": "x", "confirm_gid": "other"}).status_code == 400
    assert backend.calls == []
    resp = client.post(url + "?format=json", data={"csrf": token, "why": "checked: rows unknown",
                                                    "confirm_gid": ORPHAN})
    assert resp.status_code == 200 and resp.get_json()["heuristic"] is True
    resp = client.post(f"/orphans/{ORPHAN}/rollback", data={"csrf": token, "why": "y", "confirm_gid": ORPHAN})
    assert resp.status_code == 409 and "nsjms never touches it" in resp.get_data(as_text=True)
    assert backend.calls == [("orphan", "operator", ORPHAN, "commit", "checked: rows unknown"),
                             ("orphan", "operator", ORPHAN, "rollback", "y")]
    assert client.post(f"/orphans/{ORPHAN}/forget", data={"csrf": token, "why": "y",
                                                          "confirm_gid": ORPHAN}).status_code == 404
    assert client.get("/orphans/nope").status_code == 404


def test_lists_stay_the_same_size_with_many_bridges(env: Any) -> None:
    """1,000 bridges: /bridges asks the node about its page's bridges only (it asked about every bridge), a bridge's
    page about that bridge; the overview lists 50 (those not active first) and says so; the chart's data has the
    busiest bridges and the total, not a line per bridge."""
    backend, client, secrets = env
    backend.bridge_ids = list(range(1000))
    login(client, "reader", secrets["reader"])
    page = client.get("/bridges?page=3").get_data(as_text=True)
    assert backend.asked == [list(range(100, 150))]
    assert "showing 50 of 1000 item(s), page 3 of 20" in page and "bridge 149<" in page and "bridge 150<" not in page
    data = client.get("/bridges?sort=forwarded&desc=1&per_page=500&format=json").get_json()
    assert [r["id"] for r in data["rows"]] == list(range(999, 499, -1)) and data["total"] == 1000
    assert backend.asked[-1] == list(range(999, 499, -1))
    assert client.get("/bridges/7").status_code == 200 and backend.asked[-1] == [7]
    assert client.get("/bridges/1000").status_code == 404
    assert "X-Nsjms-Node-Calls" in client.get("/bridges").headers


def test_overview_is_a_summary(env: Any) -> None:
    backend, client, secrets = env
    snap = backend.snapshot()
    many = [{"id": i, "source": "channel:1", "sink": f"queue:q{i}", "state": "active" if i % 10 else "inactive",
             "reason": None if i % 10 else "stopped", "last_error": None if i % 10 else "refused", "forwarded": i}
            for i in range(1000)]
    backend.snapshot = lambda: {**snap, "bridges": many}                  # type: ignore[method-assign]
    login(client, "reader", secrets["reader"])
    data = client.get("/?format=json").get_json()
    assert data["bridges_total"] == 1000 and len(data["bridges"]) == 50 and data["errors_total"] == 100
    assert [b["id"] for b in data["bridges"]] == list(range(0, 500, 10))    # those not active first
    assert len(data["errors"]) == 50
    page = client.get("/").get_data(as_text=True)
    assert "showing 50 of 1000 bridges" in page and "showing 50 of 100" in page
    assert client.get("/rates").get_json() == {"t": [], "bridges": {}, "total": [], "of": 0}   # no samples yet


def test_rate_series_computed_once_per_sample() -> None:
    snaps = iter([{"bridges": [{"id": 1, "forwarded": n}]} for n in (0, 10, 30)])
    s = RateSampler(lambda: next(snaps), interval_s=2)
    s.sample(now=100.0)
    s.sample(now=102.0)
    first = s.series(busiest=10)
    assert s.series(busiest=10) is first and s.series() is not first
    s.sample(now=104.0)
    assert s.series(busiest=10)["t"] == [102.0, 104.0]


def test_overview_shows_the_cluster_members_or_one_line_for_one(env: Any) -> None:
    backend, client, secrets = env
    login(client, "reader", secrets["reader"])
    page = client.get("/").get_data(as_text=True)
    assert "One node in the cluster: node1 (live, epoch 3)" in page and "cluster-members" not in page
    backend.members = ["node1", "node2"]
    page = client.get("/").get_data(as_text=True)
    assert 'id="cluster-members"' in page and "cluster-one" not in page
    assert "node2:2809" in page and "<td>1 / 0</td>" in page
    assert [m["node_id"] for m in client.get("/?format=json").get_json()["cluster"]["members"]] == ["node1", "node2"]
