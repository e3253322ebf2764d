"""Persistence of the node: one connection pool, units of work, numbered schema migrations.

:class:`Database` owns the pool and translates psycopg's errors (:mod:`router.db.errors`); the stores
(``router.channel.store``, ``router.bridge.store``, the filter repository) take a connection from a unit of work
their caller opened; :mod:`router.db.migrate` brings the schema up to date at start.
"""

from router.db.database import Database, FenceToken, StatementFence
from router.db.errors import SchemaError, StoreError, StoreTimeout, StoreUnavailable, WriteFenced

__all__ = ["Database", "FenceToken", "SchemaError", "StatementFence", "StoreError", "StoreTimeout", "StoreUnavailable",
           "WriteFenced"]
