"""``nsjms deadletter broker``: list, show, retry and discard what the bridges dead-lettered on the broker
(``nsjms.DLQ``, ``ActiveMQ.DLQ``), through :mod:`router.deadletter.broker` (the console's dead-letters page runs the
same).

The command talks to the broker itself over STOMP: ``broker.url``, ``broker.login`` and ``broker.passcode`` of the
configuration, or, without ``broker.url``, the embedded broker of the node running on the state directory (its URL
from ``endpoints.json``, its generated credentials from ``<state_dir>/activemq/credentials``). ``discard`` asks for
confirmation on a terminal (``--yes`` for scripts). Each retry and discard, done or refused, is in the operator log
(``<state_dir>/txn-operator.log``) with the local user. Exit codes are those of ``router.cli``: 0 ok, 2 usage, 3 the
broker not reachable (or no node and no ``broker.url``), 4 refused (with several ids, the others are still done).
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from router.deadletter.broker import BROKER_QUEUES, BrokerDeadLetterOps, BrokerDown, Refused
from router.deadletter.broker_event import sink_destination

__all__ = ["add_parser", "broker_ops", "render_list", "render_show", "run"]

EXIT_OK, EXIT_CONFIG, EXIT_NOT_RUNNING, EXIT_REFUSED = 0, 2, 3, 4

Out = Callable[[str], None]


def add_parser(dsub: Any, common: argparse.ArgumentParser) -> None:
    """``deadletter broker {list,show,retry,discard}`` under ``nsjms deadletter``."""
    p = dsub.add_parser("broker", parents=[common],
                        help="the bridges' dead letters on the broker (nsjms.DLQ, ActiveMQ.DLQ): list, show, retry, "
                             "discard")
    bsub = p.add_subparsers(dest="broker_command", required=True, metavar="{list,show,retry,discard}")
    queues = list(BROKER_QUEUES)
    ls = bsub.add_parser("list", parents=[common], help="dead letters on the broker, oldest first, with their reason")
    ls.add_argument("queue", nargs="?", choices=queues, default=None, help="one queue (default: both)")
    ls.add_argument("--offset", type=int, default=0, metavar="N", help="skip the first N (default 0)")
    ls.add_argument("--limit", type=int, default=100, metavar="N", help="at most N rows a queue (default 100)")
    show = bsub.add_parser("show", parents=[common], help="one dead letter: reason, bridge, source, headers, body "
                                                          "preview and where a retry would go")
    show.add_argument("queue", choices=queues)
    show.add_argument("id", metavar="ID", help="message id (from deadletter broker list)")
    retry = bsub.add_parser("retry", parents=[common],
                            help="send dead letters back where they came from (copy and consumption in one broker "
                                 "transaction)")
    retry.add_argument("queue", choices=queues)
    retry.add_argument("ids", nargs="+", metavar="ID", help="one or more message ids, each on its own")
    retry.add_argument("--why", default="", help="why (recorded in the operator log)")
    retry.add_argument("--to", default=None, metavar="queue:NAME|topic:NAME",
                       help="where an event dead letter (origin event) goes (default: its bridge's destination, "
                            "asked of the running node)")
    discard = bsub.add_parser("discard", parents=[common], help="consume dead letters for good")
    discard.add_argument("queue", choices=queues)
    discard.add_argument("ids", nargs="+", metavar="ID", help="one or more message ids, each on its own")
    discard.add_argument("--why", default="", help="why (recorded in the operator log)")
    discard.add_argument("--yes", action="store_true", help="do not ask for confirmation (scripts)")


class NoBroker(Exception):
    """No broker to ask: no ``broker.url`` and no node (with its embedded broker) on the state directory."""


def broker_ops(cfg: Any) -> BrokerDeadLetterOps:
    """The operations against the configured broker, or the embedded one of the node running on the state dir."""
    from router.jms.stomp.browse import StompBrowser

    state_dir = Path(cfg.node.state_dir)
    url, login, passcode = cfg.broker.url, cfg.broker.login, cfg.broker.passcode
    if not url:
        try:
            url = json.loads((state_dir / "endpoints.json").read_text()).get("broker_url") or ""
        except FileNotFoundError:
            url = ""
        if not url:
            raise NoBroker(f"broker.url is not configured and no node runs on {state_dir} (its embedded broker runs "
                           "with it): start the node, or set broker.url")
        credentials = state_dir / "activemq" / "credentials"
        if credentials.exists():
            login, passcode = credentials.read_text().split("\n")[:2]
    timeout = float(cfg.broker.connect_timeout_s) + 20.0
    return BrokerDeadLetterOps(str(cfg.node.node_id), state_dir,
                               lambda: StompBrowser(url, username=login or None, password=passcode or None,
                                                    timeout=timeout))


def run(args: argparse.Namespace, cfg: Any, *, out: Out = print, err: Out = lambda s: print(s, file=sys.stderr),
        ask: Callable[[str], str] | None = None, tty: bool | None = None,
        ops: BrokerDeadLetterOps | None = None) -> int:
    command = args.broker_command
    try:
        ops = ops or broker_ops(cfg)
        return _dispatch(args, ops, out, err, ask or input, sys.stdin.isatty() if tty is None else tty,
                         node_bridge_sink(Path(cfg.node.state_dir)))
    except NoBroker as exc:
        err(f"nsjms deadletter broker {command}: {exc}")
        return EXIT_NOT_RUNNING
    except BrokerDown as exc:
        err(f"nsjms deadletter broker {command}: {exc}")
        return EXIT_NOT_RUNNING
    except Refused as exc:
        err(f"nsjms deadletter broker {command}: refused: {exc}")
        return EXIT_REFUSED


def node_bridge_sink(state_dir: Path) -> Callable[[int], str | None]:
    """A bridge's JMS destination asked of the node running on ``state_dir`` (``nsjms bridge list ID --json``);
    None when no node runs, the bridge is gone or its sink is a channel."""
    def sink(bid: int) -> str | None:
        from router.cli.bridge import run as bridge_run

        if not (state_dir / "endpoints.json").exists():
            return None
        lines: list[str] = []
        args = argparse.Namespace(bridge_command="list", json=True, ids=[bid])
        if bridge_run(args, state_dir, out=lines.append) != 0 or not lines:
            return None
        try:
            rows = json.loads(lines[-1])
        except ValueError:
            return None
        return sink_destination(str(rows[0]["sink"])) if rows else None
    return sink


def _dispatch(args: argparse.Namespace, ops: BrokerDeadLetterOps, out: Out, err: Out, ask: Callable[[str], str],
              tty: bool, bridge_sink: Callable[[int], str | None] | None = None) -> int:
    command = args.broker_command
    if command == "list":
        listings = [ops.listing(q, max(0, args.offset), max(1, args.limit))
                    for q in ([args.queue] if args.queue else BROKER_QUEUES)]
        out(json.dumps(listings, indent=2, sort_keys=True) if args.json
            else "\n\n".join(render_list(x) for x in listings))
        return EXIT_OK
    if command == "show":
        view = ops.show(args.queue, args.id)
        out(json.dumps(view, indent=2, sort_keys=True) if args.json else render_show(view))
        return EXIT_OK
    who = f"{getpass.getuser()}@{socket.gethostname()} (cli)"
    if command == "discard" and not args.yes:
        if not tty:
            err("nsjms deadletter broker discard: not a terminal: add --yes to confirm")
            return EXIT_CONFIG
        if ask(f"type yes to discard {len(args.ids)} message(s) of {args.queue} for good: ").strip().lower() != "yes":
            err("nothing done")
            return EXIT_REFUSED
    to = None
    if command == "retry" and args.to:
        to = sink_destination(args.to)
        if to is None:
            err(f"nsjms deadletter broker retry: --to {args.to!r}: want queue:NAME or topic:NAME")
            return EXIT_CONFIG
    code, results = EXIT_OK, []
    for mid in args.ids:            # each on its own: one refused id does not stop the others
        try:
            result = (ops.retry(args.queue, mid, who, args.why, to=to, bridge_sink=bridge_sink)
                      if command == "retry" else ops.discard(args.queue, mid, who, args.why))
        except Refused as exc:
            err(f"nsjms deadletter broker {command} {mid}: refused: {exc}")
            code, result = EXIT_REFUSED, {"id": mid, "refused": str(exc)}
        else:
            if not args.json:
                out(f"{args.queue} {mid}: retried to {result['to']}" if command == "retry"
                    else f"{args.queue} {mid}: discarded")
        results.append(result)
    if args.json:
        out(json.dumps(results, indent=2, sort_keys=True))
    return code


# ------------------------------------------------------------------------------------------------- rendering
def _ts(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def render_list(listing: dict[str, Any]) -> str:
    """The table ``nsjms deadletter broker list`` prints for one queue."""
    rows = listing["dead_letters"]
    more = "" if listing["complete"] else " (the broker showed no more: ActiveMQ's maxBrowsePageSize)"
    lines = [f"{listing['queue']}: {listing['total']} message(s){more}"
             + (f", {len(rows)} shown from {listing['offset']}" if len(rows) < listing["total"] else "")]
    if not rows:
        return lines[0]
    head = ("ID", "ORIGIN", "BRIDGE", "SOURCE", "AT", "SIZE", "REASON")
    table = [(d["id"], d["origin"], "-" if d["bridge"] is None else str(d["bridge"]), d["source"] or "-", _ts(d["at"]),
              str(d["size"]), d["reason"]) for d in rows]
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(len(head) - 1)]
    for r in [head, *table]:
        lines.append("  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]).rstrip())
    return "\n".join(lines)


def render_show(d: dict[str, Any]) -> str:
    """One dead letter in full."""
    lines = [f"{d['queue']} message {d['id']}",
             f"  origin      {d['origin']}; bridge {'-' if d['bridge'] is None else d['bridge']}; "
             f"from {d['source'] or '-'}; at {_ts(d['at'])}; {d['size']} bytes",
             f"  reason      {d['reason']}",
             f"  retry       {d['retry']}",
             f"  body        {d['preview']}"]
    lines += [f"  header      {k} = {v}" for k, v in sorted(d["headers"].items())]
    return "\n".join(lines)
