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

__all__ = ["UsageError", "add_parser", "parse_endpoint", "run"]


class UsageError(ValueError):
    """A bad command line; the message names the option."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bridge", help="list, create, start, stop or destroy bridges of a running node")
    p.add_argument("--state-dir", type=Path, default=None)
    p.add_argument("--config", default=None)
    bsub = p.add_subparsers(dest="bridge_command", required=True)
    bsub.add_parser("list", help="bridges with their endpoints and state")
    c = bsub.add_parser("create", help="create (and by default start) a bridge")
    c.add_argument("--from", dest="source", required=True, help="channel:<id> | queue:<name> | topic:<name>")
    c.add_argument("--to", dest="sink", required=True, help="channel:<id> | queue:<name> | topic:<name>")
    c.add_argument("--channel-form", choices=["structured", "sequence"], default="structured")
    c.add_argument("--channel-style", choices=["push", "pull"], default="push")
    c.add_argument("--jms-style", choices=["push", "pull"], default="push")
    c.add_argument("--factory", default="", help="connection-factory profile: default | jms-json [;selector=...]")
    c.add_argument("--no-start", action="store_true", help="create only (the bridge stays inactive)")
    for name in ("start", "stop", "destroy"):
        b = bsub.add_parser(name, help=f"{name} a bridge")
        b.add_argument("id", type=int)


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
    try:
        factory = orb.string_to_object(endpoints["bridge_factory"]["corbaloc"])._narrow(BA.BridgeFactory)
        return _dispatch(args, factory, BA, NsjmsAdmin, out)
    except BA.InvalidExternalEndPoints as exc:
        for err in exc.error:
            out(f"nsjms bridge: invalid {err.role._n.lower()} endpoint: {err.code._n} (see the node log for why)")
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
    except (CORBA.TRANSIENT, CORBA.COMM_FAILURE) as exc:
        out(f"nsjms bridge: node not reachable: {exc}")
        return 3
    finally:
        orb.destroy()


def _dispatch(args: argparse.Namespace, factory: Any, BA: Any, NsjmsAdmin: Any, out: Any) -> int:
    cmd = args.bridge_command
    if cmd == "list":
        ids = list(factory.get_all_bridges())
        if not ids:
            out("no bridges")
        for bid in ids:
            bridge = factory.get_bridge_with_id(bid)._narrow(NsjmsAdmin.ManagedBridge)
            state = "active" if bridge.get_status() == NsjmsAdmin.started else "inactive"
            out(f"bridge {bid}: {_describe(bridge._get_end_point_receiver())} -> "
                f"{_describe(bridge._get_end_point_sender())}  [{state}]")
        return 0
    if cmd == "create":
        src_kind, src = parse_endpoint(args.source, "--from")
        snk_kind, snk = parse_endpoint(args.sink, "--to")
        bridge, bid = factory.create_bridge(_endpoint(BA, "SOURCE", src_kind, src, args),
                                            _endpoint(BA, "SINK", snk_kind, snk, args))
        if not args.no_start:
            bridge.start_bridge()
        out(f"bridge {bid} created{'' if args.no_start else ' and started'}: {args.source} -> {args.sink}")
        return 0
    bridge = factory.get_bridge_with_id(args.id)
    {"start": bridge.start_bridge, "stop": bridge.stop_bridge, "destroy": bridge.destroy}[cmd]()
    out(f"bridge {args.id}: {cmd}{'ed' if cmd != 'stop' else 'ped'}")
    return 0
