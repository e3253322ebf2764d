"""``nsjms cluster status|drain NODE|rebalance [--json]`` (docs/cluster.md, "Placement and operations").

``status``: the cluster's members, leases, epochs, owned channels and bridges, and in-doubt routing transactions per
node, read from the shared PostgreSQL (router/cluster/report.py); its session is read-only. ``drain NODE``: hand
every channel (with its bridges) of ``NODE`` to the other live members by drain-and-handoff and wait until each runs
on its new owner; the result is ``clean`` (exit 0), ``dirty`` (routing transactions of the node left in doubt,
listed; exit 9), ``heuristic`` (a heuristic outcome in its log; exit 10) or ``failed`` (a move failed, the node
died, or ``--timeout`` passed; exit 1). ``rebalance``: even out the live members' loads the same way (a node that
joined gets its share) and wait for the moves. Both write requests into PostgreSQL (``nsjms_handoff``, migration
0010) which the nodes carry out at their next renewal period: no admin port is needed. All work from any machine
with ``postgres.dsn`` (or this state directory's embedded PostgreSQL while it runs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]

EXIT_OK, EXIT_FAILURE, EXIT_NOT_RUNNING, EXIT_REFUSED = 0, 1, 3, 4
EXIT_DIRTY, EXIT_HEURISTIC = 9, 10       # drain: routing transactions left in doubt / a heuristic outcome
DEFAULT_TIMEOUT_S = 300.0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    cluster = sub.add_parser("cluster", parents=[common],
                             help="the nodes sharing this node's PostgreSQL: members, leases, epochs, what each owns")
    csub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="{status,drain,rebalance}")
    csub.add_parser("status", parents=[common],
                    help="members (state, epoch, lease left, last renewal, address), owned channels and bridges, "
                         "in-doubt routing transactions per node")
    drain = csub.add_parser("drain", parents=[common],
                            help="hand NODE's channels and bridges to the other live members (drain-and-handoff) "
                                 "and report clean (exit 0) / dirty (9) / heuristic (10) / failed (1)")
    drain.add_argument("node", metavar="NODE", help="the node.node_id to drain")
    drain.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                       help=f"seconds to wait for the hand-offs (default {DEFAULT_TIMEOUT_S:g})")
    rebalance = csub.add_parser("rebalance", parents=[common],
                                help="even out the live members' loads (objects owned) by drain-and-handoff")
    rebalance.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                           help=f"seconds to wait for the hand-offs (default {DEFAULT_TIMEOUT_S:g})")


def _dsn(cfg: Any, state_dir: Path) -> str | None:
    if cfg.postgres.dsn:
        return str(cfg.postgres.dsn)
    from router.node.services import EmbeddedPostgres

    embedded = EmbeddedPostgres(state_dir, cfg.postgres.embedded_port)
    running = embedded._running_port()
    if running is None:
        return None
    embedded.port = running
    return embedded._make_dsn()


def run(args: argparse.Namespace, cfg: Any) -> int:
    import psycopg

    from router.cluster.report import cluster_report, render
    from router.db.conninfo import connect
    from router.node.config import redact_dsn

    state_dir = Path(cfg.node.state_dir).resolve()
    dsn = _dsn(cfg, state_dir)
    if dsn is None:
        print(f"nsjms cluster: postgres.dsn is not set and no embedded PostgreSQL runs in {state_dir}: nothing to "
              "read (set postgres.dsn, the database the nodes share)", file=sys.stderr)
        return EXIT_NOT_RUNNING
    if args.cluster_command in ("drain", "rebalance"):
        from router.cli.clusterops import run_handoff

        return run_handoff(args, dsn, max(1, int(cfg.postgres.connect_timeout_s)))
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
