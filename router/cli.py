"""The ``nsjms`` command line: ``serve``, ``status``, ``channel``, ``bridge``, ``demo``.

``--state-dir``, ``--config`` and ``--json`` are accepted before or after the subcommand. The state directory is
``--state-dir``, else ``$NSJMS_STATE_DIR``, else ``node.state_dir`` of the configuration (``--config``/
``$NSJMS_CONFIG`` file or ``$NSJMS_NODE_STATE_DIR``), else ``./.nsjms``.

Exit codes: 0 OK, 1 runtime failure, 2 usage or configuration error (the message names the key or option), 3 the
node is not running / not reachable, 4 the node refused the request (the message says why), 5 ``serve``: the state
directory is in use by a running node (nothing was touched), 6 ``serve``: PostgreSQL did not answer at start (the
message names ``postgres.dsn`` and the address, password redacted).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["EXIT_CONFIG", "EXIT_FAILURE", "EXIT_LOCKED", "EXIT_NOT_RUNNING", "EXIT_OK", "EXIT_UNREACHABLE", "main"]

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG, EXIT_NOT_RUNNING = 0, 1, 2, 3
EXIT_LOCKED, EXIT_UNREACHABLE = 5, 6  # 4 is the node refusing a request (bridgecli)

log = logging.getLogger("nsjms")


def _common() -> argparse.ArgumentParser:
    """Options every (sub)command accepts, before or after the subcommand name (defaults filled in by main)."""
    c = argparse.ArgumentParser(add_help=False)
    c.add_argument("--state-dir", type=Path, default=argparse.SUPPRESS,
                   help="the node's state directory (default: $NSJMS_STATE_DIR, else node.state_dir of the "
                        "configuration, else ./.nsjms)")
    c.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file (default: $NSJMS_CONFIG)")
    c.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    return c


GLOBAL_DEFAULTS: dict[str, Any] = {"state_dir": None, "config": None, "json": False}


def build_parser() -> argparse.ArgumentParser:
    """The whole ``nsjms`` command tree (also the source of ``docs/cli.md``, see :mod:`router.clidoc`)."""
    common = _common()
    p = argparse.ArgumentParser(prog="nsjms", parents=[common],
                                description="CORBA Notification Service ⇄ JMS routing engine")
    sub = p.add_subparsers(dest="command", required=True, metavar="{serve,status,channel,bridge,demo}")

    serve = sub.add_parser("serve", parents=[common],
                           help="run a node (embedded PostgreSQL and ActiveMQ unless given)")
    _config_flags(serve)
    serve.add_argument("--demo", action="store_true", help="also run a demo supplier and consumer with visible traffic")
    serve.add_argument("--demo-rate", type=float, default=2.0, help="demo events per second (default 2)")
    serve.add_argument("--demo-count", type=int, default=0, help="stop the demo after N events (0 = run until stopped)")

    sub.add_parser("status", parents=[common], help="show a running node's endpoints, channels, queues and bridges")

    from router.bridgecli import add_parser as add_bridge_parser
    from router.channelcli import add_parser as add_channel_parser

    add_channel_parser(sub, common)
    add_bridge_parser(sub, common)

    demo = sub.add_parser("demo", parents=[common],
                          help="push demo events through a running node and print them (restartable)")
    demo.add_argument("--rate", type=float, default=2.0, help="events per second (default 2)")
    demo.add_argument("--count", type=int, default=0, help="stop after N events (0 = run until interrupted)")
    progress = demo.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                          help="print every event (default when stdout is a terminal)")
    progress.add_argument("--quiet", dest="progress", action="store_false",
                          help="print only the summary (default when stdout is not a terminal)")
    return p


def _config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-id", default=None)
    p.add_argument("--orb-host", default=None, help="IIOP listen address (default 127.0.0.1)")
    p.add_argument("--orb-port", type=int, default=None, help="IIOP listen port (default 2809)")
    p.add_argument("--pg-dsn", default=None,
                   help="PostgreSQL DSN (default: embedded cluster); prefer NSJMS_POSTGRES_DSN for DSNs with passwords")
    p.add_argument("--broker-url", default=None, help="STOMP broker URL (default: embedded ActiveMQ)")
    p.add_argument("--log-level", default=None)


STATE_DIR_ENV = "NSJMS_STATE_DIR"


def _state_dir_override(args: argparse.Namespace) -> str | None:
    if args.state_dir:
        return str(args.state_dir)
    return os.environ.get(STATE_DIR_ENV) or None


def state_dir_origin(args: argparse.Namespace, cfg: Any) -> str:
    """Where the state directory came from, for messages: ``--state-dir``, ``$NSJMS_STATE_DIR``, config, default."""
    from router.config import NodeConfig

    if args.state_dir:
        return "from --state-dir"
    if os.environ.get(STATE_DIR_ENV):
        return f"from ${STATE_DIR_ENV}"
    if Path(cfg.node.state_dir) != NodeConfig().state_dir:
        return "from node.state_dir of the configuration"
    return f"the default ./.nsjms, relative to the current directory {Path.cwd()}"


def _load(args: argparse.Namespace) -> Any:
    from router.config import load_config

    overrides = {
        "node.state_dir": _state_dir_override(args),
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
        pg_connect_timeout_s=float(cfg.postgres.connect_timeout_s),
        broker_connect_timeout_s=float(cfg.broker.connect_timeout_s),
        node_id=cfg.node.node_id,
    )


def _no_node(command: str, state_dir: Path, origin: str) -> int:
    """No ``endpoints.json``: say where we looked and how to point elsewhere (exit 3)."""
    print(f"nsjms {command}: no running node: {state_dir.resolve() / 'endpoints.json'} is missing\n"
          f"  looked in {state_dir.resolve()} ({origin})\n"
          f"  name the node's state directory with --state-dir DIR, ${STATE_DIR_ENV}=DIR or node.state_dir in the "
          f"configuration file (--config FILE or $NSJMS_CONFIG)", file=sys.stderr)
    return EXIT_NOT_RUNNING


def _running(command: str, args: argparse.Namespace, cfg: Any) -> Path | None:
    state_dir = Path(cfg.node.state_dir)
    if (state_dir / "endpoints.json").exists():
        return state_dir
    _no_node(command, state_dir, state_dir_origin(args, cfg))
    return None


def cmd_serve(args: argparse.Namespace, cfg: Any) -> int:
    from router.config import redact_dsn
    from router.lifecycle import ServiceUnreachable, StateDirLocked
    from router.server import Node
    from router.telemetry import configure

    flush_telemetry = configure(cfg.telemetry.exporter, cfg.telemetry.interval_s, service_name=cfg.node.node_id)
    node = Node(_settings(cfg))
    try:
        node.start()
    except StateDirLocked as exc:  # another node owns everything there: touch nothing, not even via stop()
        print(f"nsjms serve: {exc}", file=sys.stderr, flush=True)
        return EXIT_LOCKED
    except ServiceUnreachable as exc:
        print(f"nsjms serve: {exc}", file=sys.stderr, flush=True)
        node.stop()
        return EXIT_UNREACHABLE
    except Exception as exc:  # noqa: BLE001 — report the cause and stop what was started
        log.error("nsjms serve failed to start: %s", redact_dsn(str(exc)))
        node.stop()
        return EXIT_FAILURE
    endpoints_path = node.s.state_dir / "endpoints.json"
    if args.json:
        print(json.dumps({"node_id": cfg.node.node_id, "endpoints": str(endpoints_path)}), flush=True)
    else:
        print(f"nsjms: node {cfg.node.node_id} serving; endpoints in {endpoints_path}", flush=True)
    broker = node.health.get("broker")
    if broker is not None and not broker.reachable:
        print(f"nsjms: WARNING broker.url {broker.address} is unreachable ({broker.error}); bridges wait and "
              "reconnect by themselves", flush=True)
    demo = _start_demo(args, node.s.state_dir) if args.demo else None
    try:
        node.wait()
    finally:
        if demo is not None and demo.poll() is None:
            demo.terminate()
            try:
                demo.wait(timeout=15)
            except subprocess.TimeoutExpired:
                demo.kill()
        node.stop()
        flush_telemetry()
    return EXIT_OK


def _start_demo(args: argparse.Namespace, state_dir: Path) -> subprocess.Popen[bytes]:
    """The demo is an independent client process (its own ORB), as a real application would be."""
    cmd = [sys.executable, "-m", "router.cli", "demo", "--state-dir", str(state_dir),
           "--rate", str(args.demo_rate), "--count", str(args.demo_count)]
    return subprocess.Popen(cmd)


def cmd_demo(args: argparse.Namespace, cfg: Any) -> int:
    import signal

    from router.demo import run_demo

    state_dir = _running("demo", args, cfg)
    if state_dir is None:
        return EXIT_NOT_RUNNING
    progress = sys.stdout.isatty() if args.progress is None else args.progress
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # serve --demo terminates us: clean up like Ctrl-C
    try:
        result = run_demo(state_dir, rate=args.rate, count=args.count, stop=stop,
                          out=lambda line: print(line, flush=True),
                          progress=(lambda line: print(line, flush=True)) if progress else None)
    except KeyboardInterrupt:
        return EXIT_OK
    if args.json:
        print(json.dumps(result.as_dict()))
    return EXIT_OK if args.count == 0 or result.received >= args.count else EXIT_FAILURE


def cmd_status(args: argparse.Namespace, cfg: Any) -> int:
    from router.status import collect

    state_dir = Path(cfg.node.state_dir)
    try:
        report = collect(state_dir)
    except FileNotFoundError:
        return _no_node("status", state_dir, state_dir_origin(args, cfg))
    except PermissionError:  # the node's files are private (mode 0600)
        print(f"nsjms status: cannot read {state_dir / 'endpoints.json'}: run as the node's user",
              file=sys.stderr)
        return EXIT_FAILURE
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

    state_dir = _running("bridge", args, cfg)
    if state_dir is None:
        return EXIT_NOT_RUNNING
    try:
        return run(args, state_dir)
    except UsageError as exc:
        print(f"nsjms bridge: {exc}", file=sys.stderr)
        return EXIT_CONFIG


def cmd_channel(args: argparse.Namespace, cfg: Any) -> int:
    from router.bridgecli import UsageError
    from router.channelcli import PropertyRefused, run

    state_dir = Path(cfg.node.state_dir)
    try:
        if not (state_dir / "endpoints.json").exists():
            if args.channel_command == "create":  # a bad --qos is reported even without a node
                from router.channelcli import check_create_args

                check_create_args(args)
            return _no_node("channel", state_dir, state_dir_origin(args, cfg))
        return run(args, state_dir, err=lambda line: print(line, file=sys.stderr))
    except PropertyRefused as exc:
        for line in exc.messages:
            print(f"nsjms channel: refused: {line}", file=sys.stderr)
        return EXIT_CONFIG
    except UsageError as exc:
        print(f"nsjms channel: {exc}", file=sys.stderr)
        return EXIT_CONFIG


def main(argv: Sequence[str] | None = None) -> int:
    from router.config import ConfigError

    args = build_parser().parse_args(argv)
    for key, default in GLOBAL_DEFAULTS.items():
        if not hasattr(args, key):
            setattr(args, key, default)
    try:
        cfg = _load(args)
    except ConfigError as exc:
        print(f"nsjms: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(level=getattr(logging, cfg.node.log_level, logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers = {"serve": cmd_serve, "status": cmd_status, "demo": cmd_demo, "bridge": cmd_bridge,
                "channel": cmd_channel}
    return handlers[args.command](args, cfg)


if __name__ == "__main__":
    sys.exit(main())
