"""``nsjms deadletter``: list, show, retry and discard the events the node's channels gave up on.

The channel's dead-letter store (:mod:`router.channel.deadletters`) is asked of the running router over IIOP
(``NsjmsAdmin::DeadLetterAdmin``, :mod:`router.deadletter.admin`, found through ``endpoints.json``), which runs
:mod:`router.deadletter.ops`: a retry goes into the live queues. With the node stopped nothing is done (exit 3):
start it. ``discard`` asks for confirmation on a terminal (``--yes`` for scripts; without a terminal and without
``--yes`` nothing is done). Each retry and discard, done or refused, is in the operator log
(``<state_dir>/txn-operator.log``). Exit codes are those of ``router.cli``: 0 ok, 2 usage, 3 node not running or
not answering, 4 refused (an unknown id, a channel gone; with several ids, the others are still done).
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

__all__ = ["add_parser", "render_list", "render_show", "run"]

EXIT_OK, EXIT_CONFIG, EXIT_NOT_RUNNING, EXIT_REFUSED = 0, 2, 3, 4

Out = Callable[[str], None]


IGNORED_WHO = "ignored: the operator log records the authenticated principal (docs/security.md)"

def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("deadletter", parents=[common],
                       help="list, show, retry or discard the events the channels gave up on (the dead-letter store)")
    dsub = p.add_subparsers(dest="deadletter_command", required=True, metavar="{list,show,retry,discard,broker}")
    ls = dsub.add_parser("list", parents=[common], help="dead letters, oldest first, with their reason")
    ls.add_argument("--channel", type=int, default=None, metavar="N", help="only those of channel N")
    ls.add_argument("--limit", type=int, default=1000, metavar="N", help="at most N rows (default 1000)")
    show = dsub.add_parser("show", parents=[common], help="one dead letter: reason, exception, attempts, times, "
                                                          "the event's header and where a retry would go")
    show.add_argument("id", type=int, metavar="ID", help="dead letter id (from deadletter list)")
    retry = dsub.add_parser("retry", parents=[common],
                            help="put dead letters back into their proxy supplier's queue (or the channel's, if that "
                                 "proxy is gone)")
    retry.add_argument("ids", type=int, nargs="+", metavar="ID", help="one or more dead letter ids, each on its own")
    retry.add_argument("--who", default=None, help=IGNORED_WHO)
    discard = dsub.add_parser("discard", parents=[common], help="delete dead letters for good")
    discard.add_argument("ids", type=int, nargs="+", metavar="ID", help="one or more dead letter ids, each on its own")
    discard.add_argument("--why", default="", help="why (recorded in the operator log)")
    discard.add_argument("--who", default=None, help=IGNORED_WHO)
    discard.add_argument("--yes", action="store_true", help="do not ask for confirmation (scripts)")
    from router.cli.brokerdlq import add_parser as add_broker_parser

    add_broker_parser(dsub, common)            # the bridges' dead letters on the broker (router/cli/brokerdlq.py)


class _Refused(Exception):
    pass


def run(args: argparse.Namespace, state_dir: Path, *, out: Out = print,
        err: Out = lambda s: print(s, file=sys.stderr), ask: Callable[[str], str] | None = None,
        tty: bool | None = None) -> int:
    """One ``deadletter`` subcommand against the node running on ``state_dir`` (its ``endpoints.json`` exists)."""
    from omniORB import CORBA

    from idl.generated import NsjmsAdmin

    command = args.deadletter_command
    endpoints = json.loads((state_dir / "endpoints.json").read_text())
    if "dead_letter_admin" not in endpoints:
        err(f"nsjms deadletter {command}: the node running on {state_dir} does not offer DeadLetterAdmin (an older "
            "version)")
        return EXIT_NOT_RUNNING
    orb = CORBA.ORB_init(["nsjms-deadletter", "-ORBclientCallTimeOutPeriod", "60000"], CORBA.ORB_ID)
    try:
        ref = orb.string_to_object(endpoints["dead_letter_admin"]["ior"])._narrow(NsjmsAdmin.DeadLetterAdmin)
        return _dispatch(args, ref, NsjmsAdmin.DeadLetterRefused, out, err, ask or input,
                         sys.stdin.isatty() if tty is None else tty)
    except (CORBA.TRANSIENT, CORBA.COMM_FAILURE, CORBA.OBJECT_NOT_EXIST) as exc:
        err(f"nsjms deadletter {command}: the node running on {state_dir} does not answer ({exc}): is it "
            "stopped? (start it: dead letters are handled by the running node)")
        return EXIT_NOT_RUNNING
    except _Refused as exc:
        err(f"nsjms deadletter {command}: refused: {exc}")
        return EXIT_REFUSED
    finally:
        orb.destroy()


def _dispatch(args: argparse.Namespace, ref: Any, refused: Any, out: Out, err: Out, ask: Callable[[str], str],
              tty: bool) -> int:
    def ask_node(call: Callable[[], str]) -> dict[str, Any]:
        try:
            result: dict[str, Any] = json.loads(call())
        except refused as exc:
            raise _Refused(exc.reason) from None
        return result

    command = args.deadletter_command
    if command == "list":
        channel = -1 if args.channel is None else args.channel
        listing = ask_node(lambda: ref.list_json(channel, max(1, args.limit)))
        out(json.dumps(listing, indent=2, sort_keys=True) if args.json else render_list(listing))
        return EXIT_OK
    if command == "show":
        view = ask_node(lambda: ref.show_json(args.id))
        out(json.dumps(view, indent=2, sort_keys=True) if args.json else render_show(view))
        return EXIT_OK
    who = args.who or f"{getpass.getuser()}@{socket.gethostname()}"
    if command == "discard" and not args.yes:
        if not tty:
            err("nsjms deadletter discard: not a terminal: add --yes to confirm")
            return EXIT_CONFIG
        ids = " ".join(map(str, args.ids))
        if ask(f"type yes to discard dead letter(s) {ids} for good: ").strip().lower() != "yes":
            err("nothing done")
            return EXIT_REFUSED
    code, results = EXIT_OK, []
    for dl_id in args.ids:       # each on its own: one refused id does not stop the others
        try:
            result = ask_node(_action(ref, command, dl_id, who, getattr(args, "why", "")))
        except _Refused as exc:
            err(f"nsjms deadletter {command} {dl_id}: refused: {exc}")
            code, result = EXIT_REFUSED, {"id": dl_id, "refused": str(exc)}
        else:
            if not args.json:
                out(_done(command, result))
        results.append(result)
    if args.json:
        out(json.dumps(results, indent=2, sort_keys=True))
    return code


def _action(ref: Any, command: str, dl_id: int, who: str, why: str) -> Callable[[], str]:
    if command == "retry":
        return lambda: str(ref.retry(dl_id, who))
    return lambda: str(ref.discard(dl_id, who, why))


def _done(command: str, r: dict[str, Any]) -> str:
    if command == "retry":
        return (f"dead letter {r['id']}: retried ({r['how']}) as event seq {r['seq']} for proxy supplier(s) "
                f"{', '.join(r['proxies'])}")
    return f"dead letter {r['id']}: discarded ({r['event']}, channel {r['channel']})"


# ------------------------------------------------------------------------------------------------- rendering
def _ts(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _proxy(dl: dict[str, Any]) -> str:
    kind = "supplier" if dl["side"] == "C" else "consumer"
    return f"{dl['admin_id']}/{dl['proxy_id']} ({kind})"


def render_list(listing: dict[str, Any]) -> str:
    """The table ``nsjms deadletter list`` prints."""
    rows = listing["dead_letters"]
    where = f" of channel {listing['channel']}" if listing.get("channel") is not None else ""
    lines = [f"node {listing['node']}: {listing['total']} dead letter(s){where}"
             + (f", the oldest {len(rows)} shown" if len(rows) < listing["total"] else "")]
    if not rows:
        return lines[0]
    head = ("ID", "CHANNEL", "PROXY", "EVENT", "ATTEMPTS", "DEAD SINCE", "REASON")
    table = [(str(d["id"]), str(d["channel_id"]), _proxy(d), d["event_name"], str(d["attempts"]), _ts(d["dead_at"]),
              d["reason"]) for d in rows]
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(len(head) - 1)]
    for r in [head, *table]:
        lines.append("  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]).rstrip())
    return "\n".join(lines)


def render_show(dl: dict[str, Any]) -> str:
    """One dead letter in full."""
    ev = dl["event"]
    lines = [f"dead letter {dl['id']}  (channel {dl['channel_id']}, proxy {_proxy(dl)})",
             f"  event       {dl['event_name']}; {dl['size'] if dl['size'] is not None else '?'} bytes; "
             f"{'persistent' if dl['persistent'] else 'BestEffort'}; priority {dl['priority']}; "
             f"deadline {_ts(dl['deadline'])}; stored event id {dl['event_id'] if dl['event_id'] else '-'}",
             f"  reason      {dl['reason']}",
             f"  exception   {dl['exception']}",
             f"  attempts    {dl['attempts']}; accepted {_ts(dl['received_at'])}; dead since {_ts(dl['dead_at'])}",
             f"  ledger      {dl['dedupe_id']}",
             f"  retry       {dl['retry']}"]
    for key in ("variable_header", "filterable_data"):
        for name, value in ev.get(key, {}).items():
            lines.append(f"  {key.replace('_', ' '):<15} {name} = {value}")
    if "remainder_of_body" in ev:
        lines.append(f"  body        {ev['remainder_of_body']}")
    elif "value" in ev:
        lines.append(f"  value       {ev['value']}")
    return "\n".join(lines)
