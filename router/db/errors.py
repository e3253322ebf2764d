"""The persistence layer's exceptions: the one tree psycopg's errors become (see :mod:`router.db.database`)::

    StoreError                  the database refused the operation (a bug or a schema problem)
    ├── StoreUnavailable        the database could not be reached in time (no connection within the checkout
    │                           timeout, connection lost); ``in_doubt`` when the connection broke during COMMIT
    │   └── WriteFenced         this node may not make the write any more: its epoch was taken over (fenced) or the
    │                           object moved to another node; nothing written. To a client it is an outage of this
    │                           node's store (TRANSIENT, COMPLETED_NO): it retries, and reaches the new owner
    ├── StoreTimeout            the database is reachable but cancelled a statement: ``statement_timeout``,
    │                           ``lock_timeout`` or an operator's ``pg_cancel_backend`` (QueryCanceled,
    │                           LockNotAvailable); nothing committed, the connection is fine. Not an outage: a
    │                           retry may succeed (load, a lock held a while) or meet the same limit (a statement
    │                           too slow for it), so it is reported apart
    └── SchemaError             the database's schema cannot be used by this version (tampered or unknown
                                migration, a half-created schema); the node refuses to start
"""

from __future__ import annotations

from typing import Any

__all__ = ["SchemaError", "StoreError", "StoreTimeout", "StoreUnavailable", "WriteFenced"]


class StoreError(RuntimeError):
    """The database refused an operation; nothing of it was committed."""


class StoreUnavailable(StoreError):
    """The database could not be reached in time or the connection broke.

    ``in_doubt`` is True only when the connection broke while the transaction was being committed: then the
    caller cannot know whether it was committed. Otherwise nothing of the operation was committed.
    """

    def __init__(self, message: str, *, in_doubt: bool = False) -> None:
        super().__init__(message)
        self.in_doubt = in_doubt

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unavailable, (str(self), self.in_doubt))


class WriteFenced(StoreUnavailable):
    """The write's fence check refused it (docs/cluster.md): the node was fenced or no longer owns what it wrote to;
    nothing was written (never in doubt)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (WriteFenced, (str(self),))


class StoreTimeout(StoreError):
    """The database cancelled a statement (a statement or lock timeout, or an operator's cancel) on a working
    connection; nothing of the operation was committed. Not :class:`StoreUnavailable`: the database is up."""


class SchemaError(StoreError):
    """The schema found in the database does not match this version's migrations; nothing was changed."""


def _unavailable(message: str, in_doubt: bool) -> StoreUnavailable:
    return StoreUnavailable(message, in_doubt=in_doubt)
