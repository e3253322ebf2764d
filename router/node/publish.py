"""What a running node publishes: its references (``factory.ior``, ``endpoints.json``: the "ready" signal), the
admin objects ``nsjms txn`` and ``nsjms deadletter`` ask, the status snapshot (``status.json`` every 2 s, ``nsjms
status``) and the telemetry gauges.

A mixin of :class:`router.node.server.Node`, which composes the parts it names (``factory``, ``bridges``, ``t2``,
``db``, ``store``, ``runtime``, ``orb``); kept apart so the node's start sequence (``server``) says one thing.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("nsjms.server")

__all__ = ["NodeReports", "write_endpoints"]


def write_endpoints(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (readers never see a partial file), mode 0600."""
    from router.node.lifecycle import write_private

    write_private(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


class NodeReports:
    """References, admin objects, the status snapshot and gauges of :class:`router.node.server.Node` (its
    attributes are the node's)."""

    s: Any
    orb: Any
    db: Any
    store: Any
    runtime: Any
    factory: Any
    bridges: Any
    t2: Any
    t2_gauges: Any
    txn_admin: Any
    dead_letter_admin: Any
    health: dict[str, Any]
    pg_dsn: str
    broker_url: str
    _db_facts: Any
    _stopped: threading.Event

    def _cluster_status(self) -> dict[str, Any]:
        raise NotImplementedError   # router.node.cluster.ClusterRole's

    def endpoints(self) -> dict[str, Any]:
        from router.node.config import redact_dsn

        host, port = self.s.orb_host, self.s.orb_port
        return {
            "event_channel_factory": {
                "corbaloc": f"corbaloc::{host}:{port}/NotifyEventChannelFactory",
                "ior": self.orb.object_to_string(self.factory.ref),
            },
            "bridge_factory": {
                "corbaloc": f"corbaloc::{host}:{port}/BridgeFactory",
                "ior": self.orb.object_to_string(self.bridges.ref),
            },
            "transaction_admin": {
                "corbaloc": f"corbaloc::{host}:{port}/TransactionAdmin",
                "ior": self.orb.object_to_string(self.txn_admin.ref),
            },
            "dead_letter_admin": {
                "corbaloc": f"corbaloc::{host}:{port}/DeadLetterAdmin",
                "ior": self.orb.object_to_string(self.dead_letter_admin.ref),
            },
            "postgres_dsn": redact_dsn(self.pg_dsn),
            "broker_url": redact_dsn(self.broker_url) if self.broker_url else None,
            "node_id": self.s.node_id,
            "pid": os.getpid(),
        }

    def snapshot(self) -> dict[str, Any]:
        """What ``nsjms status`` shows beyond the IDL: queue depths, proxy states, bridges, stored rows, services."""
        channels = []
        for cid, ch in sorted(self.factory.channels.items()):
            proxies = []
            for aid, admin in sorted(ch.consumer_admins.items()):
                for pid, proxy in sorted(admin.proxies.items()):
                    proxies.append({"admin": aid, "id": pid, "kind": proxy.kind, "connected": proxy.connected,
                                    "suspended": proxy.suspended, "queued": len(proxy.queue),
                                    **getattr(proxy, "status_extra", dict)()})
            consumers = []                  # proxy consumers with something to report (pulled events dead-lettered)
            for aid, admin in sorted(ch.supplier_admins.items()):
                for pid, proxy in sorted(admin.proxies.items()):
                    extra: dict[str, Any] = getattr(proxy, "status_extra", dict)()
                    if extra:
                        consumers.append({"admin": aid, "id": pid, "kind": proxy.kind, "connected": proxy.connected,
                                          "suspended": proxy.suspended, **extra})
            channels.append({"id": cid, "events_held": ch.queued_count(), "proxy_suppliers": proxies,
                             "proxy_consumers": consumers})
        facts = self._db_facts.get() if self._db_facts is not None else {"store": self._store_stats(),
                                                                         "transactions": self._t2_status()}
        return {"time": time.time(), "node_id": self.s.node_id, "channels": channels,
                "bridges": self.bridges.status() if self.bridges is not None else [],
                "store": facts["store"], "transactions": facts["transactions"],
                "cluster": self._cluster_status(),
                "services": {name: health.as_dict() for name, health in self.health.items()}}

    def _t2_status(self) -> dict[str, Any]:
        """In-doubt count, oldest age, recovery passes, outbox/inbox rows; also what the T2 gauges show."""
        from router.telemetry import T2Gauges

        if self.t2 is None:
            return {}
        try:
            status: dict[str, Any] = {**self.t2.status(), **self.t2.depths()}
        except Exception as exc:  # noqa: BLE001 — PostgreSQL down: status says so instead of dropping the snapshot
            from router.node.config import redact_dsn

            return {"error": redact_dsn(f"{type(exc).__name__}: {exc}")}
        self.t2_gauges = T2Gauges(status["in_doubt"], status["oldest_in_doubt_s"] or 0.0, status["outbox"],
                                  status["inbox"])
        return status

    def _store_stats(self) -> dict[str, int]:
        with self.db.unit_of_work() as conn:
            stats: dict[str, int] = self.store.stats(conn)
        pool = self.db.stats()           # psycopg_pool's counters: a starved pool shows here (waits, timeouts)
        stats.update(pool_size=pool.get("pool_size", 0), pool_available=pool.get("pool_available", 0),
                     pool_waiting=pool.get("requests_waiting", 0), pool_checkouts=pool.get("requests_num", 0),
                     pool_queued=pool.get("requests_queued", 0), pool_timeouts=pool.get("requests_errors", 0))
        accept = getattr(self.runtime, "accept_commits", None)
        if accept is not None:           # group commit of accepted persistent events: commits shared by pushes
            stats["accept_commits"], stats["accept_events"] = int(accept.commits), int(accept.events)
        return stats

    def _register_gauges(self) -> None:
        from router import telemetry

        def depths() -> list[tuple[int, str, int]]:
            return [(cid, proxy.oid, len(proxy.queue))
                    for cid, ch in list(self.factory.channels.items())
                    for admin in list(ch.consumer_admins.values())
                    for proxy in list(admin.proxies.values())]

        def bridges() -> list[tuple[int, bool]]:
            return [(b.id, b.active()) for b in list(self.bridges.bridges.values())]

        telemetry.register_gauges(depths, bridges)
        telemetry.register_t2_gauges(lambda: self.t2_gauges)  # refreshed by the status loop every 2 s

    def _status_loop(self) -> None:
        path = self.s.state_dir / "status.json"
        while not self._stopped.wait(2.0):
            for channel in list(self.factory.channels.values()):
                try:
                    channel.sweep_expired()
                except Exception:
                    log.warning("sweeping expired events of channel %d failed", channel.id, exc_info=True)
            try:
                write_endpoints(path, self.snapshot())
            except Exception:
                log.debug("status snapshot failed", exc_info=True)

    def _publish(self) -> None:
        from router.deadletter.admin import dead_letter_admin
        from router.node.lifecycle import write_private
        from router.routing.t2.admin import TransactionAdminImpl, node_ops

        self.txn_admin = TransactionAdminImpl(node_ops(self.t2, self.s.state_dir))
        self.txn_admin.activate(self.runtime.ins_poa)  # nsjms txn asks the running router (online mode)
        self.dead_letter_admin = dead_letter_admin(self)
        self.dead_letter_admin.activate(self.runtime.ins_poa)  # nsjms deadletter asks the running router
        # factory.ior first: endpoints.json is the "ready" signal, so every file it announces already exists
        write_private(self.s.state_dir / "factory.ior", self.orb.object_to_string(self.factory.ref) + "\n")
        path = self.s.state_dir / "endpoints.json"
        write_endpoints(path, self.endpoints())
        write_endpoints(self.s.state_dir / "status.json", self.snapshot())
        self._register_gauges()
        from router.node.status import DatabaseFacts  # the database's parts on their own thread: never blocks status

        facts = DatabaseFacts({"store": self._store_stats, "transactions": self._t2_status})
        facts.refresh()
        facts.start()
        self._db_facts = facts
        self.runtime.spawn("status", self._status_loop)
        log.info("nsjms node %s ready: %s", self.s.node_id, path)
