"""``NsjmsAdmin::TransactionAdmin``: the running router answers ``nsjms txn`` (online mode) over IIOP.

The servant is activated on the node's INS POA under the key ``TransactionAdmin`` (``corbaloc::HOST:PORT/
TransactionAdmin``, published in ``endpoints.json`` as ``transaction_admin``). It runs
:class:`router.routing.t2.ops.TxnOps` over the node's own recovery log, recovery manager, PostgreSQL manager and
in-flight set, so an operator's action and the router's recovery never race: both go through the same recovery manager,
and a transaction this node is driving is refused. Results are JSON strings; a refusal is
``TransactionRefused(reason)``. Every operation needs an authenticated caller (router/node/adminguard.py); the operator
log records the caller's principal (:func:`audit_identity`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from idl.generated import NsjmsAdmin, NsjmsAdmin__POA
from router.routing.t2.ops import Refused, TxnOps
from router.security.auth import audit_identity as principal_name

__all__ = ["TRANSACTION_ADMIN_KEY", "TransactionAdminImpl", "node_ops"]

log = logging.getLogger("nsjms.txn")

TRANSACTION_ADMIN_KEY = "TransactionAdmin"


def node_ops(t2: Any, state_dir: Any) -> TxnOps:
    """:class:`TxnOps` over a running node's :class:`router.routing.t2.transactions.NodeTransactions`: a recovery pass
    and an operator's decision go through the node (``recover_now``, ``resolve``), which count them and fill the ledger
    hops."""

    def rows() -> Any:
        return t2.db.unit_of_work()

    return TxnOps(t2.node.value, state_dir, t2.log, t2.pg, rows, t2.recovery, mode="online",
                  guard_s=t2.recovery.guard, in_flight=t2.coordinator.in_flight, serial=t2.recovery_lock,
                  run=t2.recover_now, resolve=t2.resolve, broker_check=t2.broker_problem)


class TransactionAdminImpl(NsjmsAdmin__POA.TransactionAdmin):
    def __init__(self, ops: TxnOps) -> None:
        self.ops = ops
        self.ref: Any = None

    def activate(self, ins_poa: Any) -> Any:
        ins_poa.activate_object_with_id(TRANSACTION_ADMIN_KEY.encode(), self)
        self.ref = ins_poa.id_to_reference(TRANSACTION_ADMIN_KEY.encode())
        return self.ref

    def _call(self, what: str, fn: Callable[[], Any]) -> str:
        try:
            return json.dumps(fn(), sort_keys=True)
        except Refused as exc:
            raise NsjmsAdmin.TransactionRefused(str(exc)) from None
        except Exception as exc:  # reported to the operator as a refusal with the cause, and logged
            log.exception("nsjms txn %s failed", what)
            raise NsjmsAdmin.TransactionRefused(f"{what} failed in the router: {type(exc).__name__}: {exc}") from None

    def list_json(self) -> str:
        return self._call("list", lambda: self.ops.listing().as_dict())

    def show_json(self, gtrid: str) -> str:
        return self._call("show", lambda: self.ops.show(gtrid).as_dict())

    def resolve(self, gtrid: str, action: str, who: str, why: str) -> str:
        return self._call(action, lambda: self.ops.resolve(gtrid, action, audit_identity(), why))

    def resolve_xid(self, gid: str, action: str, who: str, why: str) -> str:
        return self._call(f"{action} --xid", lambda: self.ops.resolve_xid(gid, action, audit_identity(), why))

    def forget(self, gtrid: str, who: str) -> str:
        return self._call("forget", lambda: self.ops.forget(gtrid, audit_identity()))

    def recover(self) -> str:
        return self._call("recover", lambda: self.ops.recover(audit_identity()))   # logged as the principal


def audit_identity() -> str:
    """Who the operator log records: the authenticated principal (:func:`router.security.auth.audit_identity`); the
    ``who`` argument the caller sends is kept in the IDL for compatibility and ignored."""

    return principal_name(NsjmsAdmin.TransactionRefused)
