"""``nsjms cluster drain NODE`` and ``nsjms cluster rebalance`` (router/cli/cluster.py parses them): write the
hand-off requests into PostgreSQL (router/cluster/handoff.py), wait until the nodes have carried them out, report."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import psycopg

from router.cli.cluster import EXIT_DIRTY, EXIT_FAILURE, EXIT_HEURISTIC, EXIT_OK, EXIT_REFUSED

__all__ = ["run_handoff"]

POLL_S = 0.5
_EXIT = {"clean": EXIT_OK, "dirty": EXIT_DIRTY, "heuristic": EXIT_HEURISTIC, "failed": EXIT_FAILURE}


def run_handoff(args: argparse.Namespace, dsn: str, connect_timeout: int) -> int:
    from router.cluster import handoff as H
    from router.db.conninfo import connect
    from router.node.config import redact_dsn

    try:
        with connect(dsn, autocommit=False, connect_timeout=connect_timeout) as conn:
            try:
                if args.cluster_command == "drain":
                    epoch, _ = H.request_drain(conn, args.node)
                    ids: list[int] = []
                else:
                    moves = H.request_rebalance(conn)
                    ids = [m.id for m in moves]
                conn.commit()
            except H.HandOffRefused as exc:
                conn.rollback()
                print(f"nsjms cluster {args.cluster_command}: refused: {exc}", file=sys.stderr)
                return EXIT_REFUSED
            conn.autocommit = True
            deadline = time.monotonic() + float(args.timeout)
            if args.cluster_command == "drain":
                return _wait_drain(conn, args, epoch, deadline)
            return _wait_rebalance(conn, args, ids, deadline)
    except psycopg.Error as exc:
        print(f"nsjms cluster: postgres.dsn {redact_dsn(dsn)}: {redact_dsn(str(exc).strip())}", file=sys.stderr)
        return EXIT_FAILURE


def _wait_drain(conn: Any, args: argparse.Namespace, epoch: int, deadline: float) -> int:
    from router.cluster import handoff as H

    while True:
        state = H.drain_state(conn, args.node, epoch)       # every drain move of this incarnation
        done = not state.live or (state.finished and state.reported)
        if done or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    result = state.verdict() if done else "failed"
    out = state.as_dict()
    out["result"] = result
    if not done:
        out["error"] = f"the hand-offs did not finish within {args.timeout:g} s"
    elif not state.live:
        out["error"] = f"node {args.node} (epoch {epoch}) is no longer a live member: the survivors take its work over"
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True, default=str))
    else:
        print(_render_drain(out))
    return _EXIT[result]


def _render_drain(out: dict[str, Any]) -> str:
    lines = [f"drain of {out['node_id']} (epoch {out['epoch']}): {out['result'].upper()}"]
    lines += [_render_move(m) for m in out["moves"]]
    if not out["moves"]:
        lines.append("  (it owned no channel)")
    still = out["still_owns"]
    if still["channels"] or still["bridges"]:
        lines.append(f"  still owns channels {still['channels']} and bridges {still['bridges']}")
    for t in out["in_doubt"]:
        lines.append(f"  in doubt: {t['gtrid']} {t['status']} (safe action: {t['action']})")
    for gid in out["prepared"]:
        lines.append(f"  prepared branch left in PostgreSQL: {gid}")
    for g in out["decided"]:
        lines.append(f"  decision row left: {g}")
    if out.get("error"):
        lines.append(f"  {out['error']}")
    if out["result"] == "dirty":
        lines.append("  the node still finishes these (or, if it stops, a survivor does from PostgreSQL); "
                     "`nsjms txn list` on the node shows them")
    return "\n".join(lines)


def _render_move(m: dict[str, Any]) -> str:
    took = f" in {m['handoff_s']:.1f} s (stop {m['stop_s']:.2f} s)" if m["handoff_s"] is not None else ""
    bridges = f" + bridges {m['bridges']}" if m["bridges"] else ""
    err = f": {m['error']}" if m["error"] else ""
    return f"  channel {m['channel']}{bridges}: {m['from']} -> {m['to']} {m['state']}{took}{err}"


def _wait_rebalance(conn: Any, args: argparse.Namespace, ids: list[int], deadline: float) -> int:
    from router.cluster import handoff as H

    while True:
        moves = H.moves_of(conn, ids)
        finished = all(m.state in ("started", "failed") for m in moves)
        if finished or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    failed = not finished or any(m.state == "failed" for m in moves)
    out: dict[str, Any] = {"result": "failed" if failed else "done", "moves": [m.as_dict() for m in moves]}
    if not finished:
        out["error"] = f"the hand-offs did not finish within {args.timeout:g} s"
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True, default=str))
    else:
        lines = [f"rebalance: {len(moves)} move(s), {out['result'].upper()}"]
        lines += [_render_move(m) for m in out["moves"]]
        if not moves:
            lines.append("  (the loads are even: nothing to move)")
        if out.get("error"):
            lines.append(f"  {out['error']}")
        print("\n".join(lines))
    return EXIT_FAILURE if failed else EXIT_OK
