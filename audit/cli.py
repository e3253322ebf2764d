"""``nsjms ledger …`` and ``nsjms audit``: argument parsing and dispatch.

Imports nothing heavy at module level: pyarrow, pyspark, matplotlib and tqdm are imported inside the
commands that need them (the ``audit`` extra), so ``nsjms serve`` never loads them.

Exit codes: 0 OK; 1 runtime failure (database or Spark error); 2 usage error (bad option, missing extra);
7 (:data:`EXIT_VIOLATION`) the audit found more lost or duplicated deliveries than ``--max-lost`` /
``--max-duplicates`` allow (default 0: the guarantees allow none).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from audit import AuditError, LedgerError, UsageError

__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "EXIT_VIOLATION", "add_parsers", "main", "parse_time", "run"]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_VIOLATION = 0, 1, 2, 7  # 7: distinct from every other nsjms exit code


def parse_time(text: str) -> datetime:
    """ISO 8601 date or date-time; without a zone it is UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 date or date-time: {text!r}") from exc
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _db_flags(p: argparse.ArgumentParser, with_config: bool = True) -> None:
    if with_config:  # under `nsjms`, --config is one of the global options
        p.add_argument("--config", default=None,
                       help="TOML configuration file (or $NSJMS_CONFIG); gives postgres.dsn")
    p.add_argument("--pg-dsn", default=None, help="PostgreSQL DSN (prefer NSJMS_POSTGRES_DSN for DSNs with passwords)")


def add_parsers(sub: Any, common: argparse.ArgumentParser | None = None) -> None:
    """Register ``ledger`` and ``audit`` on the ``nsjms`` sub-parser set.

    ``common`` holds nsjms's global options (``--config``, ``--state-dir``, ``--json``), accepted after the
    subcommand too; without it (``spark-submit audit/cli.py``) the commands take ``--config`` themselves.
    """
    parents = [common] if common is not None else []
    led = sub.add_parser("ledger", parents=parents,
                         help="the delivery ledger: init, maintain partitions, export, generate")
    lsub = led.add_subparsers(dest="ledger_command", required=True)
    init = lsub.add_parser("init", parents=parents,
                           help="bring the nsjms schema (with the ledger) up to date and create the first partitions")
    maint = lsub.add_parser("maintain", parents=parents,
                            help="create the coming days' partitions, drop those past retention")
    for p in (init, maint):
        _db_flags(p, not parents)
        p.add_argument("--retention-days", type=int, default=None,
                       help="default: ledger.retention_days of the configuration (30)")
        p.add_argument("--ahead-days", type=int, default=None, help="default: ledger.ahead_days (3)")
    exp = lsub.add_parser("export", parents=parents, help="write ledger rows as Parquet, one directory per UTC day")
    _db_flags(exp, not parents)
    exp.add_argument("--from", dest="start", type=parse_time, required=True)
    exp.add_argument("--to", dest="end", type=parse_time, required=True)
    exp.add_argument("--out", type=Path, required=True)
    _generate_parser(lsub, parents)
    _audit_parser(sub, parents)


def _generate_parser(lsub: Any, parents: list[argparse.ArgumentParser]) -> None:
    gen = lsub.add_parser("generate", parents=parents, help="a deterministic synthetic ledger with injected faults")
    _db_flags(gen, not parents)
    gen.add_argument("--deliveries", type=int, required=True, help="delivery obligations (about 2 rows each)")
    gen.add_argument("--seed", type=int, default=1)
    gen.add_argument("--start", type=parse_time, default=datetime(2026, 1, 1, tzinfo=UTC))
    gen.add_argument("--rate", type=float, default=500.0, help="obligations accepted per second")
    for name in ("lost", "duplicates", "in-doubt", "dead-letters"):
        gen.add_argument(f"--{name}", type=int, default=0)
    gen.add_argument("--nodes", type=int, default=1, help="nodes writing the rows (node1, node2, ...)")
    gen.add_argument("--resent", type=int, default=0,
                     help="channel → JMS obligations re-sent by a survivor at a takeover (allowed, not a violation)")
    gen.add_argument("--cross-node-duplicates", type=int, default=0,
                     help="channel → JMS obligations delivered again by a survivor in a transaction of its own")
    gen.add_argument("--out", type=Path, default=None, help="write Parquet by day here")
    gen.add_argument("--to-db", action="store_true", help="COPY into the ledger at --pg-dsn (schema must exist)")


def _audit_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    a = sub.add_parser("audit", parents=parents,
                       help="reconcile the ledger on Spark: losses, duplicates, latency, throughput")
    _db_flags(a, not parents)
    a.add_argument("--from", dest="start", type=parse_time, default=None, help="accepted_at >= this (UTC)")
    a.add_argument("--to", dest="end", type=parse_time, default=None, help="accepted_at < this (UTC)")
    a.add_argument("--source", choices=["jdbc", "parquet"], default=None,
                   help="default: parquet when --parquet is given, else jdbc")
    a.add_argument("--parquet", type=Path, default=None, help="a `nsjms ledger export` directory")
    a.add_argument("--master", default=None, help="Spark master URL (default local[*]; spark://host:7077 …)")
    a.add_argument("--out", type=Path, default=None, help="the report's directory (required unless --incremental)")
    a.add_argument("--incremental", action="store_true",
                   help="reconcile in PostgreSQL only the ledger days not audited yet or changed since, keep each "
                        "day's verdict in the node's database (no Spark, no report; docs/audit.md)")
    a.add_argument("--if-running", action="store_true",
                   help="with the embedded PostgreSQL and the node stopped, do nothing (exit 0) instead of starting "
                        "it for the command (the scheduled audit: deploy/nsjms-audit.service)")
    a.add_argument("--metrics-file", type=Path, default=None,
                   help="with --incremental: write per-bridge results as a Prometheus textfile (node_exporter), "
                        "atomically")
    a.add_argument("--as-of", type=parse_time, default=None, help="judge losses as of this time (default now)")
    a.add_argument("--grace", type=float, default=300.0, help="seconds before an undelivered item is lost")
    a.add_argument("--max-lost", type=int, default=0)
    a.add_argument("--max-duplicates", type=int, default=0)
    a.add_argument("--jdbc-partitions", type=int, default=8)
    a.add_argument("--jdbc-jar", default=os.environ.get("NSJMS_JDBC_JAR", "/usr/share/java/postgresql.jar"))
    a.add_argument("--driver-memory", default="1g")
    a.add_argument("--shuffle-partitions", type=int, default=8)


def _database(args: argparse.Namespace, cfg: Any, *, write: bool) -> Any:
    """The node's database for this command (a context manager giving its DSN): :mod:`audit.nodedb`."""
    from audit.nodedb import node_database

    return node_database(args.pg_dsn, cfg, write=write, start=not getattr(args, "if_running", False))


def run(args: argparse.Namespace, cfg: Any = None) -> int:
    """Run a parsed ``ledger`` or ``audit`` command; ``cfg`` is nsjms's loaded configuration (or None)."""
    try:
        if args.command == "audit":
            return _audit(args, cfg)
        return _LEDGER[args.ledger_command](args, cfg)
    except UsageError as exc:
        print(f"nsjms {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except AuditError as exc:
        print(f"nsjms {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def _maintain(args: argparse.Namespace, cfg: Any, init: bool = False) -> int:
    import psycopg

    from audit import ledger

    configured = getattr(cfg, "ledger", None)
    retention = args.retention_days if args.retention_days is not None else (
        configured.retention_days if configured is not None else 30)
    ahead = args.ahead_days if args.ahead_days is not None else (configured.ahead_days if configured is not None else 3)
    settings = ledger.RetentionSettings(retention_days=retention, ahead_days=ahead)
    try:
        with _database(args, cfg, write=True) as dsn, psycopg.connect(dsn) as conn:
            if init:
                applied = ledger.install_schema(conn)
                print(f"schema migrations applied: {', '.join(map(str, applied)) or 'none (up to date)'}")
            created, dropped = ledger.maintain(conn, settings)
    except psycopg.OperationalError as exc:
        raise AuditError(f"cannot connect to PostgreSQL: {exc}") from exc
    print(f"partitions created: {', '.join(map(str, created)) or 'none'}; "
          f"dropped: {', '.join(map(str, dropped)) or 'none'}")
    return EXIT_OK


def _init(args: argparse.Namespace, cfg: Any) -> int:
    return _maintain(args, cfg, init=True)


def _export(args: argparse.Namespace, cfg: Any) -> int:
    from audit.export import export_days

    with _database(args, cfg, write=False) as dsn:
        result = export_days(dsn, args.start, args.end, args.out)
    if result.rows == 0:
        print(f"the window {args.start.isoformat()} .. {args.end.isoformat()} has no ledger rows: wrote one empty day "
              f"file under {args.out} (an audit of it reports an empty window)")
    else:
        print(f"exported {result.rows} rows into {len(result.files)} day file(s) under {args.out}")
    return EXIT_OK


def _generate(args: argparse.Namespace, cfg: Any) -> int:
    from audit import synth

    if args.out is None and not args.to_db:
        raise UsageError("give --out DIR and/or --to-db")
    spec = synth.SynthSpec(deliveries=args.deliveries, seed=args.seed, start=args.start, rate_per_s=args.rate,
                           lost=args.lost, duplicates=args.duplicates, in_doubt=args.in_doubt,
                           dead_letters=args.dead_letters, nodes=args.nodes, resent=args.resent,
                           cross_node_duplicates=args.cross_node_duplicates)
    table, truth = synth.generate(spec)
    if args.out is not None:
        synth.write_parquet(table, args.out)
    if args.to_db:
        import psycopg

        try:
            with _database(args, cfg, write=True) as dsn, psycopg.connect(dsn) as conn:
                synth.copy_to_postgres(table, conn)
        except psycopg.Error as exc:
            raise LedgerError("copy synthetic rows into the ledger", f"{type(exc).__name__}: {exc}") from exc
    print(f"generated {table.num_rows} rows ({args.deliveries} obligations): lost {len(truth.lost)}, "
          f"duplicated {len(truth.duplicated)}, in doubt {len(truth.in_doubt)}, "
          f"dead letters {sum(truth.dead_letters.values())}, re-sent at a takeover {len(truth.resent)}")
    return EXIT_OK


_LEDGER = {"init": _init, "maintain": _maintain, "export": _export, "generate": _generate}


def _audit(args: argparse.Namespace, cfg: Any) -> int:
    if args.incremental:
        return _incremental(args, cfg)
    if args.metrics_file is not None:
        raise UsageError("--metrics-file needs --incremental")
    if args.out is None:
        raise UsageError("--out DIR is required (the report's directory)")
    source: Literal["jdbc", "parquet"] = "parquet" if (args.source or (
        "parquet" if args.parquet is not None else "jdbc")) == "parquet" else "jdbc"
    if source == "parquet":
        return _spark_audit(args, source, "")
    with _database(args, cfg, write=False) as dsn:
        return _spark_audit(args, source, dsn)


def _incremental(args: argparse.Namespace, cfg: Any) -> int:
    from audit.incremental import run_incremental
    from audit.incremental_report import render, write_outputs

    if args.parquet is not None or args.source == "parquet":
        raise UsageError("--incremental reads the node's database, not an export (--parquet)")
    if args.grace < 0:
        raise UsageError("--grace must be >= 0")
    from audit.nodedb import NodeStopped

    try:
        with _database(args, cfg, write=True) as dsn:
            result = run_incremental(dsn, as_of=args.as_of or datetime.now(UTC),
                                     grace=timedelta(seconds=args.grace),
                                     start=args.start, end=args.end)
    except NodeStopped as exc:
        print(f"nsjms audit: {exc}")
        return EXIT_OK
    write_outputs(result, metrics=args.metrics_file, out=args.out)
    print(render(result))
    lost, dup = result.count("lost"), result.count("duplicated")
    if lost > args.max_lost or dup > args.max_duplicates:
        print(f"audit: VIOLATION: lost {lost} (allowed {args.max_lost}), duplicated {dup} "
              f"(allowed {args.max_duplicates})", file=sys.stderr)
        return EXIT_VIOLATION
    return EXIT_OK


def _spark_audit(args: argparse.Namespace, source: Literal["jdbc", "parquet"], dsn: str) -> int:
    from audit.job import AuditRequest, run_audit

    req = AuditRequest(
        out=args.out, source=source, parquet=args.parquet, dsn=dsn,
        start=args.start, end=args.end, master=args.master, as_of=args.as_of or datetime.now(UTC),
        grace=timedelta(seconds=args.grace), max_lost=args.max_lost, max_duplicates=args.max_duplicates,
        jdbc_partitions=args.jdbc_partitions, jdbc_jar=args.jdbc_jar, driver_memory=args.driver_memory,
        shuffle_partitions=args.shuffle_partitions, progress=sys.stdout.isatty())
    try:
        result = run_audit(req)
    except AuditError:
        raise
    except Exception as exc:  # noqa: BLE001 - Spark/py4j raise many types; report and fail with code 1
        print(f"nsjms audit: Spark job failed: {type(exc).__name__}: {str(exc)[:2000]}", file=sys.stderr)
        return EXIT_FAILURE
    s = result.summary
    print(f"audit: {s['obligations']} obligations, lost {s['lost']}, duplicated {s['duplicated']}, "
          f"re-sent at a takeover (allowed) {s['resent']}, "
          f"stuck in doubt {s['stuck_in_doubt']}, dead letters {sum(s['dead_letters'].values())}; "
          f"report {args.out / 'report.html'}")
    if result.violations:
        print("audit: VIOLATION: " + "; ".join(result.violations), file=sys.stderr)
        return EXIT_VIOLATION
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m audit.cli audit …`` or ``spark-submit audit/cli.py audit …`` (same options as ``nsjms``)."""
    p = argparse.ArgumentParser(prog="nsjms-audit")
    add_parsers(p.add_subparsers(dest="command", required=True))
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
