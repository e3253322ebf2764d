"""``nsjms status``: a running node's endpoints, liveness (asked over IIOP), queues and bridges.

The node rewrites ``<state-dir>/status.json`` every 2 s with what the IDL does not expose (queue depths, proxy
states, bridge connections and counters, stored rows); this command checks the node answers over IIOP and shows
both. A snapshot older than 10 s is flagged as stale. The snapshot's ``services`` part says whether PostgreSQL and the
broker were reachable at the node's last probe (every 2 s), and for embedded ones their pid and restart count. Its
``transactions`` part is the routing transactions' state: how many are in doubt (``nsjms txn list`` shows them) and
the oldest one's age, recovery passes, outbox/inbox rows.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from router.bridge.states import bridge_state

__all__ = ["DatabaseFacts", "collect", "degraded", "render", "render_service", "render_transactions"]

STALE_AFTER_S = 10.0


def collect(state_dir: Path) -> dict[str, Any]:
    """Raises FileNotFoundError when no node runs there, ConnectionError when it does not answer."""
    endpoints = json.loads((state_dir / "endpoints.json").read_text())
    from omniORB import CORBA  # noqa: I001 — omniORB first: it puts the COS stubs on sys.path
    import CosNotifyChannelAdmin

    orb = CORBA.ORB_init(["nsjms-status", "-ORBclientCallTimeOutPeriod", "5000"], CORBA.ORB_ID)
    try:
        factory = orb.string_to_object(endpoints["event_channel_factory"]["corbaloc"])._narrow(
            CosNotifyChannelAdmin.EventChannelFactory)
        channel_ids = list(factory.get_all_channels())
    except (CORBA.TRANSIENT, CORBA.COMM_FAILURE, CORBA.TIMEOUT, CORBA.OBJECT_NOT_EXIST) as exc:
        raise ConnectionError(f"{endpoints['event_channel_factory']['corbaloc']}: {exc}") from exc
    finally:
        orb.destroy()
    snapshot: dict[str, Any] = {}
    try:
        snapshot = json.loads((state_dir / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        pass
    age = time.time() - float(snapshot.get("time", 0)) if snapshot else None
    return {"endpoints": endpoints, "channel_ids": channel_ids, "snapshot": snapshot,
            "snapshot_age_s": age, "stale": age is None or age > STALE_AFTER_S}


def degraded(report: dict[str, Any]) -> list[str]:
    """Why a node that answers is not fully working (``nsjms status`` exits 8 when any): PostgreSQL or the broker
    unreachable at the node's last probe, or a snapshot older than 10 s (the node's status writer is stuck; a node
    that just started and has not written one yet is not degraded). Bridges have their own state (``bridge list``).
    Pure."""
    snap = report.get("snapshot") or {}
    why = [f"{name} unreachable ({svc.get('key')} {svc.get('address')})"
           for name, svc in sorted((snap.get("services") or {}).items()) if svc.get("reachable") is False]
    age = report.get("snapshot_age_s")
    if snap and age is not None and age > STALE_AFTER_S:
        why.append(f"status snapshot {int(age)} s old (written every 2 s)")
    return why


class DatabaseFacts:
    """The parts of the node's snapshot that ask PostgreSQL (stored rows, the T2 counts), refreshed on a thread of
    their own every ``period_s``, so the status loop never waits on the database: a query that hangs on a cut
    network (bounded, ``router/db/conninfo.py``, but several of them in a row) would otherwise stop
    ``status.json`` from being rewritten (issue 31: 100 s without a snapshot). Each part is
    ``{"error": ...}`` when its query failed, and carries ``as_of`` (unix time of the answer) when it is older than
    the snapshot's own time by more than two periods, so a stale count shows as stale."""

    def __init__(self, parts: dict[str, Callable[[], dict[str, Any]]], period_s: float = 2.0) -> None:
        self._parts = parts
        self._period_s = period_s
        self._lock = threading.Lock()
        self._values: dict[str, tuple[float, dict[str, Any]]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        """Ask every part once (on the caller's thread)."""
        for name, part in self._parts.items():
            try:
                value = part()
            except Exception as exc:  # noqa: BLE001 — the database is down or slow: the snapshot says so
                from router.node.config import redact_dsn

                value = {"error": redact_dsn(f"{type(exc).__name__}: {exc}")[:300]}
            with self._lock:
                self._values[name] = (time.time(), value)

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self._period_s):
                self.refresh()

        self._thread = threading.Thread(target=loop, name="status-db", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def get(self) -> dict[str, dict[str, Any]]:
        """The latest value of each part (``{}`` for a part never answered yet)."""
        now = time.time()
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            values = dict(self._values)
        for name in self._parts:
            at, value = values.get(name, (0.0, {}))
            out[name] = dict(value)
            if value and now - at > 2 * self._period_s:
                out[name]["as_of"] = at
        return out


def render_service(name: str, svc: dict[str, Any]) -> str:
    """``postgres    reachable  (embedded, pid 12, restarts 1, last 2026-11-22T14:00:00Z)`` or UNREACHABLE + why."""
    state = {True: "reachable", False: "UNREACHABLE", None: "not checked yet"}[svc.get("reachable")]
    details = ["embedded" if svc.get("embedded") else "external"]
    if svc.get("pid"):
        details.append(f"pid {svc['pid']}")
    if svc.get("embedded"):
        details.append(f"restarts {svc.get('restarts', 0)}")
    if svc.get("last_restart"):
        details.append("last restart " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(svc["last_restart"])))
    line = f"{name:<11} {state}: {svc.get('key')} {svc.get('address')}  ({', '.join(details)})"
    if svc.get("error"):
        line += f"\n  why: {svc['error']}"
    if svc.get("last_restart_error"):
        line += f"\n  last restart failed: {svc['last_restart_error']}"
    return line


def _age(seconds: float) -> str:
    """``42s``, ``12m05s``, ``3h02m``, ``2d04h``."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def render_transactions(txn: dict[str, Any]) -> str:
    """``transactions 2 in doubt (oldest 12m05s): see `nsjms txn list`; recovery passes 31; outbox 0 rows, ...``"""
    if txn.get("error"):
        return f"transactions unknown: {txn['error']}"
    n = int(txn.get("in_doubt", 0))
    head = f"transactions {n} in doubt"
    if n:
        oldest = txn.get("oldest_in_doubt_s")
        head += f" (oldest {_age(oldest)})" if oldest is not None else ""
        head += ": see `nsjms txn list`"
    return (f"{head}; recovery passes {txn.get('recovery_passes', 0)}; outbox {txn.get('outbox', 0)} rows, "
            f"inbox {txn.get('inbox', 0)} rows{_as_of(txn)}")


def render_cluster(cluster: dict[str, Any]) -> str:
    """``cluster     epoch 3; members na live 18.2s, nb fenced (by na); took over nb 12:00:03Z (channels [0],
    bridges [0])`` (docs/cluster.md; ``nsjms cluster status`` has the whole view)."""
    if cluster.get("fenced"):
        return f"cluster     FENCED: {cluster.get('error') or 'this node was taken over'}; it stops"
    members = ", ".join(f"{m.get('node_id')} {m.get('state')}"
                        + (f" {m['lease_left_s']:.1f}s" if m.get("state") == "live" and "lease_left_s" in m else "")
                        for m in cluster.get("members") or [])
    line = f"cluster     epoch {cluster.get('epoch')}; members {members or '(not read yet)'}"
    for t in cluster.get("takeovers") or []:
        at = time.strftime("%H:%M:%SZ", time.gmtime(t.get("at", 0)))
        line += f"; took over {t.get('node_id')} {at} (channels {t.get('channels')}, bridges {t.get('bridges')}" \
            + ("" if t.get("started", True) else "; loading") + ")"
    if cluster.get("error"):
        line += f"\n  lease renewal failing: {cluster['error']}"
    return line


def _as_of(part: dict[str, Any]) -> str:
    """`` (as of 14:00:02Z: the database did not answer since)`` for a part the node could not refresh."""
    at = part.get("as_of")
    if not isinstance(at, (int, float)):
        return ""
    return f" (as of {time.strftime('%H:%M:%SZ', time.gmtime(at))}: the database did not answer since)"


def _missing_channel(bridge: dict[str, Any], channel_ids: list[int]) -> int | None:
    """The bridge's channel (``channel_id``, else from an endpoint ``"PUSH structured_event channel 3"``) when it no
    longer exists."""
    if isinstance(bridge.get("channel_id"), int):
        return None if bridge["channel_id"] in channel_ids else int(bridge["channel_id"])
    for text in (bridge.get("source", ""), bridge.get("sink", "")):
        m = re.search(r"\bchannel (\d+)$", str(text))
        if m and int(m.group(1)) not in channel_ids:
            return int(m.group(1))
    return None


def _flag(key: str, value: Any) -> str:
    """``key=value`` for a proxy line; a time (``*_at``, unix seconds) as UTC ``HH:MM:SS.mmmZ``."""
    if key.endswith("_at") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{key}={time.strftime('%H:%M:%S', time.gmtime(value))}.{int(value * 1000) % 1000:03d}Z"
    return f"{key}={value}"


def render(report: dict[str, Any]) -> str:
    ep, snap = report["endpoints"], report["snapshot"]
    bridge_ep = ep.get("bridge_factory") or {}
    lines = [
        f"node        {ep.get('node_id')} (pid {ep.get('pid')})",
        f"factory     {ep['event_channel_factory']['corbaloc']}  (answering)",
        f"bridges     {bridge_ep.get('corbaloc', '-')}",
    ]
    services = snap.get("services") or {}
    if not services:
        lines += [f"postgres    {ep.get('postgres_dsn')}", f"broker      {ep.get('broker_url') or '-'}"]
    lines.append(f"channels    {report['channel_ids']}")
    if report["stale"]:
        lines.append("snapshot    missing or stale (the node writes status.json every 2 s)")
    if report.get("degraded"):
        lines.append(f"DEGRADED    {'; '.join(report['degraded'])}")
    for name in ("postgres", "broker"):
        if name in services:
            lines.append(render_service(name, services[name]))
    txn = snap.get("transactions")
    if txn:
        lines.append(render_transactions(txn))
    if snap.get("cluster"):
        lines.append(render_cluster(snap["cluster"]))
    store = snap.get("store") or {}
    if store:
        lines.append(f"stored      {store.get('events', 0)} persistent events, {store.get('queued', 0)} queue rows"
                     + (f", {store['dead_letters']} dead letter(s) (nsjms deadletter list)"
                        if store.get("dead_letters") else "")
                     + f"{_as_of(store)}" if "error" not in store else f"stored      unknown: {store['error']}")
    for ch in snap.get("channels", []):
        lines.append(f"channel {ch['id']}: {ch['events_held']} event(s) held")
        for p in ch["proxy_suppliers"]:
            flags = [] if p["connected"] else ["not connected"]
            flags += ["suspended"] if p["suspended"] else []
            flags += [_flag(k, v) for k, v in p.items()
                      if k not in {"admin", "id", "kind", "connected", "suspended", "queued"}]
            lines.append(f"  admin {p['admin']} proxy {p['id']} {p['kind']:<16} queued {p['queued']:>6}"
                         f"  {' '.join(flags)}".rstrip())
        for p in ch.get("proxy_consumers", []):
            flags = [] if p["connected"] else ["not connected"]
            flags += ["suspended"] if p["suspended"] else []
            flags += [_flag(k, v) for k, v in p.items() if k not in {"admin", "id", "kind", "connected", "suspended"}]
            lines.append(f"  supplier admin {p['admin']} proxy {p['id']} {p['kind']:<16}  {' '.join(flags)}".rstrip())
    for b in snap.get("bridges", []):
        state = bridge_state(b, _missing_channel(b, report["channel_ids"]))
        lines.append(f"bridge {b['id']}: {b['source']} -> {b['sink']}  {state};  broker {b['broker']}, "
                     f"channel {'connected' if b['channel_connected'] else 'not connected'}, "
                     f"forwarded {b['forwarded']}, dead-lettered {b['dead_lettered']}, "
                     f"refused {b.get('refused_to_broker_dlq', 0)}, duplicates suppressed {b['duplicates_suppressed']}")
        if b.get("last_error"):
            lines.append(f"  last error: {b['last_error']}")
    return "\n".join(lines)
