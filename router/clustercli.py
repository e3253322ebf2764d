"""``nsjms cluster status [--json]``: the cluster's members, leases, epochs, owned channels and bridges, and
in-doubt routing transactions per node, read from the shared PostgreSQL (router/cluster/report.py,
docs/cluster.md). Works whether or not a node runs here: it needs only ``postgres.dsn`` (or this state directory's
embedded PostgreSQL while it runs). Every session is read-only."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]

EXIT_OK, EXIT_FAILURE, EXIT_NOT_RUNNING = 0, 1, 3


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    cluster = sub.add_parser("cluster", parents=[common],
                             help="the nodes sharing this node's PostgreSQL: members, leases, epochs, what each owns")
    csub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="{status}")
    csub.add_parser("status", parents=[common],
                    help="members (state, epoch, lease left, last renewal, address), owned channels and bridges, "
                         "in-doubt routing transactions per node")


def _dsn(cfg: Any, state_dir: Path) -> str | None:
    if cfg.postgres.dsn:
        return str(cfg.postgres.dsn)
    from router.services import EmbeddedPostgres

    embedded = EmbeddedPostgres(state_dir, cfg.postgres.embedded_port)
    running = embedded._running_port()
    if running is None:
        return None
    embedded.port = running
    return embedded._make_dsn()


def run(args: argparse.Namespace, cfg: Any) -> int:
    import psycopg

    from router.cluster.report import cluster_report, render
    from router.config import redact_dsn
    from router.db.conninfo import connect

    state_dir = Path(cfg.node.state_dir).resolve()
    dsn = _dsn(cfg, state_dir)
    if dsn is None:
        print(f"nsjms cluster: postgres.dsn is not set and no embedded PostgreSQL runs in {state_dir}: nothing to "
              "read (set postgres.dsn, the database the nodes share)", file=sys.stderr)
        return EXIT_NOT_RUNNING
    try:
        with connect(dsn, autocommit=True, connect_timeout=max(1, int(cfg.postgres.connect_timeout_s)),
                     options="-c default_transaction_read_only=on") as conn:
            report = cluster_report(conn)
    except psycopg.errors.UndefinedTable:
        print(f"nsjms cluster: postgres.dsn {redact_dsn(dsn)}: no cluster tables (no node of this version has "
              "started on this database)", file=sys.stderr)
        return EXIT_NOT_RUNNING
    except psycopg.Error as exc:
        print(f"nsjms cluster: postgres.dsn {redact_dsn(dsn)}: {redact_dsn(str(exc).strip())}", file=sys.stderr)
        return EXIT_FAILURE
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else render(report))
    return EXIT_OK
