"""Stand-ins shared by the routing-transaction (T2) node tests: the broker send branch of a T2 and the crash it can
simulate (tests/integration/test_t2_node.py, test_txn_cli_node.py, test_t2_hops_races.py)."""

from __future__ import annotations

from psycopg import Xid

from router.routing.t2.transactions import SEND_MANAGER

__all__ = ["Crash", "SendBranch"]


class Crash(BaseException):
    """The process dies here."""


class SendBranch:
    """A one-phase participant standing in for the broker send branch (its COMMIT is receipted); with ``crash``,
    the process dies when its commit is reached (:class:`Crash` with that text)."""

    kind, manager, one_phase_only, name = "stomp-send", SEND_MANAGER, True, "stomp"

    def __init__(self, crash: str | None = None) -> None:
        self.crash = crash

    def sort_key(self) -> str:
        return "z"

    def begin(self, xid: Xid) -> None:
        return None

    def prepare(self) -> None:
        return None

    def commit(self) -> None:
        if self.crash is not None:
            raise Crash(self.crash)

    def rollback(self) -> None:
        return None
