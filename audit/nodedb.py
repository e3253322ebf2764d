"""The node's database for ``nsjms audit`` and ``nsjms ledger …``: found the way the other commands find the node.

In order:

1. a DSN given explicitly: ``--pg-dsn``, ``postgres.dsn`` of the configuration (``--config`` / ``$NSJMS_CONFIG``,
   ``$NSJMS_POSTGRES_DSN``) or ``$NSJMS_POSTGRES_DSN`` (also without a configuration, under ``spark-submit``);
2. else the embedded PostgreSQL of the node's state directory (``--state-dir`` / ``$NSJMS_STATE_DIR`` /
   ``node.state_dir`` / ``./.nsjms``):

   * a node runs there (it holds the state directory's lock): its embedded cluster, found by its ``postmaster.pid``,
     with the password of ``pg/password``;
   * no node runs: the state directory's lock is taken for the command (a node cannot start meanwhile, ``serve``
     exits 5) and the cluster is used as it is when it still runs, else started for the command and stopped after:
     :func:`router.cli.txn.offline_database`, the same code ``nsjms txn`` uses with the node stopped.

The DSN (it holds the password) is never printed or logged here; the Spark JDBC reader gets the password as a
separate option (:func:`audit.job.jdbc_options`), never in the URL or on a command line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from audit import AuditError, UsageError

__all__ = ["NodeStopped", "explicit_dsn", "node_database"]


class NodeStopped(AuditError):
    """``start=False`` and the node is stopped on the embedded default: nothing was touched."""


def explicit_dsn(pg_dsn: str | None, cfg: Any) -> str:
    """The DSN given explicitly (flag, configuration, environment), or ``""``."""
    dsn = pg_dsn or (cfg.postgres.dsn if cfg is not None else "") or os.environ.get("NSJMS_POSTGRES_DSN", "")
    return str(dsn)


@contextmanager
def node_database(pg_dsn: str | None, cfg: Any, *, write: bool, start: bool = True) -> Iterator[str]:
    """The DSN of the node's database for one command (see the module's text). Without ``write`` the sessions of
    a cluster started for the command are read-only. Without ``start`` a stopped node's embedded database is not
    used (:class:`NodeStopped`; the scheduled audit's ``--if-running``)."""
    dsn = explicit_dsn(pg_dsn, cfg)
    if dsn:
        yield dsn
        return
    if cfg is None:
        raise UsageError("the command needs a PostgreSQL DSN: give --pg-dsn, NSJMS_POSTGRES_DSN, postgres.dsn in "
                         "--config, or run under nsjms with the node's --state-dir")
    from router.node.lifecycle import StateDirLocked, StateLock

    state_dir = Path(cfg.node.state_dir)
    if not state_dir.is_dir():
        raise UsageError(f"no PostgreSQL DSN given and no state directory {state_dir.resolve()}: name the node's "
                         "with --state-dir (or $NSJMS_STATE_DIR), or give postgres.dsn")
    lock = StateLock(state_dir)
    try:
        lock.acquire()
    except StateDirLocked:
        yield _running_node(cfg, state_dir)
        return
    except PermissionError as exc:
        raise UsageError(f"the state directory {state_dir.resolve()} is not writable by this user ({exc}): run as "
                         "the node's user") from None
    try:
        if not start:
            raise NodeStopped(f"no node runs on {state_dir.resolve()} and no postgres.dsn is given: nothing done "
                              "(--if-running)")
        yield from _stopped_node(cfg, state_dir, write=write)
    finally:
        lock.release()


def _running_node(cfg: Any, state_dir: Path) -> str:
    from router.node.services import EmbeddedPostgres

    embedded = EmbeddedPostgres(state_dir, cfg.postgres.embedded_port)
    port = embedded._running_port()
    if port is None:
        raise UsageError(f"the node running on {state_dir.resolve()} has no embedded PostgreSQL running (it was "
                         "started with an external database?): give its postgres.dsn (--config, NSJMS_POSTGRES_DSN)")
    embedded.port = port
    try:
        return embedded._make_dsn()
    except PermissionError as exc:
        raise UsageError(f"the embedded PostgreSQL's password cannot be read ({exc}): run as the node's user") \
            from None


def _stopped_node(cfg: Any, state_dir: Path, *, write: bool) -> Iterator[str]:
    from router.cli.txn import Unavailable, offline_database

    try:
        with offline_database(cfg, state_dir, write=write) as dsn:
            yield dsn
    except Unavailable as exc:               # raised before the yield only (the audit never raises it)
        raise (UsageError(str(exc)) if exc.code == 2 else AuditError(str(exc))) from None
