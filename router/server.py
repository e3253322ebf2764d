"""``nsjms serve``: one node — embedded or given services, the ORB, the channel, ``endpoints.json``.

:func:`build` wires the parts together (no work at import time); :class:`Node` runs and stops them. The ORB
listens on a fixed loopback endpoint by default so persistent object references survive restarts.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["NodeSettings", "Node", "write_endpoints"]

log = logging.getLogger("nsjms.server")


@dataclass(frozen=True)
class NodeSettings:
    state_dir: Path
    orb_host: str = "127.0.0.1"
    orb_port: int = 2809
    orb_max_threads: int = 64
    pg_dsn: str = ""                 # empty: start the embedded PostgreSQL
    pg_embedded_port: int = 55432
    pg_pool_size: int = 8
    broker_url: str = ""             # empty: start the embedded ActiveMQ
    broker_login: str = ""
    broker_passcode: str = field(default="", repr=False)
    broker_stomp_port: int = 61613
    broker_openwire_port: int = 61616
    node_id: str = "node1"
    extra_orb_args: tuple[str, ...] = field(default_factory=tuple)


def orb_args(s: NodeSettings) -> list[str]:
    from router.channel.boundary import giop_max_msg_size

    return [
        "nsjms",
        "-ORBendPoint", f"giop:tcp:{s.orb_host}:{s.orb_port}",
        "-ORBmaxServerThreadPoolSize", str(s.orb_max_threads),
        "-ORBclientCallTimeOutPeriod", "30000",
        "-ORBclientConnectTimeOutPeriod", "5000",
        "-ORBtraceLevel", "1",            # level 1 logs unexpected servant exceptions with a traceback
        "-ORBnativeCharCodeSet", "UTF-8",  # IDL strings carry any Unicode text (JMS text bodies)
        # Above the channel's event size limit: a larger event reaches the servant, which refuses it with
        # IMP_LIMIT (docs/channel.md), and whatever the channel accepted fits in its own outgoing messages.
        "-ORBgiopMaxMsgSize", str(giop_max_msg_size()),
        *s.extra_orb_args,
    ]


def write_endpoints(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (readers never see a partial file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


class Node:
    """A running node. ``start()`` returns when the channel answers; ``stop()`` releases everything."""

    def __init__(self, settings: NodeSettings) -> None:
        self.s = settings
        self.services: list[Any] = []
        self.orb: Any = None
        self.store: Any = None
        self.runtime: Any = None
        self.factory: Any = None
        self.bridges: Any = None
        self.bridge_store: Any = None
        self.pg_dsn = settings.pg_dsn
        self.broker_url = settings.broker_url
        self._stopped = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self.s.state_dir.mkdir(parents=True, exist_ok=True)
        self._start_services()
        self._start_channel()
        self._publish()

    def _start_services(self) -> None:
        from router import services

        if not self.pg_dsn:
            pg = services.EmbeddedPostgres(self.s.state_dir, self.s.pg_embedded_port)
            self.pg_dsn = pg.start()
            self.services.append(pg)
        if not self.broker_url:
            mq = services.EmbeddedActiveMQ(self.s.state_dir, self.s.broker_stomp_port, self.s.broker_openwire_port)
            self.broker_url = mq.start()
            self.services.append(mq)

    def _start_channel(self) -> None:
        import omniORB  # noqa: F401 — puts the COS stubs on sys.path
        from omniORB import CORBA

        from router.channel.channel import EventChannelFactoryImpl
        from router.channel.runtime import Runtime
        from router.channel.store import Store

        self.orb = CORBA.ORB_init(orb_args(self.s), CORBA.ORB_ID)
        self.store = Store(self.pg_dsn, self.s.pg_pool_size)
        self.store.open()
        self.runtime = Runtime(self.orb, self.store)
        self.runtime.start_reaper()
        self.factory = EventChannelFactoryImpl(self.runtime)
        self.factory.activate()
        # Bridges' endpoint servants must be active before the channel restores: its dispatchers start at once and
        # push to them; a call to an object id that is not active yet fails with OBJECT_NOT_EXIST (measured), which
        # a proxy takes as "consumer gone". Bridge restore only activates servants; it does not touch channels.
        self._build_bridges()
        self.factory.restore()
        self.runtime.poa._get_the_POAManager().activate()
        self.runtime.ins_poa._get_the_POAManager().activate()
        self.bridges.resume()

    def _build_bridges(self) -> None:
        from router.bridge.bridge import BridgeFactoryImpl, BrokerSettings
        from router.bridge.codec import MappingCodec
        from router.bridge.store import BridgeStore
        from router.jms.transport import open_transport

        def transport(url: str, **opts: Any) -> Any:
            return open_transport(url, codec=MappingCodec(), **opts)

        self.bridge_store = BridgeStore(self.pg_dsn)
        self.bridge_store.open()
        broker = BrokerSettings(self.broker_url, self.s.broker_login, self.s.broker_passcode)
        self.bridges = BridgeFactoryImpl(self.factory, self.bridge_store, broker, transport, self.s.node_id)
        self.bridges.activate()
        self.bridges.restore()

    def endpoints(self) -> dict[str, Any]:
        from router.config import redact_dsn

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
            "postgres_dsn": redact_dsn(self.pg_dsn),
            "broker_url": redact_dsn(self.broker_url) if self.broker_url else None,
            "node_id": self.s.node_id,
            "pid": os.getpid(),
        }

    def snapshot(self) -> dict[str, Any]:
        """What ``nsjms status`` shows beyond the IDL: queue depths, proxy states, bridges, stored rows."""
        import time

        channels = []
        for cid, ch in sorted(self.factory.channels.items()):
            proxies = []
            for aid, admin in sorted(ch.consumer_admins.items()):
                for pid, proxy in sorted(admin.proxies.items()):
                    proxies.append({"admin": aid, "id": pid, "kind": proxy.kind, "connected": proxy.connected,
                                    "suspended": proxy.suspended, "queued": len(proxy.queue),
                                    **getattr(proxy, "status_extra", lambda: {})()})
            channels.append({"id": cid, "events_held": ch.queued_count(), "proxy_suppliers": proxies})
        return {"time": time.time(), "node_id": self.s.node_id, "channels": channels,
                "bridges": self.bridges.status() if self.bridges is not None else [],
                "store": self.store.stats()}

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

    def _status_loop(self) -> None:
        path = self.s.state_dir / "status.json"
        while not self._stopped.wait(2.0):
            for channel in list(self.factory.channels.values()):
                try:
                    channel.sweep_expired()
                except Exception:  # noqa: BLE001 — retried at the next tick
                    log.warning("sweeping expired events of channel %d failed", channel.id, exc_info=True)
            try:
                write_endpoints(path, self.snapshot())
            except Exception:  # noqa: BLE001 — status is best effort; the node keeps running
                log.debug("status snapshot failed", exc_info=True)

    def _publish(self) -> None:
        path = self.s.state_dir / "endpoints.json"
        write_endpoints(path, self.endpoints())
        (self.s.state_dir / "factory.ior").write_text(self.orb.object_to_string(self.factory.ref) + "\n")
        write_endpoints(self.s.state_dir / "status.json", self.snapshot())
        self._register_gauges()
        self.runtime.spawn("status", self._status_loop)
        log.info("nsjms node %s ready: %s", self.s.node_id, path)

    def wait(self) -> None:
        """Block until SIGTERM/SIGINT (main thread) or :meth:`stop`."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stopped.set())
        while not self._stopped.wait(0.5):
            pass

    def stop(self) -> None:
        self._stopped.set()
        if self.bridges is not None:
            self.bridges.shutdown()
        if self.runtime is not None:
            self.runtime.stop()
        if self.orb is not None:
            try:
                self.orb.shutdown(True)
                self.orb.destroy()
            except Exception:  # noqa: BLE001
                log.debug("ORB shutdown", exc_info=True)
        if self.store is not None:
            self.store.close()
        if self.bridge_store is not None:
            self.bridge_store.close()
        for svc in reversed(self.services):
            try:
                svc.stop()
            except Exception:  # noqa: BLE001
                log.exception("stopping %s", type(svc).__name__)
        for name in ("endpoints.json", "status.json"):
            try:
                (self.s.state_dir / name).unlink()
            except FileNotFoundError:
                pass
