"""``NsjmsAdmin::DeadLetterAdmin``: the running router answers ``nsjms deadletter`` over IIOP.

Activated next to ``TransactionAdmin`` on the node's INS POA under the key ``DeadLetterAdmin``
(``corbaloc::HOST:PORT/DeadLetterAdmin``, published in ``endpoints.json`` as ``dead_letter_admin``): the same
admin surface, so what guards one guards the other. It runs :class:`router.deadletter.ops.DeadLetterOps`; results
are JSON strings, a refusal is ``DeadLetterRefused(reason)``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from idl.generated import NsjmsAdmin, NsjmsAdmin__POA
from router.deadletter.ops import DeadLetterOps, Refused
from router.security.auth import audit_identity

__all__ = ["DEAD_LETTER_ADMIN_KEY", "DeadLetterAdminImpl", "dead_letter_admin"]

log = logging.getLogger("nsjms.deadletter")

DEAD_LETTER_ADMIN_KEY = "DeadLetterAdmin"


def dead_letter_admin(node: Any) -> DeadLetterAdminImpl:
    """The servant of a running :class:`router.node.server.Node` (its pool, channels, runtime and state directory)."""
    rt = node.runtime
    return DeadLetterAdminImpl(DeadLetterOps(node.s.node_id, node.s.state_dir, node.db, rt.dead_letters, node.factory,
                                             next_seq=rt.next_seq))


class DeadLetterAdminImpl(NsjmsAdmin__POA.DeadLetterAdmin):
    def __init__(self, ops: DeadLetterOps) -> None:
        self.ops = ops
        self.ref: Any = None

    def activate(self, ins_poa: Any) -> Any:
        ins_poa.activate_object_with_id(DEAD_LETTER_ADMIN_KEY.encode(), self)
        self.ref = ins_poa.id_to_reference(DEAD_LETTER_ADMIN_KEY.encode())
        return self.ref

    def _call(self, what: str, fn: Callable[[], Any]) -> str:
        try:
            return json.dumps(fn(), sort_keys=True)
        except Refused as exc:
            raise NsjmsAdmin.DeadLetterRefused(str(exc)) from None
        except Exception as exc:  # reported to the operator as a refusal with the cause, and logged
            log.exception("nsjms deadletter %s failed", what)
            raise NsjmsAdmin.DeadLetterRefused(f"{what} failed in the router: {type(exc).__name__}: {exc}") from None

    def list_json(self, channel: int, limit: int) -> str:
        return self._call("list", lambda: self.ops.listing(channel if channel >= 0 else None, limit or 1000))

    def show_json(self, id: int) -> str:  # noqa: A002 — the IDL's parameter name
        return self._call("show", lambda: self.ops.show(id))

    def retry(self, id: int, who: str) -> str:  # noqa: A002
        # the operator log records the authenticated principal, never the ``who`` the caller sends (issue 30)
        return self._call("retry", lambda: self.ops.retry(id, _principal()))

    def discard(self, id: int, who: str, why: str) -> str:  # noqa: A002
        return self._call("discard", lambda: self.ops.discard(id, _principal(), why))


def _principal() -> str:
    """Who the operator log records: the authenticated principal (:func:`router.security.auth.audit_identity`), never
    the ``who`` argument the caller sends (kept in the IDL and ignored, as for ``TransactionAdmin``)."""

    return audit_identity(NsjmsAdmin.DeadLetterRefused)
