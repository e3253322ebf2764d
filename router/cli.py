"""The ``nsjms`` command line: ``serve``, ``status``, ``bridge``, ``demo``.

Exit codes: 0 OK, 1 runtime failure, 2 usage or configuration error (the message names the key or option), 3 the
node is not running / not reachable, 4 the node refused the request (the message says why).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

__all__ = ["main", "EXIT_OK", "EXIT_FAILURE", "EXIT_CONFIG", "EXIT_NOT_RUNNING"]

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG, EXIT_NOT_RUNNING = 0, 1, 2, 3

log = logging.getLogger("nsjms")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nsjms", description="CORBA Notification Service ⇄ JMS routing engine")
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run a node (embedded PostgreSQL and ActiveMQ unless given)")
    _config_flags(serve)
    serve.add_argument("--demo", action="store_true", help="also run a demo supplier and consumer with visible traffic")
    serve.add_argument("--demo-rate", type=float, default=2.0, help="demo events per second (default 2)")
    serve.add_argument("--demo-count", type=int, default=0, help="stop the demo after N events (0 = run until stopped)")

    status = sub.add_parser("status", help="show a running node's endpoints, channels and queues")
    status.add_argument("--state-dir", type=Path, default=None)
    status.add_argument("--config", default=None)
    status.add_argument("--json", action="store_true", help="machine-readable output")

    from router.bridgecli import add_parser as add_bridge_parser

    add_bridge_parser(sub)
    from audit.cli import add_parsers as add_audit_parsers  # ledger + audit (heavy imports stay inside)

    add_audit_parsers(sub)

    demo = sub.add_parser("demo", help="push demo events through a running node and print them")
    demo.add_argument("--state-dir", type=Path, default=None)
    demo.add_argument("--config", default=None)
    demo.add_argument("--rate", type=float, default=2.0)
    demo.add_argument("--count", type=int, default=0)
    return p


def _config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="TOML configuration file (or $NSJMS_CONFIG)")
    p.add_argument("--state-dir", type=Path, default=None, help="state directory (default ./.nsjms)")
    p.add_argument("--node-id", default=None)
    p.add_argument("--orb-host", default=None, help="IIOP listen address (default 127.0.0.1)")
    p.add_argument("--orb-port", type=int, default=None, help="IIOP listen port (default 2809)")
    p.add_argument("--pg-dsn", default=None,
                   help="PostgreSQL DSN (default: embedded cluster); prefer NSJMS_POSTGRES_DSN for DSNs with passwords")
    p.add_argument("--broker-url", default=None, help="STOMP broker URL (default: embedded ActiveMQ)")
    p.add_argument("--log-level", default=None)


def _load(args: argparse.Namespace) -> Any:
    from router.config import load_config

    overrides = {
        "node.state_dir": str(args.state_dir) if getattr(args, "state_dir", None) else None,
        "node.node_id": getattr(args, "node_id", None),
        "node.log_level": getattr(args, "log_level", None),
        "orb.host": getattr(args, "orb_host", None),
        "orb.port": getattr(args, "orb_port", None),
        "postgres.dsn": getattr(args, "pg_dsn", None),
        "broker.url": getattr(args, "broker_url", None),
    }
    return load_config(args.config, overrides={k: v for k, v in overrides.items() if v is not None})


def _settings(cfg: Any) -> Any:
    from router.server import NodeSettings

    return NodeSettings(
        state_dir=Path(cfg.node.state_dir).resolve(),
        orb_host=cfg.orb.host,
        orb_port=cfg.orb.port,
        orb_max_threads=cfg.orb.max_threads,
        pg_dsn=cfg.postgres.dsn,
        pg_embedded_port=cfg.postgres.embedded_port,
        pg_pool_size=cfg.postgres.pool_size,
        broker_url=cfg.broker.url,
        broker_login=cfg.broker.login,
        broker_passcode=cfg.broker.passcode,
        broker_stomp_port=cfg.broker.embedded_stomp_port,
        broker_openwire_port=cfg.broker.embedded_openwire_port,
        node_id=cfg.node.node_id,
    )


def cmd_serve(args: argparse.Namespace, cfg: Any) -> int:
    from router.server import Node

    from router.telemetry import configure

    flush_telemetry = configure(cfg.telemetry.exporter, cfg.telemetry.interval_s, service_name=cfg.node.node_id)
    node = Node(_settings(cfg))
    try:
        node.start()
    except Exception as exc:  # noqa: BLE001 — report the cause and stop what was started
        log.error("nsjms serve failed to start: %s", exc)
        node.stop()
        return EXIT_FAILURE
    print(f"nsjms: node {cfg.node.node_id} serving; endpoints in {node.s.state_dir / 'endpoints.json'}", flush=True)
    demo = _start_demo(args, node.s.state_dir) if args.demo else None
    try:
        node.wait()
    finally:
        if demo is not None and demo.poll() is None:
            demo.terminate()
        node.stop()
        flush_telemetry()
    return EXIT_OK


def _start_demo(args: argparse.Namespace, state_dir: Path) -> subprocess.Popen[bytes]:
    """The demo is an independent client process (its own ORB), as a real application would be."""
    cmd = [sys.executable, "-m", "router.cli", "demo", "--state-dir", str(state_dir),
           "--rate", str(args.demo_rate), "--count", str(args.demo_count)]
    return subprocess.Popen(cmd)


def cmd_demo(args: argparse.Namespace, cfg: Any) -> int:
    from router.demo import run_demo

    state_dir = Path(cfg.node.state_dir)
    if not (state_dir / "endpoints.json").exists():
        print(f"nsjms demo: no running node ({state_dir / 'endpoints.json'} missing)", file=sys.stderr)
        return EXIT_NOT_RUNNING
    stop = threading.Event()
    try:
        received = run_demo(state_dir, rate=args.rate, count=args.count, stop=stop)
    except KeyboardInterrupt:
        stop.set()
        return EXIT_OK
    return EXIT_OK if args.count == 0 or received >= args.count else EXIT_FAILURE


def cmd_status(args: argparse.Namespace, cfg: Any) -> int:
    from router.status import collect

    state_dir = Path(cfg.node.state_dir)
    try:
        report = collect(state_dir)
    except FileNotFoundError:
        print(f"nsjms status: no running node ({state_dir / 'endpoints.json'} missing)", file=sys.stderr)
        return EXIT_NOT_RUNNING
    except ConnectionError as exc:
        print(f"nsjms status: node not reachable: {exc}", file=sys.stderr)
        return EXIT_NOT_RUNNING
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        from router.status import render

        print(render(report))
    return EXIT_OK


def cmd_bridge(args: argparse.Namespace, cfg: Any) -> int:
    from router.bridgecli import UsageError, run

    state_dir = Path(cfg.node.state_dir)
    if not (state_dir / "endpoints.json").exists():
        print(f"nsjms bridge: no running node ({state_dir / 'endpoints.json'} missing)", file=sys.stderr)
        return EXIT_NOT_RUNNING
    try:
        return run(args, state_dir)
    except UsageError as exc:
        print(f"nsjms bridge: {exc}", file=sys.stderr)
        return EXIT_CONFIG


def cmd_audit(args: argparse.Namespace, cfg: Any) -> int:
    from audit.cli import run

    return run(args, cfg)


def main(argv: Sequence[str] | None = None) -> int:
    from router.config import ConfigError

    args = _parser().parse_args(argv)
    try:
        cfg = _load(args)
    except ConfigError as exc:
        print(f"nsjms: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(level=getattr(logging, cfg.node.log_level, logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers = {"serve": cmd_serve, "status": cmd_status, "demo": cmd_demo, "bridge": cmd_bridge,
                "ledger": cmd_audit, "audit": cmd_audit}
    return handlers[args.command](args, cfg)


if __name__ == "__main__":
    sys.exit(main())
