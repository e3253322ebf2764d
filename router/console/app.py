"""The console's Flask application: login, sessions, CSRF, secure headers, pages and their JSON.

* **Login** with a principal of the node (router/security/auth.py): name plus the secret of its token ``NAME:SECRET``
  (``<state-dir>/credentials/NAME.token``), checked by :class:`router.security.auth.Authenticator` (the same table the
  IIOP interceptor uses; a rotated secret stops working at once). Failed and successful logins go to the operator log
  (name only, never the secret).
* **Sessions** live in the server (:class:`Sessions`): the cookie holds only a random id (HttpOnly,
  SameSite=Strict, Secure under TLS). A session ends after ``idle_s`` without a request, after ``max_s`` in any
  case, at logout, and when its principal's role changes or is removed.
* **CSRF**: every POST carries the session's token (hidden field ``csrf``, compared in constant time); the login
  form a double-submit token of its own. A POST without it is refused (403) before anything runs.
* **Roles**: a reader sees everything and has no write buttons; every write route needs the operator role (403).
* **Actions**: every one needs a reason (recorded in the operator log with the principal), destructive ones a typed
  confirmation, both checked once (:func:`action_form`) before the backend runs the CLI's operation; a refusal of the
  node (its CORBA exceptions included: a quota's ``IMP_LIMIT``, ``NO_PERMISSION``, a spec's user exception) is a 409
  with the CLI's words, a node that does not answer a 503 with the CLI's "node not reachable"; both are logged.
  A selection (several bridges or dead letters) runs the same operation per item.
* **Headers**: a CSP without inline scripts or styles, ``X-Frame-Options: DENY``, ``nosniff``, no referrer,
  ``Cache-Control: no-store`` on everything except the vendored static files.

Every page answers ``?format=json`` with the data it renders.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from flask import Flask, Response, abort, g, jsonify, redirect, render_template, request, url_for

from router.console import calls as node_calls
from router.console import sublists
from router.console.auditruns import AuditRefused, AuditRuns, WindowRefused, nsjms_audit_command, parse_window
from router.console.backend import (
    BRIDGE_ACTIONS,
    DEAD_LETTER_ACTIONS,
    ORPHAN_ACTIONS,
    TXN_ACTIONS,
    Backend,
    BridgeSpec,
    ConsoleRefused,
    NodeRefused,
    NodeUnavailable,
)
from router.console.views import CHART_BRIDGES, MAX_PER_PAGE, Page, RateSampler, paginate, read_operator_log
from router.routing.t2.ops import AUDIT_FILE, HEURISTIC_COMMIT
from router.security.auth import Authenticator, Principal, Role

__all__ = ["COOKIE", "LoginThrottle", "Session", "Sessions", "create_app"]

log = logging.getLogger("nsjms.console")

COOKIE = "nsjms_console"
LOGIN_COOKIE = "nsjms_login"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


class FormRefused(Exception):
    """A POST lacks what every action needs (its reason, its confirmation): 400, nothing done."""


def action_form(form: Any, *, confirm: tuple[str, str, str] | None = None) -> str:
    """The reason every action needs, and for ``confirm`` = (field, expected value, what it names) the typed
    confirmation; returns the reason or raises :class:`FormRefused` naming what is missing."""
    why = str(form.get("why", "")).strip()
    if not why:
        raise FormRefused("a reason is required (it is recorded in the operator log)")
    if confirm is not None:
        field, expected, what = confirm
        if str(form.get(field, "")).strip() != expected:
            raise FormRefused(f"confirm by typing the {what} {expected}")
    return why


class NoSuchItem(Exception):
    """The item a page names does not exist (the backend's refusal to find it): 404."""


def refusal_text(exc: ConsoleRefused) -> str:
    """A refusal as the page shows it and the log records it: the CLI's words, starting with "refused" (or the
    CLI's "node not reachable")."""
    return str(exc) if str(exc).startswith(("refused", "node not")) else f"refused: {exc}"


@dataclass(frozen=True)
class Selection:
    """A list whose ticked items can be acted on together: its item's name, the actions a selection may take (and
    how a refusal names them), and the one item's operation (the same the item's own page calls)."""

    kind: str
    actions: tuple[str, ...]
    verbs: str
    act: Callable[[Principal, int, str, str], dict[str, Any]]


MAX_SELECTED = MAX_PER_PAGE    # a selection is at most one page of a list
OPERATOR_LOG_ROWS = 10_000    # the newest entries of the operator log the page pages, sorts and filters
OVERVIEW_ROWS = 50             # bridges (and their errors) the overview lists: a summary, the rest on /bridges


def selected_ids(form: Any) -> list[int]:
    """The ids ticked in a list (``ids`` repeated), in order, without repeats; FormRefused when none or not ids."""
    ids: list[int] = []
    for text in form.getlist("ids"):
        if not str(text).isdigit():
            raise FormRefused(f"not an id: {text!r}")
        if int(text) not in ids:
            ids.append(int(text))
    if not ids:
        raise FormRefused("select at least one item")
    if len(ids) > MAX_SELECTED:
        raise FormRefused(f"at most {MAX_SELECTED} items at once (a page of the list), not {len(ids)}")
    return ids


@dataclass(frozen=True)
class Session:
    principal: Principal
    csrf: str
    created: float
    seen: float


class LoginThrottle:
    """At most ``limit`` failed sign-ins per ``window_s`` (for the whole console): beyond that, sign-ins are refused
    (429) without checking or logging each one, so a flood can neither guess secrets nor fill the operator log."""

    def __init__(self, limit: int = 20, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window_s, self.clock = limit, window_s, clock
        self._lock = threading.Lock()
        self._failures: list[float] = []

    def blocked(self) -> bool:
        now = self.clock()
        with self._lock:
            self._failures = [t for t in self._failures if now - t < self.window_s]
            return len(self._failures) >= self.limit

    def failed(self) -> None:
        with self._lock:
            self._failures.append(self.clock())


class Sessions:
    """Server-side sessions keyed by a random id; expired ones are dropped when looked up or swept."""

    def __init__(self, idle_s: float, max_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s, self.max_s, self.clock = idle_s, max_s, clock
        self._lock = threading.Lock()
        self._by_id: dict[str, Session] = {}

    def open(self, principal: Principal) -> tuple[str, Session]:
        now = self.clock()
        sid, session = secrets.token_urlsafe(32), Session(principal, secrets.token_urlsafe(32), now, now)
        with self._lock:
            self._sweep(now)
            self._by_id[sid] = session
        return sid, session

    def get(self, sid: str) -> Session | None:
        now = self.clock()
        with self._lock:
            session = self._by_id.get(sid)
            if session is None:
                return None
            if now - session.seen > self.idle_s or now - session.created > self.max_s:
                del self._by_id[sid]
                return None
            session = self._by_id[sid] = replace(session, seen=now)
            return session

    def close(self, sid: str) -> None:
        with self._lock:
            self._by_id.pop(sid, None)

    def _sweep(self, now: float) -> None:
        for sid, s in list(self._by_id.items()):
            if now - s.seen > self.idle_s or now - s.created > self.max_s:
                del self._by_id[sid]


def _fmt_time(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(value)) + "Z"


def _fmt_age(value: Any) -> str:
    from router.node.status import _age

    return "-" if not isinstance(value, (int, float)) else _age(float(value))


def create_app(backend: Backend, *, secure_cookies: bool = False, idle_s: float = 1800.0, max_s: float = 8 * 3600.0,
               sampler: RateSampler | None = None, audit_runs: AuditRuns | None = None) -> Flask:
    app = Flask("router.console", template_folder=str(Path(__file__).parent / "templates"),
                static_folder=str(Path(__file__).parent / "static"))
    app.config.update(MAX_CONTENT_LENGTH=64 * 1024, SEND_FILE_MAX_AGE_DEFAULT=3600)
    from router.cli.channel import format_value

    app.jinja_env.filters.update(utc=_fmt_time, age=_fmt_age, prop=lambda v, k: format_value(k, v))
    sublists.install(app)                      # the lists inside an item's page, paged (router/console/sublists.py)
    auth = Authenticator(backend.state_dir)
    sessions = Sessions(idle_s, max_s)
    throttle = LoginThrottle()
    app.extensions["nsjms_sessions"] = sessions
    runs = audit_runs or AuditRuns(backend.state_dir / "audit", nsjms_audit_command(backend.state_dir))

    # ------------------------------------------------------------------------------------------ plumbing
    def current_session() -> Session | None:
        sid = request.cookies.get(COOKIE, "")
        session = sessions.get(sid) if sid else None
        if session is None:
            return None
        # a rotated or removed principal, or a changed role, ends the session (auth re-reads principals.json)
        table = auth._reload()
        entry = table.get(session.principal.name)
        if entry is None or entry[1] != session.principal.role:
            sessions.close(sid)
            return None
        return session

    @app.before_request
    def authenticate() -> Any:
        node_calls.reset()
        g.session = None
        if request.endpoint in ("static", "login", "login_post"):
            return None
        g.session = current_session()
        if g.session is None:
            if request.args.get("format") == "json" or request.method == "POST":
                return _error(401, "not signed in")
            return redirect(url_for("login", next=request.full_path.rstrip("?")))
        if request.method == "POST":
            token = request.form.get("csrf", "")
            if not hmac.compare_digest(token.encode(), g.session.csrf.encode()):
                return _error(403, "CSRF token missing or wrong: reload the page and try again")
        return None

    @app.after_request
    def headers(resp: Response) -> Response:
        resp.headers.setdefault("Content-Security-Policy", CSP)   # an audit report's own (stricter on scripts)
        resp.headers["X-Frame-Options"] = "DENY"
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"
        resp.headers["Cross-Origin-Opener-Policy"] = "same-origin"
        if request.endpoint != "static":
            resp.headers["Cache-Control"] = "no-store"
        if secure_cookies:
            resp.headers["Strict-Transport-Security"] = "max-age=31536000"
        resp.headers["X-Nsjms-Node-Calls"] = str(node_calls.taken())   # the node calls of a page (router/console/calls)
        return resp

    def _error(status: int, message: str) -> Response:
        if request.args.get("format") == "json" or request.accept_mimetypes.best == "application/json":
            resp = jsonify({"error": message})
        else:
            resp = Response(render_template("error.html", status=status, message=message, session=g.get("session")))
        resp.status_code = status
        return resp

    def who() -> Principal:
        session: Session = g.session
        return session.principal

    def acting(action: str, allowed: tuple[str, ...], confirm: tuple[str, str, str] | None = None) -> str:
        """What every action on one item checks before anything runs: the operator role, an action the item has
        (404 otherwise), the reason and the typed confirmation (:func:`action_form`); returns the reason."""
        require_operator()
        if action not in allowed:
            abort(404)
        return action_form(request.form, confirm=confirm)

    def require_operator() -> None:
        if who().role < Role.OPERATOR:
            backend.audit(who().name, request.form.get("why", ""), f"console {request.path}", "",
                          "refused: needs the operator role")
            abort(403)

    @app.errorhandler(403)
    def forbidden(_exc: Any) -> Response:
        return _error(403, "refused: this needs the operator role")

    @app.errorhandler(404)
    def not_found(_exc: Any) -> Response:
        return _error(404, "no such page")

    @app.errorhandler(NoSuchItem)
    def no_such_item(exc: NoSuchItem) -> Response:
        return _error(404, str(exc))

    @app.errorhandler(FormRefused)
    def bad_form(exc: FormRefused) -> Response:
        return _error(400, str(exc))

    @app.errorhandler(ConsoleRefused)
    def refused(exc: ConsoleRefused) -> Response:
        text = refusal_text(exc)
        session = g.get("session")
        log.warning("console %s %s by %s: %d %s", request.method, request.path,
                    session.principal.name if session else "-", exc.status, text)
        return _error(exc.status, text)

    def done(result: Any, target: str) -> Any:
        """A JSON answer for ``?format=json``, else a redirect to ``target``."""
        return jsonify(result) if request.args.get("format") == "json" else redirect(target)

    def selection(what: Selection) -> Callable[[], Any]:
        """The POST of a list's ticked items (``ids``) and its ``action``: checked once (the operator role, the
        action, the reason, the ids) before anything runs, then the one item's operation per id, in order, each
        recorded by the backend; one refusal stops none of the others. The page lists each one's outcome."""
        def view() -> Any:
            require_operator()
            action = request.form.get("action", "")
            if action not in what.actions:
                raise FormRefused(f"a selection of {what.kind}s can be {what.verbs}, not {action!r}")
            why = action_form(request.form)
            results: list[dict[str, Any]] = []
            for item in selected_ids(request.form):
                try:
                    results.append({"id": item, "ok": True, "result": what.act(who(), item, action, why)})
                except ConsoleRefused as exc:
                    text = refusal_text(exc)
                    log.warning("console %s %s %s by %s: %s", what.kind, action, item, who().name, text)
                    results.append({"id": item, "ok": False, "result": text})
            if request.args.get("format") == "json":
                return jsonify({"results": results})
            return render_template("selected.html", kind=what.kind, action=action, results=results,
                                   session=g.session)
        return view

    for path, endpoint, what in (
            ("/bridges/selected", "bridges_selected",
             Selection("bridge", BRIDGE_ACTIONS, "started, stopped or destroyed", backend.bridge_action)),
            ("/deadletters/selected", "dead_letters_selected",
             Selection("dead letter", DEAD_LETTER_ACTIONS, "retried or discarded", backend.dead_letter_action))):
        app.add_url_rule(path, endpoint, selection(what), methods=["POST"])

    def item(get: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """An item the backend looks up; its "no such" refusal is a 404 (the node's own refusals stay 409/503)."""
        try:
            return get()
        except (NodeRefused, NodeUnavailable):
            raise
        except ConsoleRefused as exc:
            raise NoSuchItem(str(exc)) from exc

    def decided(result: dict[str, Any], action: str, target: str, errors: list[Any]) -> Any:
        """The answer to a decision on one item (a transaction, an orphaned branch, a dead letter)."""
        if request.args.get("format") == "json":
            return jsonify(result)
        return render_template("done.html", action=action, gtrid=target, result=result, session=g.session,
                               errors=errors)

    def page(template: str, data: dict[str, Any], **extra: Any) -> Any:
        if request.args.get("format") == "json":
            return jsonify(data)
        return render_template(template, data=data, session=g.session, operator=who().role >= Role.OPERATOR,
                               **extra)

    def list_args(default_sort: str = "id", newest_first: bool = False) -> dict[str, Any]:
        """A list's paging, sorting and filter from the query; ``newest_first``: descending unless a column was
        chosen (the operator log, the audit reports)."""
        a = request.args
        desc = a.get("desc") == "1" if "sort" in a else newest_first
        return {"q": a.get("q", ""), "sort": a.get("sort", default_sort), "desc": desc,
                "page": _int(a.get("page"), 1), "per_page": _int(a.get("per_page"), 50)}

    # --------------------------------------------------------------------------------------------- login
    @app.get("/login")
    def login() -> Any:
        # one token per browser while it signs in: a second GET (another tab, a favicon redirect) keeps it
        token = request.cookies.get(LOGIN_COOKIE, "")
        if len(token) < 32:
            token = secrets.token_urlsafe(32)
        resp = Response(render_template("login.html", csrf=token, next=request.args.get("next", "/"),
                                        error=None, session=None))
        resp.set_cookie(LOGIN_COOKIE, token, max_age=600, httponly=True, samesite="Strict", secure=secure_cookies,
                        path="/login")
        return resp

    @app.post("/login")
    def login_post() -> Any:
        cookie, field = request.cookies.get(LOGIN_COOKIE, ""), request.form.get("csrf", "")
        if not cookie or not hmac.compare_digest(cookie.encode(), field.encode()):
            return _error(403, "CSRF token missing or wrong: reload the login page")
        if throttle.blocked():
            return _error(429, "too many failed sign-ins: wait a minute")
        name, secret = request.form.get("name", "").strip(), request.form.get("secret", "").strip()
        principal = auth.authenticate(f"{name}:{secret}") if name and secret else None
        if principal is None:
            throttle.failed()
        backend.audit(name[:64], "", "console login", request.remote_addr or "",
                      "ok" if principal else "refused: unknown name or wrong secret")
        if principal is None:
            refused = Response(render_template("login.html", csrf=field, next=request.form.get("next", "/"),
                                               error="unknown name or wrong secret", session=None))
            refused.status_code = 401
            return refused
        sid, _ = sessions.open(principal)
        target = request.form.get("next", "/")
        if not target.startswith("/") or target.startswith("//") or "\\" in target:
            target = "/"  # never an open redirect
        resp: Any = redirect(target)
        resp.set_cookie(COOKIE, sid, httponly=True, samesite="Strict", secure=secure_cookies, path="/")
        resp.delete_cookie(LOGIN_COOKIE, path="/login")
        return resp

    @app.post("/logout")
    def logout() -> Any:
        backend.audit(who().name, "", "console logout", "", "ok")
        sessions.close(request.cookies.get(COOKIE, ""))
        resp: Any = redirect(url_for("login"))
        resp.delete_cookie(COOKIE, path="/")
        return resp

    # --------------------------------------------------------------------------------------------- pages
    @app.get("/")
    def overview() -> Any:
        snap, ep = backend.snapshot(), backend.endpoints()
        channels = snap.get("channels", [])
        depth = sum(int(p.get("queued", 0)) for c in channels for p in c.get("proxy_suppliers", []))
        age = time.time() - float(snap["time"]) if snap.get("time") else None
        from router.bridge.states import bridge_state

        every = snap.get("bridges", [])
        # a summary: the bridges not active first, then by id, at most OVERVIEW_ROWS (the rest on /bridges)
        shown = sorted(every, key=lambda b: (b.get("state") == "active", int(b["id"])))[:OVERVIEW_ROWS]
        bridges = [{**b, "state_text": bridge_state(b)} for b in shown]
        errors = [b for b in every if b.get("last_error") and b.get("state") != "active"]
        data = {"node": {"id": ep.get("node_id") or snap.get("node_id"), "pid": ep.get("pid"),
                         "factory": (ep.get("event_channel_factory") or {}).get("corbaloc"),
                         "postgres": ep.get("postgres_dsn"), "broker": ep.get("broker_url")},
                "snapshot_age_s": age, "services": snap.get("services", {}),
                "transactions": snap.get("transactions", {}), "store": snap.get("store", {}),
                "channels": len(channels), "queued": depth,
                "events_held": sum(int(c.get("events_held") or 0) for c in channels),
                "bridges": bridges, "bridges_total": len(every),
                "errors": errors[:OVERVIEW_ROWS], "errors_total": len(errors), "rates": rates(),
                "cluster": backend.cluster()}
        return page("overview.html", data)

    def rates() -> dict[str, Any]:
        if sampler is None:
            return {"t": [], "bridges": {}, "total": [], "of": 0}
        return sampler.series(busiest=CHART_BRIDGES)

    @app.get("/rates")
    def rates_json() -> Any:
        """The overview chart's data (refreshed every 5 s by the page): the busiest bridges and the total; with
        ``bridge=ID`` that bridge's line only (its page's chart)."""
        bid = request.args.get("bridge", "")
        if bid.isdigit():
            return jsonify(sampler.series_of(int(bid)) if sampler is not None else rates())
        return jsonify(rates())

    @app.get("/channels")
    def channels() -> Any:
        rows = backend.channels(who())
        p = paginate(rows, fields=("id", "events_held", "proxy_suppliers", "queued"), **list_args())
        return page("channels.html", p.as_dict())

    @app.get("/channels/<int:cid>")
    def channel(cid: int) -> Any:
        data = item(lambda: backend.channel(who(), cid))
        return page("channel.html", data, subs=sublists.channel_subs(data, request.args))

    @app.post("/channels/create")
    def channel_create() -> Any:
        require_operator()
        why = action_form(request.form)
        qos, admin = request.form.get("qos", "").split(), request.form.get("admin", "").split()
        result = backend.channel_create(who(), qos, admin, why)
        return done(result, url_for("channel", cid=int(result["id"])))

    @app.post("/channels/<int:cid>/destroy")
    def channel_destroy(cid: int) -> Any:
        require_operator()
        why = action_form(request.form, confirm=("confirm_id", str(cid), "channel id"))
        return done(backend.channel_destroy(who(), cid, why), url_for("channels"))

    @app.get("/bridges")
    def bridges() -> Any:
        # filtered and sorted by the node's bridge ids and its status snapshot; only the page's rows are asked of
        # the node (what `nsjms bridge list` asks about each bridge), so a page costs the same with 10 or 1,000
        index = backend.bridge_index(who())
        p = paginate(index, fields=("id", "source", "sink", "state", "reason", "last_error"), **list_args())
        live = {int(r["id"]): r for r in backend.bridges(who(), [int(r["id"]) for r in p.rows])}
        rows = [live[int(r["id"])] for r in p.rows if int(r["id"]) in live]     # not those destroyed meanwhile
        return page("bridges.html", {**p.as_dict(), "rows": rows})

    @app.get("/bridges/<int:bid>")
    def bridge(bid: int) -> Any:
        row = next(iter(backend.bridges(who(), [bid])), None)
        if row is None:
            return _error(404, f"no bridge with id {bid}")
        return page("bridge.html", row, actions=BRIDGE_ACTIONS)

    @app.post("/bridges/<int:bid>/<action>")
    def bridge_action(bid: int, action: str) -> Any:
        why = acting(action, BRIDGE_ACTIONS)
        result = backend.bridge_action(who(), bid, action, why)
        return done(result, url_for("bridges") if action == "destroy" else url_for("bridge", bid=bid))

    @app.post("/bridges/<int:bid>/transaction")
    def bridge_transaction(bid: int) -> Any:
        require_operator()
        why = action_form(request.form)
        return done(backend.bridge_transaction(who(), bid, request.form.get("setting", ""), why),
                    url_for("bridge", bid=bid))

    @app.post("/bridges/create")
    def bridge_create() -> Any:
        require_operator()
        why = action_form(request.form)
        f = request.form
        spec = BridgeSpec(f.get("source", ""), f.get("sink", ""), f.get("channel_form", "structured"),
                          f.get("channel_style", "push"), f.get("jms_style", "push"), f.get("factory", ""),
                          f.get("no_start") != "1", f.get("transaction", ""))
        for name, value, allowed in (("channel_form", spec.channel_form, ("structured", "sequence")),
                                     ("channel_style", spec.channel_style, ("push", "pull")),
                                     ("jms_style", spec.jms_style, ("push", "pull"))):
            if value not in allowed:
                raise FormRefused(f"{name}: {value!r} is not one of {', '.join(allowed)}")
        result = backend.bridge_create(who(), spec, why)
        return done(result, url_for("bridge", bid=int(result["id"])))

    @app.get("/transactions")
    def transactions() -> Any:
        listing = backend.transactions()
        txns = listing["transactions"]
        if request.args.get("in_doubt") == "1":
            txns = [t for t in txns if t["in_doubt"]]
        p = paginate(txns, fields=("gtrid", "status", "decision", "action", "reason"), **list_args("age_s"))
        return page("transactions.html", {**listing, "page": p.as_dict()},
                    orphans=sublists.orphan_page(listing["orphans"], request.args))

    @app.get("/transactions/<path:gtrid>")
    def transaction(gtrid: str) -> Any:
        view = item(lambda: backend.transaction(gtrid))
        confirm = request.args.get("confirm", "")
        from router.cli.txn import heuristic_warning

        return page("transaction.html", view, actions=TXN_ACTIONS, confirm=confirm if confirm in TXN_ACTIONS else "",
                    subs=sublists.transaction_subs(view, request.args),
                    heuristic_warning=heuristic_warning(view) if view.get("decision") is None else "")

    @app.post("/transactions/<path:gtrid>/<action>")
    def transaction_action(gtrid: str, action: str) -> Any:
        why = acting(action, TXN_ACTIONS, confirm=("confirm_gtrid", gtrid, "transaction id"))
        if action == "commit" and request.form.get("heuristic") == "1":
            action = HEURISTIC_COMMIT            # `nsjms txn commit --heuristic`: the same refusals and words
        result = backend.txn_action(who(), gtrid, action, why)
        return decided(result, action, gtrid, list(result.get("errors") or []))

    @app.get("/orphans/<path:gid>")
    def orphan(gid: str) -> Any:
        """One orphaned prepared branch of the listing, and (``?confirm=commit|rollback``) the confirmation of
        ``nsjms txn commit|rollback --xid GID`` with the CLI's summary."""
        found = [o for o in backend.transactions()["orphans"] if o["gid"] == gid]
        if not found:
            return _error(404, f"no orphaned prepared branch with GID {gid!r} (it may have been decided)")
        confirm = request.args.get("confirm", "")
        from router.cli.txn import orphan_summary

        return page("orphan.html", found[0], actions=ORPHAN_ACTIONS,
                    confirm=confirm if confirm in ORPHAN_ACTIONS else "", summary=orphan_summary(gid))

    @app.post("/orphans/<path:gid>/<action>")
    def orphan_action(gid: str, action: str) -> Any:
        why = acting(action, ORPHAN_ACTIONS, confirm=("confirm_gid", gid, "GID"))
        return decided(backend.orphan_action(who(), gid, action, why), f"{action} orphaned branch", gid, [])

    @app.get("/deadletters")
    def dead_letters() -> Any:
        channel = request.args.get("channel", "")
        listing = backend.dead_letters(int(channel) if channel.isdigit() else None)
        p = paginate(listing["dead_letters"], fields=("id", "channel_id", "event_name", "reason", "exception"),
                     **list_args("dead_at"))
        from router.console.brokerpages import summaries

        return page("deadletters.html", {**listing, "page": p.as_dict(), "broker": summaries(backend)})

    @app.get("/deadletters/<int:dl_id>")
    def dead_letter(dl_id: int) -> Any:
        return page("deadletter.html", item(lambda: backend.dead_letter(dl_id)), actions=DEAD_LETTER_ACTIONS)

    @app.post("/deadletters/<int:dl_id>/<action>")
    def dead_letter_action(dl_id: int, action: str) -> Any:
        why = acting(action, DEAD_LETTER_ACTIONS)
        return decided(backend.dead_letter_action(who(), dl_id, action, why), f"{action} dead letter", str(dl_id),
                       [])

    from router.console import brokerpages  # the broker's dead-letter queues (nsjms deadletter broker)

    brokerpages.install(app, backend, page=page, item=item, acting=acting, require_operator=require_operator,
                        action_form=action_form, who=who, list_args=list_args, refusal_text=refusal_text,
                        form_refused=FormRefused)

    @app.get("/audit")
    def audit() -> Any:
        limit = max(1, min(_int(request.args.get("limit"), OPERATOR_LOG_ROWS), OPERATOR_LOG_ROWS))
        entries = read_operator_log(backend.state_dir / AUDIT_FILE, limit=limit)
        p = paginate(entries, fields=("who", "action", "target", "why", "result", "node"),
                     **list_args("at", newest_first=True))
        return page("audit.html", {**rows_and_page(p, "entries"), "read": len(entries), "limit": limit})

    @app.get("/audit/days")
    def audit_days() -> Any:
        return page("auditdays.html", backend.audit_days(max(1, min(_int(request.args.get("days"), 31), 366))))

    @app.get("/audit/reports")
    def audit_reports() -> Any:
        p = paginate(runs.reports(), fields=("name", "state", "exit", "window"), **list_args("time", newest_first=True))
        return page("auditreports.html", {"directory": str(runs.directory), "running": runs.running(),
                                          **rows_and_page(p, "reports")})

    def known_run(name: str) -> dict[str, Any]:
        found = next((r for r in runs.reports() if r["name"] == name), None)
        if found is None:
            abort(404)
        return found

    @app.get("/audit/reports/<name>")
    def audit_report_run(name: str) -> Any:
        return page("auditrun.html", known_run(name))

    @app.get("/audit/reports/<name>/files/<path:file>")
    def audit_report_file(name: str, file: str) -> Any:
        """A file of a report's listing (report.html, plots/*.png, summary.json); nothing else is reachable."""
        path = runs.files(name).get(file)
        if path is None:
            abort(404)
        import mimetypes

        resp = Response(path.read_bytes(), mimetype=mimetypes.guess_type(path.name)[0] or "application/octet-stream")
        if path.suffix == ".html":   # the report's own inline style; still no script, no request elsewhere
            resp.headers["Content-Security-Policy"] = ("default-src 'none'; img-src 'self' data:; "
                                                       "style-src 'unsafe-inline'; frame-ancestors 'none'")
        return resp

    @app.post("/audit/reports/start")
    def audit_start() -> Any:
        require_operator()
        why = action_form(request.form)
        try:       # parsed here (never evaluated), passed as the command's own argv items (never a shell)
            window = parse_window(request.form.get("from", ""), request.form.get("to", ""))
        except WindowRefused as exc:
            raise FormRefused(str(exc)) from exc
        shown = " ".join(window.argv()) or "the whole ledger"
        try:
            name = runs.start(window)
        except AuditRefused as exc:
            backend.audit(who().name, why, "console audit start", "", f"refused: {exc} ({shown})")
            raise ConsoleRefused(f"refused: {exc}") from exc
        backend.audit(who().name, why, "console audit start", name, f"started ({shown})")
        log.info("console audit run %s (%s) started by %s", name, shown, who().name)
        return done({"name": name, "state": "running", "window": window.as_dict()},
                    url_for("audit_report_run", name=name))

    return app


def rows_and_page(p: Page, key: str) -> dict[str, Any]:
    """A page's rows under ``key`` and its paging (total, page, pages, per_page, sort, desc, q) under "page"."""
    return {key: p.rows, "page": {k: v for k, v in p.as_dict().items() if k != "rows"}}


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def quote_gtrid(gtrid: str) -> str:
    return quote(gtrid, safe="")
