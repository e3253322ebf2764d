"""What ``nsjms cluster status`` shows, read from PostgreSQL alone (any node, running or not, or an operator's
machine with the DSN): every member with its state, epoch, lease and address, what each owns, and the routing
transactions in doubt per node (prepared branches of its xid format; decisions a survivor has still to finish)."""

from __future__ import annotations

from typing import Any

import psycopg

from router.cluster import members as M
from xa.xid import parse_gtrid

__all__ = ["cluster_report", "render", "xid_gtrid", "xid_node"]

Conn = psycopg.Connection[Any]


def xid_gtrid(gid: str) -> str | None:
    """The nsjms gtrid of a prepared transaction's gid, None for a foreign one."""
    try:
        gtrid = psycopg.Xid.from_string(gid).gtrid
    except (ValueError, TypeError):
        return None
    return gtrid if parse_gtrid(gtrid) is not None else None


def xid_node(gid: str) -> str | None:
    """The node a prepared transaction's gid names (its xid's gtrid), None for a foreign one."""
    gtrid = xid_gtrid(gid)
    parsed = parse_gtrid(gtrid) if gtrid is not None else None
    return None if parsed is None else str(parsed.node)


def _prepared_by_node(conn: Conn) -> dict[str, int]:
    out: dict[str, int] = {}
    for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()").fetchall():
        node = xid_node(str(gid))
        if node is not None:
            out[node] = out.get(node, 0) + 1
    return out


def cluster_report(conn: Conn) -> dict[str, Any]:
    """The members (PostgreSQL's clock), what each owns, and its in-doubt work (see the module docstring)."""
    owned: dict[str, dict[str, list[int]]] = {}
    for node, kind, oid in conn.execute(
            "SELECT o.node_id, o.kind, o.object_id FROM nsjms_owner o WHERE "
            "(o.kind = 'channel' AND EXISTS (SELECT 1 FROM nsjms_channel c WHERE c.id = o.object_id)) OR "
            "(o.kind = 'bridge' AND EXISTS (SELECT 1 FROM nsjms_bridge b WHERE b.id = o.object_id)) "
            "ORDER BY o.node_id, o.kind, o.object_id").fetchall():
        owned.setdefault(str(node), {"channels": [], "bridges": []})[f"{kind}s"].append(int(oid))
    prepared = _prepared_by_node(conn)
    decisions = {str(n): int(c) for n, c in
                 conn.execute("SELECT node_id, count(*) FROM nsjms_decision GROUP BY node_id").fetchall()}
    fenced = {str(n): (str(b) if b else None, f) for n, b, f in
              conn.execute("SELECT node_id, fenced_by, fenced_at FROM nsjms_member").fetchall()}
    draining = {str(n) for (n,) in conn.execute(
        "SELECT d.node_id FROM nsjms_drain d JOIN nsjms_member m ON m.node_id = d.node_id AND m.epoch = d.epoch"
    ).fetchall()}
    members = []
    for m in M.members(conn):
        by, at = fenced.get(m.node_id, (None, None))
        members.append({
            "node_id": m.node_id, "state": m.state if m.state != "live" or m.live else "expired", "epoch": m.epoch,
            "address": m.address, "lease_left_s": round(m.lease_left_s, 1),
            "since_renewal_s": round((m.now - m.renewed_at).total_seconds(), 1),
            "fenced_by": by, "fenced_at": at.isoformat() if at is not None else None,
            "owns": owned.get(m.node_id, {"channels": [], "bridges": []}),
            "in_doubt": {"prepared": prepared.get(m.node_id, 0), "decided": decisions.get(m.node_id, 0)},
            "draining": m.node_id in draining,
        })
    return {"members": members,
            "unowned": _unowned(conn),
            "handoffs": _open_handoffs(conn)}


def _open_handoffs(conn: Conn) -> list[dict[str, Any]]:
    """Moves claimed (a takeover's share, until the recovery), requested or released, not started yet
    (router/cluster/handoff.py, spread.py)."""
    return [{"channel": int(c), "from": str(f), "to": str(t), "reason": str(r), "state": str(s)}
            for c, f, t, r, s in conn.execute(
                "SELECT channel_id, from_node, to_node, reason, state FROM nsjms_handoff "
                "WHERE state IN ('claimed', 'requested', 'released') ORDER BY id").fetchall()]


def _unowned(conn: Conn) -> dict[str, list[int]]:
    """Channels and bridges no node owns (a database no node of this version has started on yet)."""
    channels = [int(r[0]) for r in conn.execute(
        "SELECT id FROM nsjms_channel c WHERE NOT EXISTS (SELECT 1 FROM nsjms_owner o WHERE o.kind = 'channel' "
        "AND o.object_id = c.id) ORDER BY id").fetchall()]
    bridges = [int(r[0]) for r in conn.execute(
        "SELECT id FROM nsjms_bridge b WHERE NOT EXISTS (SELECT 1 FROM nsjms_owner o WHERE o.kind = 'bridge' "
        "AND o.object_id = b.id) ORDER BY id").fetchall()]
    return {"channels": channels, "bridges": bridges}


def render(report: dict[str, Any]) -> str:
    """The text form of :func:`cluster_report`."""
    lines = [f"{'NODE':<16} {'STATE':<8} {'EPOCH':>5} {'LEASE LEFT':>10} {'RENEWED':>8}  {'CHANNELS':<16} "
             f"{'BRIDGES':<16} IN DOUBT  ADDRESS"]
    for m in report["members"]:
        owns = m["owns"]
        doubt = m["in_doubt"]
        lines.append(f"{m['node_id']:<16} {m['state']:<8} {m['epoch']:>5} {m['lease_left_s']:>9.1f}s "
                     f"{m['since_renewal_s']:>6.1f}s ago  {_ids(owns['channels']):<16} {_ids(owns['bridges']):<16} "
                     f"{doubt['prepared']}p/{doubt['decided']}d    {m['address'] or '-'}"
                     + (f"  (fenced by {m['fenced_by']})" if m["fenced_by"] and m["state"] == "fenced" else "")
                     + ("  (draining)" if m.get("draining") else ""))
    if not report["members"]:
        lines.append("(no member: no node of this version has started on this database)")
    unowned = report["unowned"]
    if unowned["channels"] or unowned["bridges"]:
        lines.append(f"unowned: channels {_ids(unowned['channels'])}, bridges {_ids(unowned['bridges'])} (the next "
                     "node to start adopts them)")
    for h in report.get("handoffs", []):
        lines.append(f"hand-off ({h['reason']}): channel {h['channel']} {h['from']} -> {h['to']}, {h['state']}")
    lines.append("IN DOUBT: prepared branches of the node's xids (p) / decisions a survivor has still to finish (d)")
    return "\n".join(lines)


def _ids(ids: list[int]) -> str:
    return ",".join(map(str, ids)) or "-"
