"""What the console does, over a running node, through the SAME functions the CLI uses (no second implementation).

* overview: the node's status snapshot (``status.json``, what ``nsjms status`` reads) and its endpoints;
* channels: :func:`router.channelcli._list` / :func:`router.channelcli.show` over the node's
  ``EventChannelFactory`` reference (OMG operations, as ``nsjms channel list|show``);
* bridges: :func:`router.bridgecli._dispatch` over the node's ``BridgeFactory`` reference (``nsjms bridge
  list|start|stop|destroy --json``), the state vocabulary of :func:`router.bridgecli.bridge_state`;
* routing transactions: the node's :class:`router.txnops.TxnOps`, the object the ``TransactionAdmin`` servant
  answers ``nsjms txn`` with (listing with the safe action, resolve refused exactly as the CLI's, forget);
* dead letters: the node's :class:`router.deadletterops.DeadLetterOps`, the object the ``DeadLetterAdmin`` servant
  answers ``nsjms deadletter list|show|retry|discard`` with (retry's target and refusals included);
* the operator log: :meth:`router.txnops.TxnOps.audit`, the file ``nsjms txn`` writes.

Calls run under the signed-in principal (:func:`router.auth.acting_as`): the node's own guards see who asks.

Exceptions: :class:`ConsoleRefused` (the node refused; the message says why, as the CLI would print it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Protocol

from router.auth import Principal, acting_as
from router.txnops import AUDIT_FILE, Refused, TxnOps

__all__ = ["Backend", "ConsoleRefused", "NodeBackend"]

BRIDGE_ACTIONS = ("start", "stop", "destroy")
TXN_ACTIONS = ("commit", "rollback", "forget")
DEAD_LETTER_ACTIONS = ("retry", "discard")


class ConsoleRefused(Exception):
    """The node refused an action or a lookup; the message is the CLI's."""


class Backend(Protocol):
    state_dir: Path

    def snapshot(self) -> dict[str, Any]: ...

    def endpoints(self) -> dict[str, Any]: ...

    def channels(self, who: Principal) -> list[dict[str, Any]]: ...

    def channel(self, who: Principal, cid: int) -> dict[str, Any]: ...

    def bridges(self, who: Principal) -> list[dict[str, Any]]: ...

    def bridge_action(self, who: Principal, bid: int, action: str, why: str) -> dict[str, Any]: ...

    def transactions(self) -> dict[str, Any]: ...

    def transaction(self, gtrid: str) -> dict[str, Any]: ...

    def txn_action(self, who: Principal, gtrid: str, action: str, why: str) -> dict[str, Any]: ...

    def dead_letters(self, channel: int | None) -> dict[str, Any]: ...

    def dead_letter(self, dl_id: int) -> dict[str, Any]: ...

    def dead_letter_action(self, who: Principal, dl_id: int, action: str, why: str) -> dict[str, Any]: ...

    def audit(self, who: str, why: str, action: str, target: str, result: Any) -> None: ...


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


class NodeBackend:
    """The console's operations inside the running node process (``node``: a started :class:`router.server.Node`)."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self.state_dir: Path = node.s.state_dir
        self.ops: TxnOps = node.txn_admin.ops

    # ------------------------------------------------------------------------------------------ read
    def snapshot(self) -> dict[str, Any]:
        return _read_json(self.state_dir / "status.json")

    def endpoints(self) -> dict[str, Any]:
        return _read_json(self.state_dir / "endpoints.json")

    def _ecf(self) -> Any:
        import CosNotifyChannelAdmin

        return self.node.factory.ref._narrow(CosNotifyChannelAdmin.EventChannelFactory)

    def channels(self, who: Principal) -> list[dict[str, Any]]:
        from router.channelcli import _list

        with acting_as(who):
            return _list(self._ecf(), self.snapshot())

    def channel(self, who: Principal, cid: int) -> dict[str, Any]:
        import CosNotifyChannelAdmin

        from router.channelcli import show

        with acting_as(who):
            try:
                channel = self._ecf().get_event_channel(cid)
            except CosNotifyChannelAdmin.ChannelNotFound:
                raise ConsoleRefused(f"no channel with id {cid}") from None
            return show(channel, cid, self.snapshot())

    def _bridge_cli(self, who: Principal, args: argparse.Namespace) -> list[str]:
        """``nsjms bridge … --json`` against the node's BridgeFactory; the CLI's refusals as ConsoleRefused."""
        from idl.generated import CosBridgeAdmin as BA
        from idl.generated import NsjmsAdmin
        from router.bridgecli import _dispatch, _snapshot_bridges

        out: list[str] = []
        with acting_as(who):
            factory = self.node.bridges.ref._narrow(BA.BridgeFactory)
            if args.bridge_command == "list":
                args.existing_channels = set(self._ecf().get_all_channels())
            try:
                _dispatch(args, factory, BA, NsjmsAdmin, out.append, _snapshot_bridges(self.state_dir))
            except BA.BridgeNotFound:
                raise ConsoleRefused(f"no bridge with id {args.id}") from None
            except BA.BridgeAlreadyStarted:
                raise ConsoleRefused(f"bridge {args.id} is already started") from None
            except BA.BridgeInactive:
                raise ConsoleRefused(f"bridge {args.id} is not started") from None
        return out

    def bridges(self, who: Principal) -> list[dict[str, Any]]:
        """``bridge list --json`` rows joined with the snapshot's counters (forwarded, dead-lettered, broker ...)."""
        rows: list[dict[str, Any]] = json.loads(
            self._bridge_cli(who, argparse.Namespace(bridge_command="list", json=True))[0])
        counters = {int(b["id"]): b for b in self.snapshot().get("bridges", [])}
        for row in rows:
            extra = counters.get(int(row["id"]), {})
            for key in ("forwarded", "dead_lettered", "duplicates_suppressed", "refused_to_broker_dlq", "broker",
                        "channel_connected"):
                row[key] = extra.get(key)
            row["transactions"] = {k: v for k, v in extra.items() if k.startswith("t2") or k == "transactional"}
        return rows

    def transactions(self) -> dict[str, Any]:
        return self.ops.listing().as_dict()

    def transaction(self, gtrid: str) -> dict[str, Any]:
        try:
            return self.ops.show(gtrid).as_dict()
        except Refused as exc:
            raise ConsoleRefused(str(exc)) from None

    # ------------------------------------------------------------------------------------------- act
    def bridge_action(self, who: Principal, bid: int, action: str, why: str) -> dict[str, Any]:
        if action not in BRIDGE_ACTIONS:
            raise ConsoleRefused(f"a bridge can be started, stopped or destroyed, not {action!r}")
        try:
            out = self._bridge_cli(who, argparse.Namespace(bridge_command=action, id=bid, json=True))
        except ConsoleRefused as exc:
            self.audit(who.name, why, f"bridge {action}", str(bid), f"refused: {exc}")
            raise
        result: dict[str, Any] = json.loads(out[0])
        self.audit(who.name, why, f"bridge {action}", str(bid), result)
        return result

    def txn_action(self, who: Principal, gtrid: str, action: str, why: str) -> dict[str, Any]:
        """``nsjms txn commit|rollback|forget``: the same TxnOps call the TransactionAdmin servant makes (refusals,
        operator log and heuristic records included)."""
        try:
            if action in ("commit", "rollback"):
                return self.ops.resolve(gtrid, action, who.name, why)
            if action == "forget":
                self.audit(who.name, why, "forget requested", gtrid, "see the next entry")
                return self.ops.forget(gtrid, who.name)
        except Refused as exc:
            raise ConsoleRefused(str(exc)) from None
        raise ConsoleRefused(f"an operator can commit, roll back or forget, not {action!r}")

    def _dl_ops(self) -> Any:
        return self.node.dead_letter_admin.ops

    def dead_letters(self, channel: int | None) -> dict[str, Any]:
        """``nsjms deadletter list --json`` (up to 10,000 rows; the total is counted)."""
        result: dict[str, Any] = self._dl_ops().listing(channel, 10_000)
        return result

    def dead_letter(self, dl_id: int) -> dict[str, Any]:
        from router.deadletterops import Refused as DLRefused

        try:
            result: dict[str, Any] = self._dl_ops().show(dl_id)
        except DLRefused as exc:
            raise ConsoleRefused(str(exc)) from None
        return result

    def dead_letter_action(self, who: Principal, dl_id: int, action: str, why: str) -> dict[str, Any]:
        """``nsjms deadletter retry|discard``: the DeadLetterOps call the servant makes (operator log included)."""
        from router.deadletterops import Refused as DLRefused

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

    def audit(self, who: str, why: str, action: str, target: str, result: Any) -> None:
        self.ops.audit(who, why, f"console {action}" if not action.startswith("console") else action, target,
                       result)

    @property
    def audit_path(self) -> Path:
        return self.state_dir / AUDIT_FILE
