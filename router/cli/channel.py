"""``nsjms channel …``: create, list, show and destroy a running node's event channels.

A standard CORBA client of the node's ``CosNotifyChannelAdmin::EventChannelFactory`` (``get_all_channels``,
``get_event_channel``, ``create_channel``, ``get_qos``/``get_admin``, admins, proxies and filters through the OMG
operations). What the IDL does not expose (queue depths, whether a proxy is connected or suspended) comes from the
node's ``status.json`` snapshot (rewritten every 2 s).

``--qos NAME=VALUE`` and ``--admin NAME=VALUE`` are checked before anything is sent, with the channel's own rules
(:mod:`router.channel.qos`): an unknown name, a value of the wrong type or out of range, or a combination the
channel refuses is reported with the property and the reason, exactly as the node would refuse it
(``UnsupportedQoS``/``UnsupportedAdmin``, whose errors are rendered the same way).

Values: integers; ``true``/``false`` for booleans; the IDL constant names for enumerations (``Persistent``,
``BestEffort``, ``FifoOrder``, ``PriorityOrder`` …); for ``TimeBase::TimeT`` durations an integer in 100 ns units
or a number with a unit (``250ms``, ``5s``, ``2m``).

Exit codes (as the other subcommands): 0 ok, 2 bad option (the message names it), 3 node not running or not
reachable, 4 refused by the node or unknown channel id (the message says why).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from router.cli.bridge import UsageError

__all__ = ["EXIT_REFUSED", "PropertyRefused", "UsageError", "add_parser", "check_admin", "check_create_args",
           "check_qos", "describe_problem", "format_value", "parse_assignments", "render_show", "run", "show"]

EXIT_REFUSED = 4

Out = Callable[[str], None]


class PropertyRefused(UsageError):
    """``--qos``/``--admin`` values the channel's rules refuse; ``messages`` name each property and why."""

    def __init__(self, messages: Sequence[str]) -> None:
        self.messages = tuple(messages)
        super().__init__("; ".join(self.messages))


CREATE_EPILOG = (
    "Names are the CosNotification property names (docs/qos.md). Values: integers; true/false for booleans; "
    "BestEffort/Persistent, AnyOrder/FifoOrder/PriorityOrder/DeadlineOrder/LifoOrder and None/Acknowledgment for "
    "the enumerated ones; durations (TimeBase::TimeT) in 100 ns units or with a unit: 250ms, 5s, 2m. Checked with "
    "the channel's own rules before anything is sent: a refusal names the property, the error code and the "
    "possible values, e.g. EventReliability=Persistent needs ConnectionReliability=Persistent."
)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("channel", parents=[common], help="create, list, show or destroy event channels of a node")
    csub = p.add_subparsers(dest="channel_command", required=True, metavar="{create,list,show,destroy}")
    c = csub.add_parser("create", parents=[common], help="create an event channel (prints its id)",
                        epilog=CREATE_EPILOG)
    c.add_argument("--qos", action="append", default=[], metavar="NAME=VALUE",
                   help="initial QoS, e.g. EventReliability=Persistent (repeatable)")
    c.add_argument("--admin", action="append", default=[], metavar="NAME=VALUE",
                   help="initial admin property, e.g. MaxQueueLength=1000 (repeatable)")
    csub.add_parser("list", parents=[common], help="channel ids with events held and admin/proxy counts")
    s = csub.add_parser("show", parents=[common],
                        help="QoS, admin properties, admins, proxies (state, queue depth) and filters of a channel")
    s.add_argument("id", type=int, metavar="ID", help="channel id (from channel list)")
    d = csub.add_parser("destroy", parents=[common], help="destroy a channel with its admins, proxies and events")
    d.add_argument("id", type=int, metavar="ID", help="channel id (from channel list)")


# -- NAME=VALUE parsing and client-side checks (no I/O) -------------------------------------------------------
_RELIABILITY = {"BestEffort": 0, "Persistent": 1}
_ORDER = {"AnyOrder": 0, "FifoOrder": 1, "PriorityOrder": 2, "DeadlineOrder": 3}
_SYMBOLS: dict[str, dict[str, int]] = {
    "EventReliability": _RELIABILITY, "ConnectionReliability": _RELIABILITY, "OrderPolicy": _ORDER,
    "DiscardPolicy": {**_ORDER, "LifoOrder": 4}, "DeliveryReliability": {"None": 0, "Acknowledgment": 1},
}
_UNITS = {"ns": 0.01, "us": 10, "ms": 10_000, "s": 10_000_000, "m": 600_000_000, "h": 36_000_000_000}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h)$")
_BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def _tables() -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    from router.channel import qos as Q

    return Q.QOS_PROPERTIES, Q.ADMIN_PROPERTIES


def _parse_value(prop: Any, text: str, option: str) -> object:
    from router.channel.qos import Kind

    symbols = _SYMBOLS.get(prop.name, {})
    lowered = {k.lower(): v for k, v in symbols.items()}
    if text.lower() in lowered:
        return lowered[text.lower()]
    if prop.kind is Kind.BOOLEAN:
        if text.lower() in _BOOLS:
            return _BOOLS[text.lower()]
        raise UsageError(f"{option} {prop.name}={text}: BAD_TYPE: expected a boolean (true or false)")
    if prop.kind is Kind.TIMET and (m := _DURATION.match(text.strip())):
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    try:
        return int(text, 0)
    except ValueError:
        names = f" or one of {', '.join(symbols)}" if symbols else ""
        unit = " or a duration such as 250ms, 5s" if prop.kind is Kind.TIMET else ""
        raise UsageError(f"{option} {prop.name}={text}: BAD_TYPE: expected an integer "
                         f"({prop.kind.value}){names}{unit}") from None


def parse_assignments(items: Iterable[str], table: Mapping[str, Any], option: str) -> dict[str, object]:
    """``["NAME=VALUE", …]`` → ``{name: python value}``; an unknown name or unparsable value is a UsageError."""
    values: dict[str, object] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not name or not text:
            raise UsageError(f"{option}: expected NAME=VALUE, got {item!r}")
        prop = table.get(name)
        if prop is None:
            raise UsageError(f"{option} {name}: BAD_PROPERTY: not a property the channel knows "
                             f"(known: {', '.join(table)})")
        values[name] = _parse_value(prop, text, option)
    return values


def format_value(name: str, value: object) -> str:
    """``1 (Persistent)``, ``10000000 (1 s)``: the value with its symbolic name or duration."""
    from router.channel import qos as Q

    symbols = {v: k for k, v in _SYMBOLS.get(name, {}).items()}
    if isinstance(value, bool) or not isinstance(value, int):
        return str(value).lower() if isinstance(value, bool) else str(value)
    if value in symbols:
        return f"{value} ({symbols[value]})"
    prop = Q.QOS_PROPERTIES.get(name)
    if prop is not None and prop.kind is Q.Kind.TIMET and value:
        return f"{value} ({value / Q.TIMET_PER_SECOND:g} s)"
    return str(value)


_REASONS = {
    "BAD_PROPERTY": "not a property the channel knows",
    "UNSUPPORTED_PROPERTY": "cannot be set on an event channel",
    "UNAVAILABLE_PROPERTY": "not available together with the other properties requested",
    "UNSUPPORTED_VALUE": "value not supported",
    "UNAVAILABLE_VALUE": "value not available together with the other properties requested",
    "BAD_TYPE": "value of the wrong type",
    "BAD_VALUE": "value out of range",
}


_HINTS = {
    ("UNAVAILABLE_VALUE", "EventReliability"): "Persistent events need ConnectionReliability=Persistent (NS 2.5.5)",
    ("UNAVAILABLE_VALUE", "ConnectionReliability"): "EventReliability=Persistent needs it Persistent (NS 2.5.5)",
}


def describe_problem(option: str, code: str, name: str, low: object = None, high: object = None) -> str:
    """``--qos EventReliability: UNAVAILABLE_VALUE: value not available … (possible: 0 (BestEffort))``."""
    text = f"{option} {name}: {code}: {_REASONS.get(code, 'refused')}"
    if code in ("UNSUPPORTED_VALUE", "UNAVAILABLE_VALUE", "BAD_VALUE") and low is not None:
        span = format_value(name, low) if low == high else f"{format_value(name, low)} .. {format_value(name, high)}"
        text += f" (possible: {span})"
    if (code, name) in _HINTS:
        text += f"; {_HINTS[code, name]}"
    return text


def _to_request(values: Mapping[str, object]) -> list[tuple[str, Any]]:
    from router.channel.qos import to_any

    return [(name, to_any(name, value)) for name, value in values.items()]


def check_qos(values: Mapping[str, object]) -> None:
    """Raise :class:`PropertyRefused` if a new channel would refuse this initial QoS (NS 2.5: create_channel)."""
    from router.channel import qos as Q

    try:
        Q.apply_qos(Q.channel_defaults(), _to_request(values), Q.Target(Q.Level.CHANNEL), Q.Context())
    except Q.QoSError as exc:
        raise PropertyRefused([describe_problem("--qos", p.code, p.name, p.low, p.high)
                               for p in exc.problems]) from None


def check_admin(values: Mapping[str, object]) -> None:
    """Raise :class:`PropertyRefused` if a new channel would refuse these admin properties."""
    from router.channel import qos as Q

    try:
        Q.apply_admin(Q.admin_defaults(), _to_request(values))
    except Q.AdminError as exc:
        raise PropertyRefused([describe_problem("--admin", p.code, p.name, p.low, p.high)
                               for p in exc.problems]) from None


def check_create_args(args: argparse.Namespace) -> tuple[dict[str, object], dict[str, object]]:
    """Parse and check ``--qos``/``--admin`` of ``channel create``; raises UsageError/PropertyRefused."""
    qos_table, admin_table = _tables()
    qos = parse_assignments(args.qos, qos_table, "--qos")
    admin = parse_assignments(args.admin, admin_table, "--admin")
    check_qos(qos)
    check_admin(admin)
    return qos, admin


def _node_refusal(option: str, errors: Iterable[Any]) -> list[str]:
    """``CosNotification.PropertyErrorSeq`` of UnsupportedQoS/UnsupportedAdmin → one line per property."""
    lines = []
    for err in errors:
        rng = err.available_range
        lines.append(describe_problem(option, err.code._n, err.name, _any(rng.low_val), _any(rng.high_val)))
    return lines


def _any(value: Any) -> object:
    try:
        v = value.value()
    except Exception:  # noqa: BLE001 — a TC_null or unknown Any: no range to show
        return None
    return getattr(v, "time", v)


def _properties(seq: Iterable[Any]) -> dict[str, object]:
    return {p.name: _any(p.value) for p in seq}


# -- talking to the node ---------------------------------------------------------------------------------------
def _read_snapshot(state_dir: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((state_dir / "status.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def run(args: argparse.Namespace, state_dir: Path, out: Out = print, err: Out = print) -> int:
    """Run one ``channel`` subcommand; results go to ``out``, refusals to ``err``; returns the exit code."""
    from omniORB import CORBA  # noqa: I001 — omniORB first: it puts the COS stubs on sys.path
    import CosNotification
    import CosNotifyChannelAdmin

    qos: dict[str, object] = {}
    admin: dict[str, object] = {}
    if args.channel_command == "create":  # checked before any connection: a usage error never needs a node
        qos, admin = check_create_args(args)
    endpoints = json.loads((state_dir / "endpoints.json").read_text())
    corbaloc = endpoints["event_channel_factory"]["corbaloc"]
    orb = CORBA.ORB_init(["nsjms-channel", "-ORBclientCallTimeOutPeriod", "15000"], CORBA.ORB_ID)
    try:
        factory = orb.string_to_object(corbaloc)._narrow(CosNotifyChannelAdmin.EventChannelFactory)
        return _dispatch(args, factory, state_dir, qos, admin, out)
    except CosNotifyChannelAdmin.ChannelNotFound:
        err(f"nsjms channel: no channel with id {args.id} (existing: {_ids(factory)})")
        return EXIT_REFUSED
    except CosNotification.UnsupportedQoS as exc:
        for line in _node_refusal("--qos", exc.qos_err):
            err(f"nsjms channel: refused by the node: {line}")
        return EXIT_REFUSED
    except CosNotification.UnsupportedAdmin as exc:
        for line in _node_refusal("--admin", exc.admin_err):
            err(f"nsjms channel: refused by the node: {line}")
        return EXIT_REFUSED
    except (CORBA.TRANSIENT, CORBA.COMM_FAILURE, CORBA.TIMEOUT, CORBA.OBJECT_NOT_EXIST) as exc:
        err(f"nsjms channel: node not reachable at {corbaloc}: {exc}")
        return 3
    finally:
        orb.destroy()


def _ids(factory: Any) -> str:
    try:
        return ", ".join(str(i) for i in factory.get_all_channels()) or "none"
    except Exception:  # noqa: BLE001 — only decorates a message
        return "unknown"


def _dispatch(args: argparse.Namespace, factory: Any, state_dir: Path, qos: Mapping[str, object],
              admin: Mapping[str, object], out: Out) -> int:
    cmd = args.channel_command
    if cmd == "create":
        from router.channel.qos import to_properties

        _, cid = factory.create_channel(to_properties(qos), to_properties(admin))
        out(json.dumps({"id": cid}) if args.json else f"channel {cid} created")
        return 0
    if cmd == "list":
        rows = _list(factory, _read_snapshot(state_dir))
        out(json.dumps(rows, indent=2, sort_keys=True) if args.json else _render_list(rows))
        return 0
    channel = factory.get_event_channel(args.id)
    if cmd == "destroy":
        channel.destroy()
        out(json.dumps({"id": args.id, "destroyed": True}) if args.json else f"channel {args.id} destroyed")
        return 0
    detail = show(channel, args.id, _read_snapshot(state_dir))
    out(json.dumps(detail, indent=2, sort_keys=True, default=str) if args.json else render_show(detail))
    return 0


def _snapshot_channel(snapshot: Mapping[str, Any], cid: int) -> dict[str, Any]:
    return next((dict(c) for c in snapshot.get("channels", []) if c.get("id") == cid), {})


def _list(factory: Any, snapshot: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    by_id = {c.get("id"): c for c in snapshot.get("channels", [])}     # one pass, not one per channel
    for cid in factory.get_all_channels():
        snap = dict(by_id.get(cid, {}))
        proxies = snap.get("proxy_suppliers")
        rows.append({"id": cid, "events_held": snap.get("events_held"),
                     "proxy_suppliers": None if proxies is None else len(proxies),
                     "queued": None if proxies is None else sum(int(p.get("queued", 0)) for p in proxies)})
    return rows


def _render_list(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "no channels"
    return "\n".join(f"channel {r['id']}: {_n(r['events_held'])} event(s) held, {_n(r['proxy_suppliers'])} proxy "
                     f"supplier(s), {_n(r['queued'])} queued" for r in rows)


def _n(value: object) -> str:
    return "?" if value is None else str(value)


def _filters(obj: Any) -> list[dict[str, Any]]:
    result = []
    for fid in obj.get_all_filters():
        f = obj.get_filter(fid)
        constraints = [{"id": c.constraint_id, "expression": c.constraint_expression.constraint_expr,
                        "event_types": [f"{t.domain_name}/{t.type_name}"
                                        for t in c.constraint_expression.event_types]}
                       for c in f.get_all_constraints()]
        result.append({"id": fid, "grammar": f._get_constraint_grammar(), "constraints": constraints})
    return result


def _admins(channel: Any, side: str, states: Mapping[tuple[int, int], Mapping[str, Any]]) -> list[dict[str, Any]]:
    ids, get_admin = ((channel.get_all_consumeradmins(), channel.get_consumeradmin) if side == "consumer"
                      else (channel.get_all_supplieradmins(), channel.get_supplieradmin))
    admins = []
    for aid in ids:
        adm = get_admin(aid)
        if side == "consumer":
            pids, get_proxy = [*adm._get_push_suppliers(), *adm._get_pull_suppliers()], adm.get_proxy_supplier
        else:
            pids, get_proxy = [*adm._get_push_consumers(), *adm._get_pull_consumers()], adm.get_proxy_consumer
        proxies = []
        for pid in sorted(set(pids)):
            proxy = get_proxy(pid)
            state = {k: v for k, v in states.get((aid, pid), {}).items() if k not in ("admin", "id", "kind")}
            proxies.append({"id": pid, "type": proxy._get_MyType()._n, "qos": _properties(proxy.get_qos()),
                            "filters": _filters(proxy), **state})
        admins.append({"id": aid, "operator": adm._get_MyOperator()._n, "qos": _properties(adm.get_qos()),
                       "filters": _filters(adm), "proxies": proxies})
    return admins


def show(channel: Any, cid: int, snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """Everything ``channel show`` prints, as plain data (the ``--json`` output)."""
    snap = _snapshot_channel(snapshot, cid)
    states = {(int(p["admin"]), int(p["id"])): p for p in snap.get("proxy_suppliers", [])}
    age = time.time() - float(snapshot["time"]) if snapshot.get("time") else None
    return {"id": cid, "qos": _properties(channel.get_qos()), "admin": _properties(channel.get_admin()),
            "events_held": snap.get("events_held"),
            "consumer_admins": _admins(channel, "consumer", states),
            "supplier_admins": _admins(channel, "supplier", states),
            "snapshot_age_s": None if age is None else round(age, 1)}


def _render_props(title: str, props: Mapping[str, object], indent: str) -> list[str]:
    return [f"{indent}{title}:"] + [f"{indent}  {k} = {format_value(k, v)}" for k, v in props.items()]


def _render_filters(filters: Sequence[Mapping[str, Any]], indent: str) -> list[str]:
    lines = []
    for f in filters:
        lines.append(f"{indent}filter {f['id']} ({f['grammar']}):")
        for c in f["constraints"]:
            types = ", ".join(c["event_types"]) or "*/*"
            lines.append(f"{indent}  constraint {c['id']}: [{types}] {c['expression'] or 'TRUE'}")
    return lines


def _proxy_state(p: Mapping[str, Any]) -> str:
    if "connected" not in p:
        return ""
    words = ["connected" if p["connected"] else "not connected"] + (["suspended"] if p.get("suspended") else [])
    words.append(f"queued {p.get('queued', 0)}")
    words += [f"{k}={v}" for k, v in p.items()
              if k not in {"id", "type", "qos", "filters", "connected", "suspended", "queued"}]
    return "  " + ", ".join(words)


def render_show(d: Mapping[str, Any]) -> str:
    lines = [f"channel {d['id']}" + (f": {d['events_held']} event(s) held" if d["events_held"] is not None else "")]
    lines += _render_props("QoS", d["qos"], "  ") + _render_props("admin properties", d["admin"], "  ")
    for side in ("consumer", "supplier"):
        for a in d[f"{side}_admins"]:
            lines.append(f"  {side} admin {a['id']} ({a['operator']}), {len(a['proxies'])} proxy(ies)")
            lines += _render_filters(a["filters"], "    ")
            for p in a["proxies"]:
                lines.append(f"    proxy {p['id']} {p['type']}{_proxy_state(p)}")
                lines += _render_filters(p["filters"], "      ")
    if d["snapshot_age_s"] is None:
        lines.append("  (no status.json snapshot: queue depths and proxy states unknown)")
    return "\n".join(lines)
