"""What ``nsjms audit --incremental`` prints and writes: the per-bridge and per-node tables, the metrics textfile,
and with ``--out DIR`` a ``incremental.json`` of every day in scope (pure functions but :func:`write_outputs`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from audit.incremental import OPEN, IncrementalResult, metrics_text, write_metrics

__all__ = ["COLUMNS", "SHOWN", "as_json", "by_key", "render", "write_outputs"]

_COLUMNS = ("delivered", "lost", "duplicated", "in_doubt", "in_flight", "dead_letter", "discarded", "expired")
COLUMNS = _COLUMNS   # the statuses of the tables, in their order (the console's audit page shows the same)
#: What ``nsjms audit --incremental`` prints and writes: also ``resent`` (a takeover's re-send, docs/audit.md "Nodes";
#: counted in ``delivered`` too, as ``duplicated`` is; not a violation). :func:`by_key` rows have it only when some.
SHOWN = (*_COLUMNS[:3], "resent", *_COLUMNS[3:])


def by_key(result: IncrementalResult, key: str) -> dict[Any, dict[str, int]]:
    """Obligations per status, summed over the days in scope, per ``key`` (``bridge``: (direction, bridge_id);
    ``node``: the obligation's node, :mod:`audit.incremental`; its rows also have ``multi_node``, the obligations
    among them whose rows name more than one node)."""
    table: dict[Any, dict[str, int]] = {}
    for d in result.days:
        for g in d.groups:
            k = (g.direction, g.bridge_id) if key == "bridge" else g.node
            row = table.setdefault(k, dict.fromkeys(_COLUMNS, 0))
            status = "delivered" if g.status in ("duplicated", "resent") else g.status
            row[status] = row.get(status, 0) + g.obligations
            if g.status in ("duplicated", "resent"):
                row[g.status] = row.get(g.status, 0) + g.obligations
            if key == "node":
                row["multi_node"] = row.get("multi_node", 0) + g.multi_node
    return table


def _table(head: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> list[str]:
    body = list(rows)
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            .rstrip() for r in [head, *body]]


def render(result: IncrementalResult) -> str:
    """The text ``nsjms audit --incremental`` prints."""
    if not result.days:
        return (f"audit (incremental, as of {result.as_of.isoformat()}): the window has no ledger rows: 0 "
                "obligations, nothing to reconcile")
    audited = ", ".join(f"{d.day} ({d.verdict})" for d in result.audited) or "none (no day changed)"
    lines = [f"audit (incremental, as of {result.as_of.isoformat()}): {len(result.days)} day(s) in scope, "
             f"reconciled now: {audited}"]
    lines += _table(("DAY", "VERDICT", "ROWS", "LOST", "DUPLICATED", "RESENT", "IN DOUBT", "IN FLIGHT", "AUDITED"),
                    ((str(d.day), d.verdict, str(d.rows), str(d.count("lost")), str(d.count("duplicated")),
                      str(d.count("resent")), str(d.count("in_doubt")), str(d.count("in_flight")),
                      "now" if d.audited else "kept")
                     for d in result.days))
    head = ("DIRECTION", "BRIDGE", *(c.upper().replace("_", " ") for c in SHOWN))
    bridges = by_key(result, "bridge")
    lines += ["", "per bridge:"]
    lines += _table(head, ((k[0], "-" if k[1] is None else str(k[1]), *(str(v.get(c, 0)) for c in SHOWN))
                           for k, v in sorted(bridges.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1))))
    nodes = by_key(result, "node")
    lines += ["", "per node (the node that wrote the accepted row; '-': no row names a node, older rows written "
                  "outside a routing transaction):"]
    lines += _table(("NODE", *head[2:], "MULTI NODE"),
                    ((k, *(str(v.get(c, 0)) for c in SHOWN), str(v.get("multi_node", 0)))
                     for k, v in sorted(nodes.items())))
    opened = [g.oldest for d in result.days for g in d.groups if g.status in OPEN and g.oldest is not None]
    if opened:
        lines.append(f"oldest open obligation: accepted {min(opened).isoformat()} "
                     f"({(result.as_of - min(opened)).total_seconds():.0f} s ago)")
    lines.append(f"total: lost {result.count('lost')}, duplicated {result.count('duplicated')}, "
                 f"in doubt {result.count('in_doubt')}, in flight {result.count('in_flight')}"
                 + (f"; re-sent at a takeover (allowed) {result.count('resent')}" if result.count("resent") else ""))
    return "\n".join(lines)


def as_json(result: IncrementalResult) -> dict[str, Any]:
    return {"as_of": result.as_of.isoformat(),
            "days": [{"day": str(d.day), "verdict": d.verdict, "rows": d.rows, "reconciled_now": d.audited,
                      "recheck_at": None if d.recheck_at is None else d.recheck_at.isoformat(),
                      "groups": [g.as_dict() for g in d.groups]} for d in result.days],
            "totals": {s: result.count(s) for s in SHOWN}}


def write_outputs(result: IncrementalResult, *, metrics: Path | None, out: Path | None) -> None:
    if metrics is not None:
        write_metrics(metrics, metrics_text(result))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / ".incremental.json.tmp"
        tmp.write_text(json.dumps(as_json(result), indent=2, sort_keys=True))
        tmp.replace(out / "incremental.json")
