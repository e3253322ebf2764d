"""Whether a PostgreSQL server can carry the branches of routing transactions (T2): ``PREPARE TRANSACTION`` needs
``max_prepared_transactions`` above 0. Asked by the node at start (``router.node.watches``) and by a bridge when a
client enables transactions (``router.bridge.txmgmt``); both word the refusal with
:func:`prepared_transactions_problem`.
"""

from __future__ import annotations

__all__ = ["max_prepared_transactions", "prepared_transactions_problem"]


def prepared_transactions_problem(value: int) -> str | None:
    """Why PostgreSQL's ``max_prepared_transactions`` cannot carry routing transactions (T2), or None. Pure."""
    if value > 0:
        return None
    return (f"PostgreSQL's max_prepared_transactions is {value} (its default): every routing transaction (T2) "
            "would fail at PREPARE TRANSACTION and roll back forever; set max_prepared_transactions (e.g. 64, "
            "see docs/transactions.md) in postgresql.conf and restart PostgreSQL")


def max_prepared_transactions(dsn: str, timeout: float) -> int | None:
    """The server's ``max_prepared_transactions``, or None when it cannot be read (reachability is probed apart)."""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=max(1, int(timeout)), autocommit=True) as conn:
            row = conn.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()
    except psycopg.Error:
        return None
    return None if row is None else int(row[0])
