"""``nsjms bridge …``: manage a running node's bridges through its BridgeFactory (IIOP, OMG interfaces).

Endpoint syntax (``--from`` / ``--to``):

* ``channel:<id>`` — an event channel of the node (``--channel-form structured|sequence``,
  ``--channel-style push|pull``);
* ``queue:<name>`` / ``topic:<name>`` — a JMS destination (``--jms-style push|pull`` for a JMS source,
  ``--factory`` for the connection-factory profile, e.g. ``jms-json`` or ``default;selector=severity = 'major'``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from router.bridge.states import REASONS, STATES, bridge_state

__all__ = ["REASONS", "STATES", "UsageError", "add_parser", "bridge_state", "invalid_endpoints", "parse_endpoint",
           "run"]

def _channel_of(ep: Any) -> int | None:
    conn = ep.connector
    return None if conn._d._n == "JMS_MESSAGE" else int(conn._v)


class UsageError(ValueError):
    """A bad command line; the message names the option."""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("bridge", parents=[common],
                       help="list, create, start, stop or destroy bridges of a running node")
    bsub = p.add_subparsers(dest="bridge_command", required=True,
                            metavar="{list,create,start,stop,destroy,transaction}")
    bsub.add_parser("list", parents=[common], help="bridges with their endpoints and state (active | inactive)",
                    epilog="States: " + "; ".join(f"{k}: {v}" for k, v in STATES.items()) + ".")
    c = bsub.add_parser("create", parents=[common], help="create (and by default start) a bridge")
    c.add_argument("--from", dest="source", required=True, metavar="ENDPOINT",
                   help="channel:<id> | queue:<name> | topic:<name>")
    c.add_argument("--to", dest="sink", required=True, metavar="ENDPOINT",
                   help="channel:<id> | queue:<name> | topic:<name>")
    c.add_argument("--channel-form", choices=["structured", "sequence"], default="structured",
                   help="event form the bridge uses on the channel side")
    c.add_argument("--channel-style", choices=["push", "pull"], default="push",
                   help="flow style of the bridge's proxy on the channel")
    c.add_argument("--jms-style", choices=["push", "pull"], default="push",
                   help="flow style of a JMS source (a JMS sink is always push)")
    c.add_argument("--factory", default="", metavar="PROFILE",
                   help="connection-factory profile: default | jms-json [;selector=...]")
    c.add_argument("--no-start", action="store_true", help="create only (the bridge stays inactive, stopped)")
    c.add_argument("--transaction", type=parse_transaction, default=None, metavar="EVENTS[:TIMEOUT]",
                   help="route in routing transactions (T2) of EVENTS events each, TIMEOUT seconds at most (0 or "
                        "omitted: none): BridgeTransactionMgmt enable_transaction before the bridge starts; needs a "
                        "Persistent channel, pushed to by the channel (channel -> JMS) or pulled from (JMS -> "
                        "channel). A refusal destroys the new bridge")
    for name in ("start", "stop", "destroy"):
        b = bsub.add_parser(name, parents=[common], help=f"{name} a bridge")
        b.add_argument("id", type=int, metavar="ID", help="bridge id (from bridge list)")
    t = bsub.add_parser("transaction", parents=[common],
                        help="enable (EVENTS[:TIMEOUT]) or disable (off) routing transactions on a bridge")
    t.add_argument("id", type=int, metavar="ID", help="bridge id (from bridge list)")
    t.add_argument("setting", type=_transaction_or_off, metavar="EVENTS[:TIMEOUT]|off",
                   help="events per routing transaction and its timeout in seconds, or off")


def parse_transaction(text: str) -> tuple[int, int]:
    """``EVENTS[:TIMEOUT]`` -> (events >= 1, timeout seconds >= 0), both IDL unsigned longs; argparse usage error
    (exit 2) otherwise."""
    events, _, timeout = text.partition(":")
    try:
        values = int(events), int(timeout or "0")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected EVENTS[:TIMEOUT], two integers") from None
    if not 1 <= values[0] <= 0xFFFFFFFF or not 0 <= values[1] <= 0xFFFFFFFF:
        raise argparse.ArgumentTypeError(f"{text!r}: EVENTS must be 1..4294967295 and TIMEOUT 0..4294967295 "
                                         "seconds (0: no timeout)")
    return values


def _transaction_or_off(text: str) -> tuple[int, int] | None:
    return None if text.strip().lower() == "off" else parse_transaction(text)


def parse_endpoint(text: str, option: str) -> tuple[str, str]:
    kind, sep, rest = text.partition(":")
    if not sep or kind not in ("channel", "queue", "topic") or not rest:
        raise UsageError(f"{option}: expected channel:<id>, queue:<name> or topic:<name>, got {text!r}")
    if kind == "channel" and not rest.isdigit():
        raise UsageError(f"{option}: channel id must be a non-negative integer, got {rest!r}")
    return kind, rest


def _endpoint(BA: Any, role: str, kind: str, value: str, args: argparse.Namespace) -> Any:
    if kind == "channel":
        form = BA.SEQUENCE_EVENT if args.channel_form == "sequence" else BA.STRUCTURED_EVENT
        return BA.ExternalEndpoint(getattr(BA, role), BA.ExternalEndpointConnector(form, int(value)),
                                   getattr(BA, args.channel_style.upper()), form)
    dest = BA.JMSDestination(BA.QUEUE if kind == "queue" else BA.TOPIC, value, args.factory)
    style = args.jms_style.upper() if role == "SOURCE" else "PUSH"
    return BA.ExternalEndpoint(getattr(BA, role), BA.ExternalEndpointConnector(destination=dest),
                               getattr(BA, style), BA.JMS_MESSAGE)


def _describe(ep: Any) -> str:
    conn = ep.connector
    if conn._d._n == "JMS_MESSAGE":
        d = conn._v
        extra = f" [{d.factory_name}]" if d.factory_name else ""
        return f"{d.destination_type._n.lower()}:{d.destination_name}{extra} ({ep.style._n.lower()})"
    return f"channel:{conn._v} ({ep.type._n.lower()}, {ep.style._n.lower()})"


def _precheck(args: argparse.Namespace, BA: Any,
              channel_factory: Any) -> tuple[dict[tuple[str, str], str], list[Any]]:
    """The node's own endpoint rules (``router.bridge.endpoints.check_pair``, pure) applied before sending, to
    name the reason of a refusal: the IDL's ``InvalidExternalEndPoints`` carries only the role and the code.

    Returns the reasons by (role, code) and the ``ExternalEndpointError`` values the node would raise."""
    import CosNotification
    import CosNotifyChannelAdmin

    from router.bridge.endpoints import check_pair, from_idl

    src_kind, src = parse_endpoint(args.source, "--from")
    snk_kind, snk = parse_endpoint(args.sink, "--to")
    ecf = channel_factory._narrow(CosNotifyChannelAdmin.EventChannelFactory)
    existing = set(ecf.get_all_channels())

    def persistent(cid: int) -> bool:
        """NJI Table 2-3 (a queue needs a Persistent channel), from the channel's ConnectionReliability."""
        try:
            qos = {p.name: p.value.value() for p in ecf.get_event_channel(cid).get_qos()}
        except CosNotifyChannelAdmin.ChannelNotFound:
            return True                 # reported as INVALID_CHANNELID
        return bool(qos.get("ConnectionReliability") == CosNotification.Persistent)

    source, sink = from_idl(_endpoint(BA, "SOURCE", src_kind, src, args)), from_idl(_endpoint(BA, "SINK", snk_kind,
                                                                                         snk, args))
    # One convention with `channel create --qos`: a value wrong by itself (a destination name, a factory profile,
    # a selector) is a usage error, exit 2; a refusal that depends on the node's state (no such channel, a queue
    # with a BestEffort channel) is the node's, exit 4.
    local = check_pair(source, sink, lambda cid: True, lambda cid: True)
    if local:
        raise UsageError("; ".join(f"invalid {p.role.lower()} endpoint: {p.code}: {p.reason}" for p in local))
    problems = check_pair(source, sink, lambda cid: cid in existing, persistent)
    reasons = {(p.role, p.code): p.reason for p in problems}
    return reasons, [BA.ExternalEndpointError(getattr(BA, p.role), getattr(BA, p.code)) for p in problems]


def _channel_id(row: dict[str, Any]) -> int | None:
    for text in (row["source"], row["sink"]):
        if text.startswith("channel:"):
            return int(text.split(":", 1)[1].split()[0])
    return None


def _ecf_type() -> Any:
    import CosNotifyChannelAdmin

    return CosNotifyChannelAdmin.EventChannelFactory


def _snapshot_bridges(state_dir: Path) -> dict[int, dict[str, Any]]:
    try:
        snap = json.loads((state_dir / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {int(b["id"]): b for b in snap.get("bridges", [])}


def run(args: argparse.Namespace, state_dir: Path, out: Any = print) -> int:
    """Returns an exit code: 0 ok, 2 usage, 3 node not running, 4 refused by the node (message says why)."""
    from omniORB import CORBA

    from idl.generated import CosBridgeAdmin as BA
    from idl.generated import NsjmsAdmin

    endpoints = json.loads((state_dir / "endpoints.json").read_text())
    if not endpoints.get("bridge_factory"):
        out("nsjms bridge: the node publishes no BridgeFactory")
        return 3
    orb = CORBA.ORB_init(["nsjms-bridge", "-ORBclientCallTimeOutPeriod", "15000"], CORBA.ORB_ID)
    reasons: dict[tuple[str, str], str] = {}
    try:
        factory = orb.string_to_object(endpoints["bridge_factory"]["corbaloc"])._narrow(BA.BridgeFactory)
        if args.bridge_command == "create":
            channels = orb.string_to_object(endpoints["event_channel_factory"]["corbaloc"])
            reasons, errors = _precheck(args, BA, channels)
            if errors:  # refused by the node's own rules: not sent, reported exactly as the node would
                raise BA.InvalidExternalEndPoints(errors)
        if args.bridge_command == "list":
            ecf = orb.string_to_object(endpoints["event_channel_factory"]["corbaloc"])
            args.existing_channels = set(ecf._narrow(_ecf_type()).get_all_channels())
        return _dispatch(args, factory, BA, NsjmsAdmin, out, _snapshot_bridges(state_dir))
    except BA.InvalidExternalEndPoints as exc:
        for line in invalid_endpoints(exc, reasons):
            out(f"nsjms bridge: {line}")
        return 4
    except BA.BridgeNotFound:
        out(f"nsjms bridge: no bridge with id {args.id}")
        return 4
    except BA.BridgeAlreadyStarted:
        out(f"nsjms bridge: bridge {args.id} is already started")
        return 4
    except BA.BridgeInactive:
        out(f"nsjms bridge: bridge {args.id} is not started")
        return 4
    except (CORBA.TRANSIENT, CORBA.COMM_FAILURE, CORBA.TIMEOUT) as exc:
        out(f"nsjms bridge: node not reachable: {exc}")
        return 3
    finally:
        orb.destroy()


def invalid_endpoints(exc: Any, reasons: dict[tuple[str, str], str]) -> list[str]:
    """``InvalidExternalEndPoints`` as one line per endpoint, with the reason :func:`_precheck` found."""
    unknown = "the node's log says why"
    return [f"invalid {err.role._n.lower()} endpoint: {err.code._n}: "
            f"{reasons.get((err.role._n, err.code._n), unknown)}" for err in exc.error]


def _dispatch(args: argparse.Namespace, factory: Any, BA: Any, NsjmsAdmin: Any, out: Any,
              snapshot: dict[int, dict[str, Any]]) -> int:
    cmd = args.bridge_command
    as_json = getattr(args, "json", False)
    if cmd == "list":
        from omniORB import CORBA

        rows = []
        only = getattr(args, "ids", None)        # the console's page of a list: these bridges only
        for bid in factory.get_all_bridges() if only is None else only:
            try:
                bridge = factory.get_bridge_with_id(bid)._narrow(NsjmsAdmin.ManagedBridge)
                started = bridge.get_status() == NsjmsAdmin.started  # administrative (not NJI 2.3 Active)
                receiver, sender = bridge._get_end_point_receiver(), bridge._get_end_point_sender()
            except BA.BridgeNotFound:            # destroyed since it was listed
                continue
            except (CORBA.TRANSIENT, CORBA.COMM_FAILURE, CORBA.TIMEOUT) as exc:
                # the listing is the cluster's (docs/cluster.md): a bridge whose owner died and is not taken over
                # yet (or is moving) does not answer now; the others are still listed
                rows.append({"id": bid, "source": "?", "sink": "?", "state": "unreachable", "started": None,
                             "reason": f"its node does not answer now ({type(exc).__name__}): a takeover or a "
                                       "hand-off in progress?", "channel_id": None, "channel_exists": True,
                             "last_error": None})
                continue
            channel = next(c for c in (_channel_of(receiver), _channel_of(sender), -1) if c is not None)
            snap = snapshot.get(bid, {})
            # the node's snapshot says whether it is Active and why not; if it is older than a start/stop just
            # made, the administrative state from the node (asked now) wins
            fresh = snap.get("started") == started
            state = snap.get("state") if fresh else ("inactive" if not started else None)
            reason = snap.get("reason") if fresh else ("stopped" if not started else None)
            rows.append({"id": bid, "source": _describe(receiver), "sink": _describe(sender), "state": state,
                         "started": started, "reason": reason, "channel_id": channel,
                         "channel_exists": channel in getattr(args, "existing_channels", {channel}),
                         "last_error": snap.get("last_error")})
        if as_json:
            out(json.dumps(rows, indent=2, sort_keys=True))
        elif not rows:
            out("no bridges")
        for r in [] if as_json else rows:
            missing = None if r["channel_exists"] else _channel_id(r)
            out(f"bridge {r['id']}: {r['source']} -> {r['sink']}  {bridge_state(r, missing)}")
            if r["last_error"] and r["state"] != "active":
                out(f"  last error: {r['last_error']}")
        return 0
    if cmd == "create":
        src_kind, src = parse_endpoint(args.source, "--from")
        snk_kind, snk = parse_endpoint(args.sink, "--to")
        bridge, bid = factory.create_bridge(_endpoint(BA, "SOURCE", src_kind, src, args),
                                            _endpoint(BA, "SINK", snk_kind, snk, args))
        if args.transaction is not None and not _enable(bridge, bid, args.transaction, NsjmsAdmin, out):
            bridge.destroy()
            out(f"nsjms bridge: bridge {bid} destroyed: it was created for routing transactions")
            return 4
        if not args.no_start:
            bridge.start_bridge()
        if as_json:
            out(json.dumps({"id": bid, "started": not args.no_start}))
        else:
            out(f"bridge {bid} created{'' if args.no_start else ' and started'}: {args.source} -> {args.sink}")
        return 0
    bridge = factory.get_bridge_with_id(args.id)
    if cmd == "transaction":
        return _transaction(bridge, args, NsjmsAdmin, out)
    {"start": bridge.start_bridge, "stop": bridge.stop_bridge, "destroy": bridge.destroy}[cmd]()
    done = f"{cmd}{'ed' if cmd != 'stop' else 'ped'}"
    out(json.dumps({"id": args.id, done: True}) if as_json else f"bridge {args.id}: {done}")
    return 0


def _enable(bridge: Any, bid: int, setting: tuple[int, int], NsjmsAdmin: Any, out: Any) -> bool:
    """``enable_transaction``; False (after saying why) when the bridge refuses it."""
    from idl.generated import BridgeTransactionMgmt as BTM

    try:
        bridge._narrow(NsjmsAdmin.ManagedBridge).enable_transaction(*setting)
    except BTM.UnsupportedTransaction:
        out(f"nsjms bridge: bridge {bid} refuses routing transactions (UnsupportedTransaction): they need a "
            "Persistent channel that pushes to the bridge (channel -> JMS) or pulls from it (JMS -> channel), on "
            "a node with T2 (docs/transactions.md)")
        return False
    except BTM.TransactionAlreadyActive:
        out(f"nsjms bridge: bridge {bid} already routes in transactions (TransactionAlreadyActive): "
            f"`nsjms bridge transaction {bid} off` first to change EVENTS or TIMEOUT")
        return False
    return True


def _transaction(bridge: Any, args: argparse.Namespace, NsjmsAdmin: Any, out: Any) -> int:
    from idl.generated import BridgeTransactionMgmt as BTM

    as_json = getattr(args, "json", False)
    if args.setting is None:
        try:
            bridge._narrow(NsjmsAdmin.ManagedBridge).disable_transaction()
        except BTM.TransactionActive:
            out(f"nsjms bridge: bridge {args.id}: a routing transaction is in progress (TransactionActive); "
                "transactions end as soon as it does")
            return 4
        out(json.dumps({"id": args.id, "transaction": None}) if as_json
            else f"bridge {args.id}: routing transactions disabled")
        return 0
    if not _enable(bridge, args.id, args.setting, NsjmsAdmin, out):
        return 4
    events, timeout = args.setting
    out(json.dumps({"id": args.id, "transaction": {"events": events, "timeout_s": timeout}}) if as_json
        else f"bridge {args.id}: routing transactions of {events} event(s)"
             f"{f', timeout {timeout} s' if timeout else ''} enabled")
    return 0
