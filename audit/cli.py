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
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--as-of", type=parse_time, default=None, help="judge losses as of this time (default now)")
    a.add_argument("--grace", type=float, default=300.0, help="seconds before an undelivered item is lost")
    a.add_argument("--max-lost", type=int, default=0)
    a.add_argument("--max-duplicates", type=int, default=0)
    a.add_argument("--jdbc-partitions", type=int, default=8)
    a.add_argument("--jdbc-jar", default=os.environ.get("NSJMS_JDBC_JAR", "/usr/share/java/postgresql.jar"))
    a.add_argument("--driver-memory", default="1g")
    a.add_argument("--shuffle-partitions", type=int, default=8)


def _dsn(args: argparse.Namespace, cfg: Any) -> str:
    dsn = args.pg_dsn or (cfg.postgres.dsn if cfg is not None else "") or os.environ.get("NSJMS_POSTGRES_DSN", "")
    return str(dsn)


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


def _need_dsn(args: argparse.Namespace, cfg: Any) -> str:
    dsn = _dsn(args, cfg)
    if not dsn:
        raise UsageError("no PostgreSQL DSN: give --pg-dsn, NSJMS_POSTGRES_DSN or postgres.dsn in --config")
    return dsn


def _maintain(args: argparse.Namespace, cfg: Any, init: bool = False) -> int:
    import psycopg

    from audit import ledger

    configured = getattr(cfg, "ledger", None)
    retention = args.retention_days if args.retention_days is not None else (
        configured.retention_days if configured is not None else 30)
    ahead = args.ahead_days if args.ahead_days is not None else (configured.ahead_days if configured is not None else 3)
    settings = ledger.RetentionSettings(retention_days=retention, ahead_days=ahead)
    try:
        with psycopg.connect(_need_dsn(args, cfg)) as conn:
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

    result = export_days(_need_dsn(args, cfg), args.start, args.end, args.out)
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
                           dead_letters=args.dead_letters)
    table, truth = synth.generate(spec)
    if args.out is not None:
        synth.write_parquet(table, args.out)
    if args.to_db:
        import psycopg

        try:
            with psycopg.connect(_need_dsn(args, cfg)) as conn:
                synth.copy_to_postgres(table, conn)
        except psycopg.Error as exc:
            raise LedgerError("copy synthetic rows into the ledger", f"{type(exc).__name__}: {exc}") from exc
    print(f"generated {table.num_rows} rows ({args.deliveries} obligations): lost {len(truth.lost)}, "
          f"duplicated {len(truth.duplicated)}, in doubt {len(truth.in_doubt)}, "
          f"dead letters {sum(truth.dead_letters.values())}")
    return EXIT_OK


_LEDGER = {"init": _init, "maintain": _maintain, "export": _export, "generate": _generate}


def _audit(args: argparse.Namespace, cfg: Any) -> int:
    from audit.job import AuditRequest, run_audit

    source: Literal["jdbc", "parquet"] = "parquet" if (args.source or (
        "parquet" if args.parquet is not None else "jdbc")) == "parquet" else "jdbc"
    req = AuditRequest(
        out=args.out, source=source, parquet=args.parquet, dsn=_dsn(args, cfg) if source == "jdbc" else "",
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
