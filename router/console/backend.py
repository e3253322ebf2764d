"""What the console does, over a running node, through the SAME functions the CLI uses (no second implementation).

* overview: the node's status snapshot (``status.json``, what ``nsjms status`` reads) and its endpoints;
* channels: :func:`router.cli.channel._list` / :func:`router.cli.channel.show` over the node's
  ``EventChannelFactory`` reference (OMG operations, as ``nsjms channel list|show``);
* bridges: :func:`router.cli.bridge._dispatch` over the node's ``BridgeFactory`` reference (``nsjms bridge
  list|start|stop|destroy --json``), the state vocabulary of :func:`router.cli.bridge.bridge_state`;
* routing transactions: the node's :class:`router.routing.t2.ops.TxnOps`, the object the ``TransactionAdmin`` servant
  answers ``nsjms txn`` with (listing with the safe action, resolve refused exactly as the CLI's, forget);
* dead letters: the node's :class:`router.deadletter.ops.DeadLetterOps`, the object the ``DeadLetterAdmin`` servant
  answers ``nsjms deadletter list|show|retry|discard`` with (retry's target and refusals included);
* dead letters on the broker (``nsjms.DLQ``, ``ActiveMQ.DLQ``): :class:`router.deadletter.broker.BrokerDeadLetterOps`,
  the operations ``nsjms deadletter broker list|show|retry|discard`` runs, over the node's own broker settings;
* the operator log: :meth:`router.routing.t2.ops.TxnOps.audit`, the file ``nsjms txn`` writes;
* channel create / destroy: :func:`router.cli.channel.check_create_args` and :func:`router.cli.channel._dispatch`
  (``nsjms channel create|destroy --json``: the same ``--qos``/``--admin`` parsing and checks, the node's refusals
  rendered the same way);
* bridge create and routing transactions on/off: :func:`router.cli.bridge._precheck` and ``_dispatch`` (``nsjms
  bridge create|transaction --json``, refusals in the CLI's words);
* the ledger audit's verdicts: :func:`audit.incremental.stored_verdicts` (what ``nsjms audit --incremental``
  stored in ``nsjms_audit_day``; read only).

Calls run under the signed-in principal (:func:`router.security.auth.acting_as`): the node's own guards see who asks.

Exceptions (the CORBA exceptions of the node translated here, once, by the CLI's :func:`router.cli.out.corba_error`)::

    Exception
     └── ConsoleRefused      the node refused (409); the message says why, as the CLI would print it
          ├── NodeRefused        ... with a CORBA exception (a quota's IMP_LIMIT, NO_PERMISSION, a user exception)
          └── NodeUnavailable    the node did not answer (503): the CLI's "node not reachable"
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from router.console.calls import Counted
from router.routing.t2.ops import AUDIT_FILE, HEURISTIC_COMMIT, Refused, TxnOps
from router.security.auth import Principal, acting_as

__all__ = ["Backend", "BridgeSpec", "BrokerUnavailable", "ConsoleRefused", "NodeBackend", "NodeRefused",
           "NodeUnavailable", "node_errors"]

BRIDGE_ACTIONS = ("start", "stop", "destroy")
TXN_ACTIONS = ("commit", "rollback", "forget")
ORPHAN_ACTIONS = ("commit", "rollback")         # `nsjms txn commit|rollback --xid GID`
DEAD_LETTER_ACTIONS = ("retry", "discard")
BROKER_DLQ_ROWS = 1000          # what one listing of a broker dead-letter queue reads at most (then paged)


@dataclass(frozen=True)
class BridgeSpec:
    """``nsjms bridge create``'s options, as the console's form gives them (text, parsed by the CLI's functions)."""

    source: str                     # --from channel:ID | queue:NAME | topic:NAME
    sink: str                       # --to
    channel_form: str = "structured"
    channel_style: str = "push"
    jms_style: str = "push"
    factory: str = ""
    start: bool = True              # not --no-start
    transaction: str = ""           # --transaction EVENTS[:TIMEOUT]; empty: none


class ConsoleRefused(Exception):
    """The node refused an action or a lookup; the message is the CLI's."""

    status = 409


class NodeRefused(ConsoleRefused):
    """The node answered with a CORBA exception that refuses the request (never a "not found" of a page)."""


class NodeUnavailable(ConsoleRefused):
    """The node did not answer (a CORBA ``TRANSIENT``, ``COMM_FAILURE``, ``TIMEOUT``): the CLI's exit 3."""

    status = 503


class BrokerUnavailable(NodeUnavailable):
    """The broker could not be asked about its dead-letter queues (``nsjms deadletter broker``'s exit 3)."""


@contextlib.contextmanager
def node_errors() -> Iterator[None]:
    """Any CORBA exception the node answers with, as the CLI words it (:func:`router.cli.out.corba_error`): a
    refusal (``IMP_LIMIT`` of a quota, ``NO_PERMISSION``, a spec's user exception ...) or the node unavailable."""
    from router.cli.out import corba_error

    try:
        yield
    except ConsoleRefused:
        raise
    except Exception as exc:
        error = corba_error(exc)
        if error is None:
            raise
        raise (NodeUnavailable if error.unavailable else NodeRefused)(error.words) from None


class Backend(Protocol):
    state_dir: Path

    def snapshot(self) -> dict[str, Any]: ...

    def endpoints(self) -> dict[str, Any]: ...

    def channels(self, who: Principal) -> list[dict[str, Any]]: ...

    def channel(self, who: Principal, cid: int) -> dict[str, Any]: ...

    def bridges(self, who: Principal, ids: Sequence[int] | None = None) -> list[dict[str, Any]]: ...

    def bridge_index(self, who: Principal) -> list[dict[str, Any]]: ...

    def bridge_action(self, who: Principal, bid: int, action: str, why: str) -> dict[str, Any]: ...

    def transactions(self) -> dict[str, Any]: ...

    def transaction(self, gtrid: str) -> dict[str, Any]: ...

    def txn_action(self, who: Principal, gtrid: str, action: str, why: str) -> dict[str, Any]: ...

    def orphan_action(self, who: Principal, gid: str, action: str, why: str) -> dict[str, Any]: ...

    def dead_letters(self, channel: int | None) -> dict[str, Any]: ...

    def dead_letter(self, dl_id: int) -> dict[str, Any]: ...

    def dead_letter_action(self, who: Principal, dl_id: int, action: str, why: str) -> dict[str, Any]: ...

    def broker_dead_letters(self, queue: str, scan: int = BROKER_DLQ_ROWS) -> dict[str, Any]: ...

    def broker_dead_letter(self, queue: str, message_id: str) -> dict[str, Any]: ...

    def broker_dead_letter_action(self, who: Principal, queue: str, message_id: str, action: str,
                                  why: str) -> dict[str, Any]: ...

    def audit(self, who: str, why: str, action: str, target: str, result: Any) -> None: ...

    def channel_create(self, who: Principal, qos: Sequence[str], admin: Sequence[str], why: str) -> dict[str, Any]:
        ...

    def channel_destroy(self, who: Principal, cid: int, why: str) -> dict[str, Any]: ...

    def bridge_create(self, who: Principal, spec: BridgeSpec, why: str) -> dict[str, Any]: ...

    def bridge_transaction(self, who: Principal, bid: int, setting: str, why: str) -> dict[str, Any]: ...

    def audit_days(self, limit: int) -> dict[str, Any]: ...

    def cluster(self) -> dict[str, Any]: ...


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


class NodeBackend:
    """The console's operations inside the running node process (``node``: a started
    :class:`router.node.server.Node`)."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self.state_dir: Path = node.s.state_dir
        self.ops: TxnOps = node.txn_admin.ops
        self._broker_ops: Any = None
        self._snapshot: tuple[tuple[int, int], dict[str, Any]] = ((0, -1), {})

    # ------------------------------------------------------------------------------------------ read
    def snapshot(self) -> dict[str, Any]:
        """The node's status snapshot (``status.json``, rewritten every 2 s), parsed once per version (it grows with
        the channels, proxies and bridges, and every page and the rate sampler read it): read only."""
        path = self.state_dir / "status.json"
        try:
            st = path.stat()
        except FileNotFoundError:
            return {}
        version, cached = self._snapshot
        if version == (st.st_mtime_ns, st.st_size):
            return cached
        snap = _read_json(path)
        self._snapshot = ((st.st_mtime_ns, st.st_size), snap)
        return snap

    def endpoints(self) -> dict[str, Any]:
        return _read_json(self.state_dir / "endpoints.json")

    def _ecf(self, counted: bool = False) -> Any:
        """The node's EventChannelFactory; ``counted``: its operations (and those of what it returns) counted for
        the request's ``X-Nsjms-Node-Calls`` (read paths only)."""
        import CosNotifyChannelAdmin

        ecf = self.node.factory.ref._narrow(CosNotifyChannelAdmin.EventChannelFactory)
        return Counted(ecf) if counted else ecf

    def channels(self, who: Principal) -> list[dict[str, Any]]:
        from router.cli.channel import _list

        with node_errors(), acting_as(who):
            return _list(self._ecf(counted=True), self.snapshot())

    def channel(self, who: Principal, cid: int) -> dict[str, Any]:
        import CosNotifyChannelAdmin

        from router.cli.channel import show

        with node_errors(), acting_as(who):
            try:
                channel = self._ecf(counted=True).get_event_channel(cid)
            except CosNotifyChannelAdmin.ChannelNotFound:
                raise ConsoleRefused(f"no channel with id {cid}") from None
            return show(channel, cid, self.snapshot())

    def _bridge_cli(self, who: Principal, args: argparse.Namespace) -> list[str]:
        """``nsjms bridge … --json`` against the node's BridgeFactory; the CLI's refusals as ConsoleRefused."""
        from idl.generated import CosBridgeAdmin as BA
        from idl.generated import NsjmsAdmin
        from router.cli.bridge import _dispatch, _snapshot_bridges, invalid_endpoints

        out: list[str] = []
        with node_errors(), acting_as(who):
            factory = self.node.bridges.ref._narrow(BA.BridgeFactory)
            if args.bridge_command == "list":
                factory = Counted(factory)
                args.existing_channels = set(self._ecf(counted=True).get_all_channels())
            try:
                code = _dispatch(args, factory, BA, NsjmsAdmin, out.append, _snapshot_bridges(self.state_dir))
            except BA.BridgeNotFound:
                raise ConsoleRefused(f"no bridge with id {args.id}") from None
            except BA.BridgeAlreadyStarted:
                raise ConsoleRefused(f"bridge {args.id} is already started") from None
            except BA.BridgeInactive:
                raise ConsoleRefused(f"bridge {args.id} is not started") from None
            except BA.InvalidExternalEndPoints as exc:   # the node's own check (after the CLI's precheck)
                raise ConsoleRefused("; ".join(invalid_endpoints(exc, {}))) from None
        if code != 0:                                    # refused with the CLI's words (exit 4)
            raise ConsoleRefused("; ".join(line.removeprefix("nsjms bridge: ") for line in out))
        return out

    def bridge_index(self, who: Principal) -> list[dict[str, Any]]:
        """Every bridge the node has (one call: ``get_all_bridges``) with what its status snapshot (at most 2 s old)
        says of it: what a list is filtered and sorted by before :meth:`bridges` asks the node about one page."""
        from idl.generated import CosBridgeAdmin as BA

        with node_errors(), acting_as(who):
            ids = Counted(self.node.bridges.ref._narrow(BA.BridgeFactory)).get_all_bridges()
        snap = {int(b["id"]): b for b in self.snapshot().get("bridges", [])}
        keys = ("source", "sink", "state", "reason", "last_error", "forwarded", "dead_lettered")
        return [{"id": int(bid), **{k: snap.get(int(bid), {}).get(k) for k in keys}} for bid in ids]

    def bridges(self, who: Principal, ids: Sequence[int] | None = None) -> list[dict[str, Any]]:
        """``bridge list --json`` rows (``ids``: of these bridges only, skipping any destroyed meanwhile) joined with
        the snapshot's counters (forwarded, dead-lettered, broker ...)."""
        args = argparse.Namespace(bridge_command="list", json=True, ids=None if ids is None else list(ids))
        rows: list[dict[str, Any]] = json.loads(self._bridge_cli(who, args)[0])
        counters = {int(b["id"]): b for b in self.snapshot().get("bridges", [])}
        for row in rows:
            extra = counters.get(int(row["id"]), {})
            for key in ("forwarded", "dead_lettered", "duplicates_suppressed", "refused_to_broker_dlq", "broker",
                        "channel_connected"):
                row[key] = extra.get(key)
            row["transactions"] = {k: v for k, v in extra.items() if k.startswith(("t2", "transaction"))}
        return rows

    def transactions(self) -> dict[str, Any]:
        return self.ops.listing().as_dict()

    def transaction(self, gtrid: str) -> dict[str, Any]:
        try:
            return self.ops.show(gtrid).as_dict()
        except Refused as exc:
            raise ConsoleRefused(str(exc)) from None

    # ------------------------------------------------------------------------------------------- act
    def _recorded(self, who: Principal, why: str, action: str, target: str,
                  act: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run ``act`` and put it in the operator log with the principal and the reason, refused or done."""
        try:
            with node_errors():
                result = act()
        except ConsoleRefused as exc:
            self.audit(who.name, why, action, target, str(exc) if str(exc).startswith(("refused", "node not"))
                       else f"refused: {exc}")
            raise
        self.audit(who.name, why, action, target, result)
        return result

    def bridge_action(self, who: Principal, bid: int, action: str, why: str) -> dict[str, Any]:
        if action not in BRIDGE_ACTIONS:
            raise ConsoleRefused(f"a bridge can be started, stopped or destroyed, not {action!r}")
        args = argparse.Namespace(bridge_command=action, id=bid, json=True)
        return self._recorded(who, why, f"bridge {action}", str(bid),
                              lambda: dict(json.loads(self._bridge_cli(who, args)[0])))

    def bridge_create(self, who: Principal, spec: BridgeSpec, why: str) -> dict[str, Any]:
        """``nsjms bridge create --from … --to … [--transaction E[:T]] [--no-start] --json``: the CLI's parsing and
        precheck (the node's endpoint rules, with their reasons), then the node's ``create_bridge``."""
        from idl.generated import CosBridgeAdmin as BA
        from router.cli.bridge import UsageError, _precheck, invalid_endpoints, parse_transaction

        def act() -> dict[str, Any]:
            args = argparse.Namespace(bridge_command="create", source=spec.source.strip(), sink=spec.sink.strip(),
                                      channel_form=spec.channel_form, channel_style=spec.channel_style,
                                      jms_style=spec.jms_style, factory=spec.factory.strip(), no_start=not spec.start,
                                      transaction=None, json=True)
            try:
                if spec.transaction.strip():
                    args.transaction = parse_transaction(spec.transaction.strip())
                with node_errors(), acting_as(who):
                    reasons, errors = _precheck(args, BA, self.node.factory.ref)
            except (UsageError, argparse.ArgumentTypeError) as exc:
                raise ConsoleRefused(str(exc)) from None
            if errors:   # refused by the node's own rules: not sent, reported as the CLI reports it
                raise ConsoleRefused("; ".join(invalid_endpoints(BA.InvalidExternalEndPoints(errors), reasons)))
            return dict(json.loads(self._bridge_cli(who, args)[-1]))

        return self._recorded(who, why, "bridge create", f"{spec.source} -> {spec.sink}", act)

    def bridge_transaction(self, who: Principal, bid: int, setting: str, why: str) -> dict[str, Any]:
        """``nsjms bridge transaction ID EVENTS[:TIMEOUT]|off --json`` (enable_transaction / disable_transaction)."""
        from router.cli.bridge import _transaction_or_off

        def act() -> dict[str, Any]:
            try:
                parsed = _transaction_or_off(setting)
            except argparse.ArgumentTypeError as exc:
                raise ConsoleRefused(str(exc)) from None
            args = argparse.Namespace(bridge_command="transaction", id=bid, setting=parsed, json=True)
            return dict(json.loads(self._bridge_cli(who, args)[0]))

        return self._recorded(who, why, "bridge transaction", f"{bid} {setting.strip()}", act)

    def channel_create(self, who: Principal, qos: Sequence[str], admin: Sequence[str], why: str) -> dict[str, Any]:
        """``nsjms channel create --qos N=V … --admin N=V … --json``: the CLI's parsing and checks first (a refusal
        names the property and why), then the node's ``create_channel`` (its refusals rendered as the CLI's)."""
        args = argparse.Namespace(channel_command="create", qos=list(qos), admin=list(admin), json=True)
        target = " ".join([*(f"--qos {q}" for q in qos), *(f"--admin {a}" for a in admin)]) or "defaults"
        return self._recorded(who, why, "channel create", target, lambda: self._channel_cli(who, args))

    def channel_destroy(self, who: Principal, cid: int, why: str) -> dict[str, Any]:
        """``nsjms channel destroy ID --json``."""
        args = argparse.Namespace(channel_command="destroy", id=cid, json=True)
        return self._recorded(who, why, "channel destroy", str(cid), lambda: self._channel_cli(who, args))

    def _channel_cli(self, who: Principal, args: argparse.Namespace) -> dict[str, Any]:
        import CosNotification
        import CosNotifyChannelAdmin

        from router.cli.channel import UsageError, _dispatch, _node_refusal, check_create_args

        qos: dict[str, object] = {}
        admin: dict[str, object] = {}
        out: list[str] = []
        try:
            if args.channel_command == "create":
                qos, admin = check_create_args(args)
            with node_errors(), acting_as(who):
                _dispatch(args, self._ecf(), self.state_dir, qos, admin, out.append)
        except UsageError as exc:
            raise ConsoleRefused(str(exc)) from None
        except CosNotifyChannelAdmin.ChannelNotFound:
            raise ConsoleRefused(f"no channel with id {args.id}") from None
        except CosNotification.UnsupportedQoS as exc:
            raise ConsoleRefused("refused by the node: " + "; ".join(_node_refusal("--qos", exc.qos_err))) from None
        except CosNotification.UnsupportedAdmin as exc:
            raise ConsoleRefused("refused by the node: " + "; ".join(_node_refusal("--admin", exc.admin_err))) from None
        return dict(json.loads(out[0]))

    def audit_days(self, limit: int) -> dict[str, Any]:
        """The latest days' verdicts of ``nsjms audit --incremental`` (``nsjms_audit_day``), with the per-bridge
        sums of ``audit.incremental_report.by_key``; ``error`` when the table cannot be read."""
        from audit import AuditError
        from audit.incremental import stored_verdicts

        try:
            return audit_days_view(stored_verdicts(self.node.pg_dsn, limit))
        except AuditError as exc:
            return {"days": [], "bridges": [], "totals": {}, "error": str(exc)}

    def cluster(self) -> dict[str, Any]:
        """What ``nsjms cluster status --json`` shows (:func:`router.cluster.report.cluster_report`, read only, over
        the node's database); ``error`` when it cannot be read."""
        import psycopg

        from router.cluster.report import cluster_report
        from router.db.conninfo import connect

        try:
            with connect(self.node.pg_dsn, autocommit=True, connect_timeout=5,
                         options="-c default_transaction_read_only=on") as conn:
                return {**cluster_report(conn), "error": None}
        except psycopg.Error as exc:
            return {"members": [], "error": f"cannot read the cluster's members: {type(exc).__name__}"}

    def txn_action(self, who: Principal, gtrid: str, action: str, why: str) -> dict[str, Any]:
        """``nsjms txn commit [--heuristic]|rollback|forget`` (``heuristic-commit``: ``commit --heuristic``): the same
        TxnOps call the TransactionAdmin servant makes (refusals, operator log and heuristic records included)."""
        try:
            if action in ("commit", "rollback", HEURISTIC_COMMIT):
                return self.ops.resolve(gtrid, action, who.name, why)
            if action == "forget":
                self.audit(who.name, why, "forget requested", gtrid, "see the next entry")
                return self.ops.forget(gtrid, who.name)
        except Refused as exc:
            raise ConsoleRefused(str(exc)) from None
        raise ConsoleRefused(f"an operator can commit, roll back or forget, not {action!r}")

    def orphan_action(self, who: Principal, gid: str, action: str, why: str) -> dict[str, Any]:
        """``nsjms txn commit|rollback --xid GID``: :meth:`router.routing.t2.ops.TxnOps.resolve_xid`, the call the
        TransactionAdmin servant makes (its refusals, the HEURISTIC record and the operator log included)."""
        if action not in ORPHAN_ACTIONS:
            raise ConsoleRefused(f"an orphaned prepared branch can be committed or rolled back, not {action!r}")
        try:
            return self.ops.resolve_xid(gid, action, who.name, why)
        except Refused as exc:
            raise ConsoleRefused(str(exc)) from None

    def _dl_ops(self) -> Any:
        return self.node.dead_letter_admin.ops

    def dead_letters(self, channel: int | None) -> dict[str, Any]:
        """``nsjms deadletter list --json`` (up to 10,000 rows; the total is counted)."""
        result: dict[str, Any] = self._dl_ops().listing(channel, 10_000)
        return result

    def dead_letter(self, dl_id: int) -> dict[str, Any]:
        from router.deadletter.ops import Refused as DLRefused

        try:
            result: dict[str, Any] = self._dl_ops().show(dl_id)
        except DLRefused as exc:
            raise ConsoleRefused(str(exc)) from None
        return result

    def dead_letter_action(self, who: Principal, dl_id: int, action: str, why: str) -> dict[str, Any]:
        """``nsjms deadletter retry|discard``: the DeadLetterOps call the servant makes (operator log included)."""
        from router.deadletter.ops import Refused as DLRefused

        ops = self._dl_ops()
        try:
            if action == "retry":
                self.audit(who.name, why, "deadletter retry requested", str(dl_id), "see the next entry")
                result: dict[str, Any] = ops.retry(dl_id, who.name)
                return result
            if action == "discard":
                result = ops.discard(dl_id, who.name, why)
                return result
        except DLRefused as exc:
            raise ConsoleRefused(str(exc)) from None
        raise ConsoleRefused(f"a dead letter can be retried or discarded, not {action!r}")

    def _broker_dlq(self) -> Any:
        """The node's broker dead-letter operations (its broker URL and credentials, embedded or configured)."""
        if self._broker_ops is None:
            from router.deadletter.broker import BrokerDeadLetterOps
            from router.jms.stomp.browse import StompBrowser

            node = self.node
            timeout = float(node.s.broker_connect_timeout_s) + 20.0
            self._broker_ops = BrokerDeadLetterOps(
                str(node.s.node_id), self.state_dir,
                lambda: StompBrowser(node.broker_url, username=node.broker_login or None,
                                     password=node.broker_passcode or None, timeout=timeout), mode="online")
        return self._broker_ops

    @contextlib.contextmanager
    def _broker_errors(self) -> Iterator[None]:
        from router.deadletter.broker import BrokerDown
        from router.deadletter.broker import Refused as BrokerRefused

        try:
            yield
        except BrokerRefused as exc:
            raise ConsoleRefused(str(exc)) from None
        except BrokerDown as exc:
            raise BrokerUnavailable(str(exc)) from None

    def broker_dead_letters(self, queue: str, scan: int = BROKER_DLQ_ROWS) -> dict[str, Any]:
        """``nsjms deadletter broker list QUEUE --json`` (reading up to ``scan`` messages, paged by the page)."""
        with self._broker_errors():
            result: dict[str, Any] = self._broker_dlq().listing(queue, 0, scan, scan)
        return result

    def broker_dead_letter(self, queue: str, message_id: str) -> dict[str, Any]:
        with self._broker_errors():
            result: dict[str, Any] = self._broker_dlq().show(queue, message_id)
        return result

    def broker_dead_letter_action(self, who: Principal, queue: str, message_id: str, action: str,
                                  why: str) -> dict[str, Any]:
        """``nsjms deadletter broker retry|discard``: the same operation (operator log included)."""
        from router.deadletter.broker_event import sink_destination

        def bridge_sink(bid: int) -> str | None:
            """An event dead letter's bridge's JMS destination (``nsjms bridge list``'s sink), None when gone."""
            try:
                rows = self.bridges(who, [bid])
            except ConsoleRefused:
                return None
            return sink_destination(str(rows[0]["sink"])) if rows else None

        ops = self._broker_dlq()
        with self._broker_errors():
            if action == "retry":
                result: dict[str, Any] = ops.retry(queue, message_id, who.name, why, bridge_sink=bridge_sink)
                return result
            if action == "discard":
                result = ops.discard(queue, message_id, who.name, why)
                return result
        raise ConsoleRefused(f"a dead letter can be retried or discarded, not {action!r}")

    def audit(self, who: str, why: str, action: str, target: str, result: Any) -> None:
        self.ops.audit(who, why, f"console {action}" if not action.startswith("console") else action, target,
                       result)

    @property
    def audit_path(self) -> Path:
        return self.state_dir / AUDIT_FILE


def audit_days_view(days: Sequence[Any]) -> dict[str, Any]:
    """Stored verdicts (:class:`audit.incremental.StoredDay`, newest first) as the audit page shows them: a row per
    day (the counts ``nsjms audit --incremental`` prints), the per-bridge sums over those days, the totals."""
    from datetime import UTC, datetime

    from audit.incremental import IncrementalResult
    from audit.incremental_report import COLUMNS, by_key

    newest = max((d.as_of for d in days), default=datetime.fromtimestamp(0, UTC))
    result = IncrementalResult(newest, tuple(d.result for d in days))
    rows = [{"day": str(d.result.day), "verdict": d.result.verdict, "rows": d.result.rows,
             **{c: d.result.count(c) for c in COLUMNS},
             "as_of": d.as_of.timestamp(), "audited_at": d.audited_at.timestamp(), "grace_s": d.grace_s,
             "recheck_at": None if d.result.recheck_at is None else d.result.recheck_at.timestamp(),
             "ids": sorted({i for g in d.result.groups if g.status in ("lost", "duplicated") for i in g.ids})[:20]}
            for d in days]
    bridges = [{"direction": k[0], "bridge_id": k[1], **v}
               for k, v in sorted(by_key(result, "bridge").items(), key=lambda kv: (kv[0][0], kv[0][1] or -1))]
    return {"days": rows, "bridges": bridges, "totals": {c: result.count(c) for c in COLUMNS}, "error": None}
