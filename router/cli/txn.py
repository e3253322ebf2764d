"""``nsjms txn``: inspect and resolve the node's routing transactions (T2), with the router running or stopped.

The mode follows the state directory's lock (``router.node.lifecycle.StateLock``), never a file that may be stale:

* Router running (the lock is held): every subcommand asks the router over IIOP (``NsjmsAdmin::TransactionAdmin``,
  ``router.routing.t2.admin``, found through ``endpoints.json``), so it never races the router's recovery.
* Router stopped (the lock is free; an ``endpoints.json`` a killed node left is ignored): the command takes the
  lock itself (the router cannot start meanwhile, and two commands cannot act at once), reads the recovery log,
  PostgreSQL's prepared transactions and the outbox/inbox directly (``router.routing.t2.ops``) and acts through the same
  recovery manager the router uses. Nothing is deciding then, so recovery's in-flight guard is 0.

Offline on the embedded defaults, the node's PostgreSQL cluster is used when it still runs, else started for the
command and stopped after (:func:`offline_database`; read-only sessions for ``list``/``show``), and re-sends go to
``broker.url`` or to the embedded broker a killed node left running (:class:`OfflineBroker`); with no broker in
reach a re-send is advised as ``start-node`` and a commit refused before anything is touched.

``commit``/``rollback`` show the transaction and its safe action and ask for confirmation on a terminal (``--yes``
for scripts; without a terminal and without ``--yes`` nothing is done). A decision logged the other way is refused
with the reason (exit 4); so is a commit of a transaction with no decision logged unless ``--heuristic`` is given
(the refusal names the events at stake), and a rollback after a heuristic commit. Refusals come from the backend
(``router.routing.t2.ops``), which writes every request to the operator log. Exit codes are those of ``router.cli``.
"""

from __future__ import annotations

import argparse
import getpass
import json
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

__all__ = ["add_parser", "heuristic_warning", "render_list", "render_show", "run"]

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG, EXIT_NOT_RUNNING, EXIT_REFUSED, EXIT_LOCKED = 0, 1, 2, 3, 4, 5


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    txn = sub.add_parser("txn", parents=[common],
                         help="inspect and resolve routing transactions (in doubt, heuristic, orphaned), router "
                              "running or stopped")
    tsub = txn.add_subparsers(dest="txn_command", required=True, metavar="{list,show,commit,rollback,forget,recover}")
    ls = tsub.add_parser("list", parents=[common], help="every pending transaction with its safe action, then orphans")
    ls.add_argument("--in-doubt", action="store_true", help="only those waiting for recovery or an operator")
    ls.add_argument("--older-than", default=None, metavar="DURATION",
                    help="only those older than DURATION (90s, 15m, 2h, 1d)")
    show = tsub.add_parser("show", parents=[common], help="one transaction: participants, outbox/inbox rows, "
                                                          "heuristic outcomes, safe action")
    show.add_argument("gtrid", metavar="GTRID")
    for action, text in (("commit", "commit a transaction (refused if ROLLBACK is logged)"),
                         ("rollback", "roll back a transaction (refused if COMMIT is logged)")):
        p = tsub.add_parser(action, parents=[common], help=text)
        p.add_argument("gtrid", metavar="GTRID", nargs="?", default=None)
        p.add_argument("--xid", default=None, metavar="GID",
                       help="act on ONE orphaned prepared branch by its PostgreSQL GID (pg_prepared_xacts.gid) "
                            "instead of a transaction")
        p.add_argument("--why", default=None, help="why (recorded with the decision; asked for on a terminal)")
        p.add_argument("--who", default=None, help="who decides, offline only (default: USER@HOST); with the node "
                       "running, the operator log records the authenticated principal (docs/security.md)")
        p.add_argument("--yes", action="store_true", help="do not ask for confirmation (scripts)")
        if action == "commit":
            p.add_argument("--heuristic", action="store_true",
                           help="commit a transaction that has no COMMIT logged (its coordinator never decided): "
                                "a HEURISTIC decision, refused without this flag; its outbox rows are re-sent")
    forget = tsub.add_parser("forget", parents=[common],
                             help="drop a heuristic outcome once the data is checked (refused while a branch is "
                                  "prepared or a re-send is due)")
    forget.add_argument("gtrid", metavar="GTRID")
    forget.add_argument("--who", default=None, help="who (default: USER@HOST)")
    forget.add_argument("--yes", action="store_true", help="do not ask for confirmation (scripts)")
    tsub.add_parser("recover", parents=[common], help="run one recovery pass now (what the router does every 5 s)")


# ------------------------------------------------------------------------------------------------- backends
class Backend(Protocol):
    mode: str

    def listing(self) -> dict[str, Any]: ...

    def show(self, gtrid: str) -> dict[str, Any]: ...

    def resolve(self, gtrid: str, action: str, who: str, why: str) -> dict[str, Any]: ...

    def resolve_xid(self, gid: str, action: str, who: str, why: str) -> dict[str, Any]: ...

    def forget(self, gtrid: str, who: str) -> dict[str, Any]: ...

    def recover(self) -> dict[str, Any]: ...


class Refusal(Exception):
    """Raised by a backend: the request is refused (exit 4)."""


class Unavailable(Exception):
    """Raised while choosing a backend: neither mode can be used (the exit code is in ``code``)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Online:
    """Asks the running router (``NsjmsAdmin::TransactionAdmin``)."""

    mode = "online"

    def __init__(self, ref: Any, refused: Any) -> None:
        self._ref, self._refused = ref, refused

    def _ask(self, call: Callable[[], str]) -> dict[str, Any]:
        try:
            result: dict[str, Any] = json.loads(call())
        except self._refused as exc:
            raise Refusal(exc.reason) from None
        return result

    def listing(self) -> dict[str, Any]:
        return self._ask(self._ref.list_json)

    def show(self, gtrid: str) -> dict[str, Any]:
        return self._ask(lambda: self._ref.show_json(gtrid))

    def resolve(self, gtrid: str, action: str, who: str, why: str) -> dict[str, Any]:
        return self._ask(lambda: self._ref.resolve(gtrid, action, who, why))

    def resolve_xid(self, gid: str, action: str, who: str, why: str) -> dict[str, Any]:
        return self._ask(lambda: self._ref.resolve_xid(gid, action, who, why))

    def forget(self, gtrid: str, who: str) -> dict[str, Any]:
        return self._ask(lambda: self._ref.forget(gtrid, who))

    def recover(self) -> dict[str, Any]:
        return self._ask(self._ref.recover)


class Offline:
    """Works on the stopped router's state directory (lock held by the caller)."""

    mode = "offline"

    def __init__(self, ops: Any) -> None:
        self.ops = ops

    def _do(self, call: Callable[[], Any]) -> dict[str, Any]:
        from router.routing.t2.ops import Refused

        try:
            result = call()
        except Refused as exc:
            raise Refusal(str(exc)) from None
        return result if isinstance(result, dict) else dict(result.as_dict())

    def listing(self) -> dict[str, Any]:
        return self._do(self.ops.listing)

    def show(self, gtrid: str) -> dict[str, Any]:
        return self._do(lambda: self.ops.show(gtrid))

    def resolve(self, gtrid: str, action: str, who: str, why: str) -> dict[str, Any]:
        return self._do(lambda: self.ops.resolve(gtrid, action, who, why))

    def resolve_xid(self, gid: str, action: str, who: str, why: str) -> dict[str, Any]:
        return self._do(lambda: self.ops.resolve_xid(gid, action, who, why))

    def forget(self, gtrid: str, who: str) -> dict[str, Any]:
        return self._do(lambda: self.ops.forget(gtrid, who))

    def recover(self) -> dict[str, Any]:
        return self._do(self.ops.recover)


@contextmanager
def backend(cfg: Any, *, write: bool) -> Iterator[Backend]:
    """The online backend when a node holds the state directory's lock, else the offline one (with the lock taken
    here and held throughout, so the router cannot start meanwhile)."""
    from router.node.lifecycle import StateDirLocked, StateLock

    state_dir = Path(cfg.node.state_dir)
    if not state_dir.is_dir():
        raise Unavailable(f"no state directory {state_dir.resolve()}: name the node's with --state-dir", EXIT_CONFIG)
    lock = StateLock(state_dir)
    try:
        lock.acquire()
    except StateDirLocked as exc:
        endpoints = state_dir / "endpoints.json"
        if not endpoints.exists():
            raise Unavailable(f"{exc}; it publishes no endpoints.json yet (starting?): try again in a moment",
                              EXIT_LOCKED) from None
        with _online(endpoints) as online:
            yield online
        return
    try:
        with _offline(cfg, state_dir, write=write) as offline:
            yield offline
    finally:
        lock.release()


@contextmanager
def _online(endpoints: Path) -> Iterator[Backend]:
    from omniORB import CORBA

    from idl.generated import NsjmsAdmin

    data = json.loads(endpoints.read_text())
    if "transaction_admin" not in data:
        raise Unavailable(f"the node running on {endpoints.parent} does not offer TransactionAdmin (an older "
                          "version): stop it to use nsjms txn offline", EXIT_NOT_RUNNING)
    orb = CORBA.ORB_init(["nsjms-txn", "-ORBclientCallTimeOutPeriod", "60000"], CORBA.ORB_ID)
    try:
        ref = orb.string_to_object(data["transaction_admin"]["ior"])._narrow(NsjmsAdmin.TransactionAdmin)
        try:
            yield Online(ref, NsjmsAdmin.TransactionRefused)
        except (CORBA.TRANSIENT, CORBA.COMM_FAILURE, CORBA.OBJECT_NOT_EXIST) as exc:
            raise Unavailable(f"the node running on {endpoints.parent} does not answer ({exc}): it holds the state "
                              "directory's lock, so nothing can be done offline either; is it hung? "
                              "(systemctl status nsjms)", EXIT_NOT_RUNNING) from None
    finally:
        orb.destroy()


@contextmanager
def _offline(cfg: Any, state_dir: Path, *, write: bool) -> Iterator[Backend]:

    from router.mapping.stomp_codec import node_codecs
    from router.routing.t2.ops import TxnOps, connect_rows
    from router.routing.t2.transactions import OutboxResender, outbox_rows
    from xa.log import FileLog, log_path
    from xa.pg import PgManager
    from xa.recovery import RecoveryManager
    from xa.resource import SystemClock
    from xa.xid import NodeId

    node = NodeId(cfg.node.node_id)
    if not log_path(state_dir, node).exists():
        others = sorted(p.name for p in state_dir.glob("xa-*.log"))
        if others:  # a wrong node id would show nothing and treat the real node's branches as foreign
            raise Unavailable(f"no recovery log of node {node} in {state_dir.resolve()}, but {', '.join(others)}: "
                              "set node.node_id (--config FILE, $NSJMS_NODE_NODE_ID) to the node that ran here",
                              EXIT_CONFIG)
    from router.db.conninfo import connect as bounded_connect  # waits bounded on a cut network (issue 31)

    with offline_database(cfg, state_dir, write=write) as dsn:
        log = FileLog(state_dir, node) if write or log_path(state_dir, node).exists() else None
        pg = PgManager(lambda: bounded_connect(dsn, autocommit=True, connect_timeout=5), key="postgresql")
        broker = OfflineBroker(cfg, state_dir)

        def rows_of(gtrid: str) -> Any:
            with bounded_connect(dsn, autocommit=True, connect_timeout=5) as conn:
                return outbox_rows(conn, gtrid)

        recovery = None
        if log is not None:
            resender = OutboxResender(rows_of, broker.transport, codecs=node_codecs())
            recovery = RecoveryManager(node, log, [pg], resender, SystemClock(), in_flight_guard=0.0)
        try:
            yield Offline(TxnOps(node.value, state_dir, log, pg, connect_rows(dsn), recovery, mode="offline",
                                 guard_s=0.0, broker_check=broker.problem))
        finally:
            broker.close()
            pg.close()
            if log is not None:
                log.close()


@contextmanager
def offline_database(cfg: Any, state_dir: Path, *, write: bool) -> Iterator[str]:
    """The DSN of the stopped node's database for one command (the caller holds the state directory's lock).

    ``postgres.dsn`` when set; else the embedded cluster of the state directory: used as it is when it still runs
    (it outlives a killed node), otherwise STARTED for this command and stopped after it (a node cannot start
    meanwhile: the lock). Without ``write`` (list, show) every session is read-only
    (``default_transaction_read_only``)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    def ro(dsn: str) -> str:
        # the DSN's own options (a search_path ...) are kept: ours is added to them (review finding)
        own = str(conninfo_to_dict(dsn).get("options") or "")
        return dsn if write else str(make_conninfo(dsn, options=" ".join(
            part for part in (own, "-c default_transaction_read_only=on") if part)))

    if cfg.postgres.dsn:
        yield ro(str(cfg.postgres.dsn))
        return
    from router.node.lifecycle import ServiceError
    from router.node.services import EmbeddedPostgres

    embedded = EmbeddedPostgres(state_dir, cfg.postgres.embedded_port)
    running = embedded._running_port()
    if running is not None:                          # left by a killed node: used, not stopped
        embedded.port = running
        yield ro(embedded._make_dsn())
        return
    if not (embedded.data / "PG_VERSION").exists():
        raise Unavailable(f"no embedded PostgreSQL cluster in {embedded.root} (no node ran with this state "
                          "directory): name the node's with --state-dir, or set postgres.dsn", EXIT_CONFIG)
    from router.node.server import _postgres_may_traverse

    _postgres_may_traverse(state_dir)                # as root the cluster runs as the postgres OS user
    try:
        dsn = embedded.start()
    except ServiceError as exc:
        raise Unavailable(f"the node is stopped and its embedded PostgreSQL could not be started for this "
                          f"command: {exc}", EXIT_FAILURE) from None
    try:
        yield ro(dsn)
    finally:
        embedded.stop()


class OfflineBroker:
    """The broker recovery re-sends to while the node is stopped: ``broker.url``, or the node's embedded ActiveMQ
    when it still runs (a killed node leaves it running; an orderly stop stops it): its STOMP port from its
    ``activemq.xml``, its login from ``activemq/credentials``. One connection for the command, opened on first
    use; :meth:`problem` says why none can be opened (asked before anything is committed)."""

    def __init__(self, cfg: Any, state_dir: Path) -> None:
        self.cfg, self.state_dir = cfg, state_dir
        self._transport: Any = None

    def _target(self) -> tuple[str, str, str]:
        from router.jms.transport import TransportError
        from router.node.services import EmbeddedActiveMQ

        broker = self.cfg.broker
        if broker.url:
            return str(broker.url), broker.login, broker.passcode
        mq = EmbeddedActiveMQ(self.state_dir, broker.embedded_stomp_port, broker.embedded_openwire_port,
                              authenticate=True)
        if not mq.is_running():
            raise TransportError("the node's embedded broker is not running (it stops with the node): start the "
                                 "node; its recovery re-sends at start")
        try:
            xml = (mq.root / "activemq.xml").read_text()
            login, passcode = mq.credentials_file.read_text().split("\n")[:2]
        except (OSError, ValueError) as exc:
            raise TransportError(f"the embedded broker's configuration cannot be read ({exc}): start the node; "
                                 "its recovery re-sends at start") from None
        found = re.search(r'name="stomp" uri="stomp://[^:"]+:(\d+)', xml)
        port = int(found[1]) if found else broker.embedded_stomp_port
        return f"stomp://127.0.0.1:{port}", login, passcode

    def transport(self) -> Any:
        from router.jms.transport import open_transport
        from router.mapping.stomp_codec import StompCodec

        if self._transport is None or not self._transport.is_connected():
            self.close()
            url, login, passcode = self._target()
            t = open_transport(url, codec=StompCodec(), username=login, password=passcode)
            t.connect()
            self._transport = t
        return self._transport

    def problem(self) -> str | None:
        try:
            self.transport()
        except Exception as exc:  # noqa: BLE001 - any failure to connect is the answer
            return f"{type(exc).__name__}: {exc}"
        return None

    def close(self) -> None:
        t, self._transport = self._transport, None
        if t is not None:
            try:
                t.close()
            except Exception:  # noqa: BLE001 - closing a connection the command no longer needs
                pass


# --------------------------------------------------------------------------------------------------- running
def run(args: argparse.Namespace, cfg: Any, *, out: Callable[[str], None] = print,
        err: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
        ask: Callable[[str], str] | None = None, tty: bool | None = None) -> int:
    """One ``nsjms txn`` subcommand; returns the exit code."""
    command = args.txn_command
    tty = sys.stdin.isatty() if tty is None else tty
    ask = ask or input
    try:
        older = _older(args)
        with backend(cfg, write=command not in ("list", "show")) as b:
            return _dispatch(args, b, out, err, ask, tty, older)
    except Unavailable as exc:
        err(f"nsjms txn {command}: {exc}")
        return exc.code
    except Refusal as exc:
        err(f"nsjms txn {command}: refused: {exc}")
        return EXIT_REFUSED
    except _Usage as exc:
        err(f"nsjms txn {command}: {exc}")
        return EXIT_CONFIG


class _Usage(Exception):
    pass


def _older(args: argparse.Namespace) -> float | None:
    from router.routing.t2.view import parse_duration

    if getattr(args, "older_than", None) is None:
        return None
    try:
        return parse_duration(args.older_than)
    except ValueError as exc:
        raise _Usage(f"--older-than: {exc}") from None


def _dispatch(args: argparse.Namespace, b: Backend, out: Callable[[str], None], err: Callable[[str], None],
              ask: Callable[[str], str], tty: bool, older: float | None) -> int:
    command = args.txn_command
    if command == "list":
        listing = b.listing()
        listing["transactions"] = [t for t in listing["transactions"] if (not args.in_doubt or t["in_doubt"])
                                   and (older is None or (t["age_s"] or 0.0) >= older)]
        out(json.dumps(listing, indent=2, sort_keys=True) if args.json else render_list(listing))
        return EXIT_OK
    if command == "show":
        view = b.show(args.gtrid)
        out(json.dumps(view, indent=2, sort_keys=True) if args.json else render_show(view, b.mode))
        return EXIT_OK
    if command == "recover":
        report = b.recover()
        out(json.dumps(report, indent=2, sort_keys=True) if args.json else render_report(report, b.mode))
        return EXIT_FAILURE if report.get("errors") else EXIT_OK
    who = args.who or f"{getpass.getuser()}@{socket.gethostname()}"
    if command == "forget":
        if not _confirm(args, tty, ask, err, render_show(b.show(args.gtrid), b.mode), f"forget {args.gtrid}"):
            return EXIT_REFUSED
        result = b.forget(args.gtrid, who)
        out(json.dumps(result, sort_keys=True) if args.json else f"{args.gtrid}: forgotten ({b.mode})")
        return EXIT_OK
    return _decide(args, b, out, err, ask, tty, who)


def _decide(args: argparse.Namespace, b: Backend, out: Callable[[str], None], err: Callable[[str], None],
            ask: Callable[[str], str], tty: bool, who: str) -> int:
    action = args.txn_command
    if (args.gtrid is None) == (args.xid is None):
        raise _Usage("name a transaction GTRID, or one orphaned branch with --xid GID (not both)")
    target = args.xid or args.gtrid
    heuristic = bool(getattr(args, "heuristic", False))
    if args.xid is None:
        try:
            view = b.show(args.gtrid)
        except Refusal:                              # unknown: the backend refuses the request itself (and logs it)
            b.resolve(args.gtrid, action, who, args.why or "")
            raise
        summary = render_show(view, b.mode)
        if action == "commit" and view["decision"] is None and not heuristic:
            # refused (exit 4) and written to the operator log by the backend, with the count at stake
            b.resolve(args.gtrid, action, who, args.why or "")
            raise Refusal(f"{args.gtrid}: no COMMIT is logged: add --heuristic")  # not reached: refused above
        if action == "commit" and view["decision"] is None:
            summary += "\n" + heuristic_warning(view)
        elif view["action"] not in (action, "resend" if action == "commit" else action):
            summary += f"\nNOTE: the safe action is {view['action']!r}: {view['reason']}"
    else:
        summary = orphan_summary(args.xid)
    why = args.why
    if not why:
        if not tty:
            raise _Usage("--why is required without a terminal (it is recorded with the decision)")
        why = ask("why (recorded with the decision): ").strip()
        if not why:
            raise _Usage("a decision needs a reason")
    if not _confirm(args, tty, ask, err, summary, f"{action} {target}"):
        return EXIT_REFUSED
    if args.xid is not None:
        result = b.resolve_xid(args.xid, action, who, why)
    else:
        from router.routing.t2.ops import HEURISTIC_COMMIT

        result = b.resolve(args.gtrid, HEURISTIC_COMMIT if heuristic and action == "commit" else action, who, why)
    out(json.dumps(result, indent=2, sort_keys=True) if args.json else render_report(result, b.mode))
    return EXIT_FAILURE if result.get("errors") else EXIT_OK


def orphan_summary(gid: str) -> str:
    """What ``txn commit|rollback --xid GID`` does, shown before it is confirmed (the CLI's prompt and the console's
    confirmation)."""
    return f"orphaned prepared branch {gid}: recorded as a HEURISTIC outcome until `nsjms txn forget`"


def heuristic_warning(view: dict[str, Any]) -> str:
    """What a commit of ``view`` (no COMMIT logged) does, shown before ``txn commit --heuristic`` is confirmed (the
    CLI's prompt and the console's confirmation)."""
    return (f"WARNING: no COMMIT is logged (safe action {view['action']!r}): committing is a HEURISTIC "
            f"decision, recorded and listed until `nsjms txn forget`; it commits {_events(view)} event(s)"
            f"{' to ' + ', '.join(view['destinations']) if view['destinations'] else ''} and re-sends "
            "its outbox rows with their dedupe ids")


def _confirm(args: argparse.Namespace, tty: bool, ask: Callable[[str], str], err: Callable[[str], None],
             summary: str, what: str) -> bool:
    if args.yes:
        return True
    if not tty:
        raise _Usage("not a terminal: add --yes to confirm")
    err(summary)
    if ask(f"type yes to {what}: ").strip().lower() != "yes":
        err("nothing done")
        return False
    return True


# ------------------------------------------------------------------------------------------------- rendering
def _age(seconds: float | None) -> str:
    from router.node.status import _age as age

    return "-" if seconds is None else age(seconds)


def _branches(view: dict[str, Any]) -> str:
    return ",".join(f"{b['name']}={b['state']}" for b in view["branches"]) or "-"


def render_list(listing: dict[str, Any]) -> str:
    """The table ``nsjms txn list`` prints (one line per transaction, then orphans and foreign counts)."""
    where = ("asked the running router" if listing["mode"] == "online"
             else "router stopped: read from the recovery log and PostgreSQL under the state directory's lock")
    lines = [f"node {listing['node']} ({where})"]
    txns = listing["transactions"]
    head = ("GTRID", "STATUS", "AGE", "BRANCHES", "EVENTS", "ACTION", "REASON")
    rows = [(t["gtrid"], t["status"], _age(t["age_s"]), _branches(t), _events(t), t["action"], t["reason"])
            for t in txns]
    if rows:
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]
        for r in [head, *rows]:
            lines.append("  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]).rstrip())
    else:
        lines.append("no pending transactions")
    if listing["orphans"]:
        lines.append(f"orphaned prepared branches ({len(listing['orphans'])}; never touched without --xid GID):")
        for o in listing["orphans"]:
            lines.append(f"  {o['gid']}  gtrid {o['gtrid']!r} branch {o['bqual']!r}  age {_age(o['age_s'])}  "
                         f"owner {o['owner']}")
    if listing["foreign"]:
        lines.append(f"{listing['foreign']} prepared transaction(s) of other nodes or applications ignored")
    lines += [f"ERROR: {e}" for e in listing["errors"]]
    return "\n".join(lines)


def _events(view: dict[str, Any]) -> str:
    """The event count, ``?`` when a prepared branch holds what cannot be read (``TxnView.events_known``)."""
    return str(view["events"]) if view.get("events_known", True) else "?"


def _ts(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def render_show(view: dict[str, Any], mode: str) -> str:
    """One transaction in full (``nsjms txn show``, and the summary before a confirmation)."""
    lines = [f"transaction {view['gtrid']}  ({mode})",
             f"  status      {view['status']}; decision {view['decision'] or 'none logged (presumed abort)'}"
             f" at {_ts(view['decided_at'])}; deadline {_ts(view['deadline'])}; age {_age(view['age_s'])}",
             f"  safe action {view['action'].upper()}: {view['reason']}",
             f"  bridges     {', '.join(map(str, view['bridges'])) or '-'}; channels "
             f"{', '.join(map(str, view.get('channels', []))) or '-'}; destinations "
             f"{', '.join(view['destinations']) or '-'}; events {_events(view)}"]
    if not view.get("events_known", True):
        lines.append("  events      ? (a prepared PostgreSQL branch's own rows are invisible until it commits; a "
                     "JMS -> channel T2 deletes nothing that could be counted)")
    for b in view["branches"]:
        phase = "one-phase" if b["one_phase"] else "two-phase"
        since = f", prepared {_ts(b['prepared_at'])}" if b["prepared_at"] else ""
        lines.append(f"  branch      {b['name']:<14} {b['kind']:<11} {phase}  {b['state']}{since}")
    for r in view["outbox"]:
        lines.append(f"  outbox      #{r['idx']} dedupe id {r['dedupe_id']} -> bridge {r['bridge_id']} "
                     f"{r['destination']} (written {_ts(r['created_at'])})")
    for r in view["inbox"]:
        lines.append(f"  inbox       bridge {r['bridge_id']} message {r['message_id']} (received "
                     f"{_ts(r['received_at'])})")
    for h in view.get("held", ()):
        lines.append(f"  held        {h['events']} channel event(s) of channel {h['channel_id']} taken by the prepared "
                     f"branch for bridge {h['bridge_id'] if h['bridge_id'] is not None else '-'} "
                     f"{h['destination'] or '(not a bridge)'}")
    for h in view["heuristics"]:
        lines.append(f"  heuristic   {h['kind']} branch {h['branch']} by {h['who']} at {_ts(h['at'])}: {h['why']}")
    return "\n".join(lines)


def render_report(report: dict[str, Any], mode: str) -> str:
    """What a commit/rollback/recover did."""
    parts = [f"{k.replace('_', ' ')} {', '.join(report[k])}" for k in
             ("committed", "rolled_back", "resent", "deferred", "ended", "heuristic", "waiting")
             if isinstance(report.get(k), list)
             and report[k]]
    text = f"{report.get('gtrid') or report.get('gid') or 'recovery'} ({mode}): " + ("; ".join(parts) or "nothing "
                                                                                     "to do")
    if report.get("heuristic") is True:
        if report.get("action") == "heuristic-commit":
            where = f" to {', '.join(report['destinations'])}" if report.get("destinations") else ""
            text += f"\ncommitted {report.get('events', 0)} event(s) heuristically{where}" + (
                "; re-sent with their dedupe ids" if report.get("resent") else "")
        text += "\nrecorded as a HEURISTIC outcome: `nsjms txn list` shows it until `nsjms txn forget`"
    if report.get("note"):
        text += f"\nNOTE: {report['note']}"
    text += "".join(f"\nERROR: {e}" for e in report.get("errors", []))
    return text
