"""``nsjms serve``: one node — embedded or given services, the ORB, the channel, ``endpoints.json``.

:class:`Node` wires the parts together (no work at import time), runs and stops them. The ORB listens on a fixed
loopback endpoint by default so persistent object references survive restarts.

Start order: (1) take the state directory's exclusive lock — a second node on the same directory is refused
before it touches anything (:class:`router.node.lifecycle.StateDirLocked`); (2) make the state directory private
(umask 0077, no group/other bits); (3) the checks that can end the start without a service being touched: the ORB
endpoint can be bound, and an external ``postgres.dsn`` answers within ``postgres.connect_timeout_s`` (else
:class:`router.node.lifecycle.ServiceUnreachable` naming ``postgres.dsn``); (4) start or reuse the embedded services,
filling the embedded broker's generated credentials into the bridges' broker settings; (5) check an embedded
PostgreSQL answers and probe the broker (an unreachable broker is logged as an error naming ``broker.url``; the
node serves and its bridges reconnect by themselves); (6) the ORB, channels, bridges; (7) ``endpoints.json`` and
one watch thread per service, which keeps reachability for ``status.json`` and restarts a dead embedded service
with backoff.

A start that fails after (4) is undone with ``stop(start_failed=True)``: services this start launched are stopped,
services it found running and adopted (left by a killed node) keep running for the next start — a node that cannot
start (PostgreSQL down, say) under systemd's ``Restart=on-failure`` must not stop and restart the broker every
cycle. :func:`stop_services` stops a state directory's embedded services when no node runs there (``nsjms
stop-services``, the systemd unit's ``ExecStopPost``).

This module is the start sequence and the stop; the node's other concerns are mixins and modules beside it:
:mod:`router.node.statedir` (the lock, who may traverse the directory, ``stop-services``),
:mod:`router.node.watches` (the start's checks, the service watches' probes, ledger maintenance),
:mod:`router.node.publish` (``factory.ior``, ``endpoints.json``, the admin objects, ``status.json``, gauges) and
:mod:`router.node.cluster` (membership, fencing, takeover).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router.node.cluster import ClusterRole
from router.node.config import DEFAULT_MAX_EVENT_BYTES
from router.node.publish import NodeReports, write_endpoints
from router.node.statedir import broker_may_traverse, lock_state_dir, postgres_may_traverse, stop_services
from router.node.watches import NodeWatches
from router.quotas import NodeLimits
from router.routing.ledger import LedgerSettings

__all__ = ["Node", "NodeSettings", "stop_services", "write_endpoints"]

_postgres_may_traverse = postgres_may_traverse   # its name before the state directory's module (router/cli/txn.py)

log = logging.getLogger("nsjms.server")

#: The interpreter's thread switch interval in a running node (``sys.setswitchinterval``; CPython's default is 5 ms).
#: A thread that wants the GIL while another runs Python code waits until that one blocks or this interval ends.
#: In a node, the threads that wait are often the ones a supplier waits for (a servant back from its PostgreSQL
#: commit, an ORB thread starting an upcall) while a bridge's delivery thread maps and frames a batch. 1 ms asks the
#: holder to hand over sooner, at the cost of more frequent switches (which waiting thread runs next is not
#: promised). Its effect is not established on the project's 2-core machine (docs/performance.md, "Round 5" and the
#: idle A/B after it); 0.005 is CPython's default.
GIL_SWITCH_INTERVAL_S = 0.001


@dataclass(frozen=True)
class NodeSettings:
    state_dir: Path
    orb_host: str = "127.0.0.1"
    orb_port: int = 2809
    orb_max_threads: int = 64
    orb_giop_max_msg_size: int = 0   # orb.giop_max_msg_size; 0: derived from max_event_bytes
    pg_dsn: str = ""                 # empty: start the embedded PostgreSQL
    pg_embedded_port: int = 55432
    pg_pool_size: int = 8
    broker_url: str = ""             # empty: start the embedded ActiveMQ
    broker_login: str = ""
    broker_passcode: str = field(default="", repr=False)
    broker_stomp_port: int = 61613
    broker_openwire_port: int = 61616
    broker_amq_dupl_id: bool = False     # broker.amq_dupl_id: T2 sends carry _AMQ_DUPL_ID (docs/bridge.md)
    pg_connect_timeout_s: float = 10.0
    broker_connect_timeout_s: float = 10.0
    watch_interval_s: float = 2.0
    node_id: str = "node1"
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES   # node.max_event_bytes: channel, ORB, bridge, mapping
    extra_orb_args: tuple[str, ...] = field(default_factory=tuple)
    ledger: LedgerSettings = field(default_factory=LedgerSettings)   # [ledger]: router/routing/ledger.py
    gil_switch_interval_s: float = GIL_SWITCH_INTERVAL_S   # sys.setswitchinterval while the node runs
    limits: NodeLimits = field(default_factory=NodeLimits)  # [limits]: router/quotas.py
    cluster_renew_s: float = 2.0     # [cluster] renew_s / expiry_s: the membership lease (docs/cluster.md)
    cluster_expiry_s: float = 20.0
    cluster_placement: str = "creator"   # [cluster] placement: who owns a new channel (docs/cluster.md)
    cluster_rebalance_on_join: bool = False   # [cluster] rebalance_on_join: ask for a share at join
    cluster_peers: tuple[str, ...] = ()   # [cluster] peers: other nodes' host:port, published in every reference


def orb_args(s: NodeSettings, publish: list[str] | None = None) -> list[str]:
    """``publish``: the addresses every reference carries (this node's first, the other nodes' as alternate IIOP
    addresses; router/cluster/forward.py); None or one address: the ORB publishes its endpoint alone."""
    from router.channel.boundary import giop_max_msg_size
    from router.cluster.forward import endpoint_publish

    return [
        "nsjms",
        "-ORBendPoint", f"giop:tcp:{s.orb_host}:{s.orb_port}",
        "-ORBmaxServerThreadPoolSize", str(s.orb_max_threads),
        "-ORBclientCallTimeOutPeriod", "30000",
        "-ORBclientConnectTimeOutPeriod", "5000",
        # omniORB's scavenger wakes every scanGranularity s (default 5) and ORB::destroy waits for it: a clean stop
        # (SIGTERM) spent about 4 of its 6 s there. 1 s keeps the idle-connection scan and ends a stop in ~1 s.
        "-ORBscanGranularity", "1",
        "-ORBtraceLevel", "1",            # level 1 logs unexpected servant exceptions with a traceback
        "-ORBnativeCharCodeSet", "UTF-8",  # IDL strings carry any Unicode text (JMS text bodies)
        # Above the channel's event size limit: a larger event reaches the servant, which refuses it with
        # IMP_LIMIT (docs/channel.md), and whatever the channel accepted fits in its own outgoing messages.
        "-ORBgiopMaxMsgSize", str(s.orb_giop_max_msg_size or giop_max_msg_size(s.max_event_bytes)),
        *endpoint_publish(publish or []),
        *s.extra_orb_args,
    ]


class Node(ClusterRole, NodeWatches, NodeReports):
    """A running node. ``start()`` returns when the channel answers; ``stop()`` releases everything."""

    def __init__(self, settings: NodeSettings, *, after_lock: Any = None) -> None:
        """``after_lock``: called once the state directory's lock is held, before anything else starts (the CLI
        installs telemetry there, so the first recovery pass is recorded and a refused node touches no port)."""
        self.s = settings
        self.after_lock = after_lock
        self.services: list[Any] = []
        self.orb: Any = None
        self.db: Any = None
        self.store: Any = None
        self.runtime: Any = None
        self.factory: Any = None
        self.bridges: Any = None
        self.t2: Any = None
        self.t2_gauges: Any = None  # router.telemetry.T2Gauges of the last status snapshot
        self.txn_admin: Any = None  # router.routing.t2.admin.TransactionAdminImpl
        self.dead_letter_admin: Any = None  # router.deadletter.admin.DeadLetterAdminImpl
        self.bridge_store: Any = None
        self.pg_dsn = settings.pg_dsn
        self.broker_url = settings.broker_url
        self.broker_login = settings.broker_login
        self.broker_passcode = settings.broker_passcode
        self.embedded_pg: Any = None
        self.embedded_mq: Any = None
        self.health: dict[str, Any] = {}
        self.watches: list[Any] = []
        self._pg_probe: Any = None  # router.db.health.PostgresProbe, the PostgreSQL watch's kept connection
        self._switch_interval_before: float | None = None     # sys.getswitchinterval() before tune_interpreter
        self._lock: Any = None
        self._stopped = threading.Event()
        self.membership: Any = None      # router.cluster.node.Membership
        self.incarnation: str | None = None   # this process's token (router.cluster.sessions)
        self.takeover: Any = None        # router.cluster.takeover.Takeover
        self.fenced = False              # the node's work was taken over: it stopped acting (docs/cluster.md)
        self._db_facts: Any = None  # router.node.status.DatabaseFacts once published

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Raises StateDirLocked (nothing touched), ServiceUnreachable, ServiceError; then call :meth:`stop`."""
        os.umask(0o077)  # every file this process or its services create is private
        self._install_stop_signals()  # before endpoints.json says "ready": a SIGTERM from then on stops cleanly
        self._lock = lock_state_dir(self.s.state_dir)
        if self.after_lock is not None:
            self.after_lock()
        self._private_state_dir()
        self.tune_interpreter()
        self._check_before_services()
        self._start_services()
        self._check_services()
        self._start_channel()
        self._publish()
        if self._pg_probe is not None:   # made before the node's sessions were named: the watch makes a named one
            self._pg_probe.close()
        for watch in self.watches:
            watch.start()

    def tune_interpreter(self) -> None:
        """Process-wide interpreter settings of a node: the thread switch interval (:data:`GIL_SWITCH_INTERVAL_S`),
        given back by :meth:`stop` (a process that runs a node and goes on, a test, keeps its own)."""
        if self._switch_interval_before is None:
            self._switch_interval_before = sys.getswitchinterval()
        sys.setswitchinterval(self.s.gil_switch_interval_s)

    def _private_state_dir(self) -> None:
        """No group/other bits anywhere; as root with an embedded PostgreSQL (configured, or one whose cluster lives
        here and may still run), the ``postgres`` group may traverse the top directory (its server runs as that
        user and lives in ``pg/``, which it owns with mode 0700); as root with the embedded broker, which runs as
        ``activemq`` and owns ``activemq/`` (0700), the broker traverses it through the directory's group (0710):
        ``postgres``, which the broker's JVM then holds as a supplementary group, else ``activemq``."""
        from router.node.lifecycle import private_tree

        private_tree(self.s.state_dir)
        if not self.pg_dsn or (self.s.state_dir / "pg").exists():
            postgres_may_traverse(self.s.state_dir)
        if not self.broker_url:
            broker_may_traverse(self.s.state_dir)

    def _start_services(self) -> None:
        from router.node import services

        if not self.pg_dsn:
            self.embedded_pg = services.EmbeddedPostgres(self.s.state_dir, self.s.pg_embedded_port)
            self.services.append(self.embedded_pg)
            self.pg_dsn = self.embedded_pg.start()
        if not self.broker_url:
            self.embedded_mq = services.EmbeddedActiveMQ(
                self.s.state_dir, self.s.broker_stomp_port, self.s.broker_openwire_port, authenticate=True,
                os_user=services.BROKER_OS_USER if os.geteuid() == 0 else None,   # never a root JVM
            )
            self.services.append(self.embedded_mq)
            self.broker_url = self.embedded_mq.start()
            self.broker_login, self.broker_passcode = self.embedded_mq.login, self.embedded_mq.passcode

    def _start_channel(self) -> None:
        import omniORB  # noqa: F401 — puts the COS stubs on sys.path
        from omniORB import CORBA

        from router.channel.channel import EventChannelFactoryImpl
        from router.channel.delivered import DeliveredJournals
        from router.channel.runtime import Runtime
        from router.channel.store import Store
        from router.channel.t2in import LocalRounds
        from router.cluster.forward import owner_lookup
        from router.cluster.sessions import new_incarnation, session_name
        from router.db import Database
        from router.db.conninfo import name_sessions
        from router.routing.ledger import LedgerWriter

        self._secure_admin()                # before ORB_init: the credential interceptor
        self.incarnation = new_incarnation()   # its sessions are named after it: a survivor can end them
        name_sessions(session_name(self.s.node_id, self.incarnation))
        self.db = Database(self.pg_dsn, self.s.pg_pool_size)
        self.db.open()                     # one pool for the node; applies the missing schema migrations
        addresses = self._cluster_addresses()     # before ORB_init: every reference carries the other nodes'
        self.orb = CORBA.ORB_init(orb_args(self.s, addresses), CORBA.ORB_ID)
        self._join_cluster()               # refused (NodeLive) when another process runs with this node id
        self.store = Store(LedgerWriter(self.s.ledger, node_id=self.s.node_id))
        started_ok = self.maintain_ledger()   # today's partitions exist before the first routed event
        self.runtime = Runtime(self.orb, self.db, self.store, max_event_bytes=self.s.max_event_bytes)
        self.runtime.forwarder.starting = True     # until configured after the restore: TRANSIENT, never "gone"
        self.runtime.limits = self.s.limits
        self.runtime.delivered = DeliveredJournals(self.s.state_dir / "delivered")   # push proxies' journals
        self.runtime.endpoints.inbound_rounds = LocalRounds()     # the channel's side of a bridge's local rounds
        self.t2 = self._start_transactions()
        self.runtime.t2 = self.t2
        self.runtime.start_reaper()
        self.runtime.spawn("ledger-maintenance", lambda: self._ledger_loop(started_ok))
        self.factory = EventChannelFactoryImpl(self.runtime)
        self.factory.activate()
        # Bridges' endpoint servants must be active before the channel restores: its dispatchers start at once and
        # push to them; a call to an object id that is not active yet fails with OBJECT_NOT_EXIST (measured), which
        # a proxy takes as "consumer gone". Bridge restore only activates servants; it does not touch channels.
        # It also registers each bridge's ledger route (BridgeImpl._register_ledger_route), which the
        # delivered-events journal replay inside factory.restore() needs: replayed rows carry the bridge id,
        # destination and direction (keep this order).
        owned = self._owned_at_start()     # a cluster member restores only what it owns (docs/cluster.md)
        self._build_bridges(set(owned.bridges))
        self.t2.late.restoring()           # restore loads what was committed so far (router/routing/t2/latecommit.py)
        self.factory.restore(set(owned.channels))
        self._queue_late_commits()
        self.runtime.forwarder.configure(self.s.node_id, owner_lookup(self.db), self._runs)   # every object key
        self.runtime.poa._get_the_POAManager().activate()
        self.runtime.ins_poa._get_the_POAManager().activate()
        self.bridges.resume()
        self._start_takeover()

    def _cluster_addresses(self) -> list[str]:
        """This node's ``host:port`` first, then the other nodes' (``cluster.peers`` and the members PostgreSQL
        knows): the addresses every reference of this node carries (docs/cluster.md, "CORBA addressing")."""
        from router.cluster.forward import cluster_addresses

        with self.db.unit_of_work() as conn:
            return cluster_addresses(conn, self.s.node_id, self._own_address(),
                                     self.s.cluster_peers)

    def _runs(self, obj: tuple[str, int]) -> bool:
        """Whether this node runs the channel or bridge now (loaded, not still being loaded at a takeover)."""
        kind, oid = obj
        if kind == "channel":
            return oid in self.factory.channels and oid not in self.factory.arriving
        return self.bridges is not None and oid in self.bridges.bridges

    def _queue_late_commits(self) -> None:
        """From now on, the events of PostgreSQL branches recovery or an operator commits (JMS -> channel T2s their
        driver does not queue) are queued by the running channels, first those committed since the start
        (router/routing/t2/latecommit.py)."""
        from functools import partial

        from router.channel.late import queue_committed

        self.t2.late.attach(partial(queue_committed, self.factory))

    def _secure_admin(self) -> None:
        """Admin credentials (generated on first start, 0600), the server interceptor, the servant guards
        (router/security/auth.py, router/node/adminguard.py, docs/security.md)."""
        from router.node import adminguard
        from router.security import auth

        made = auth.ensure_defaults(self.s.state_dir)
        if made:
            log.info("admin credentials generated for %s in %s", ", ".join(made),
                     auth.credentials_dir(self.s.state_dir))
        auth.install_server(auth.Authenticator(self.s.state_dir))
        adminguard.apply()

    def _start_transactions(self) -> Any:
        """The node's T2 machinery; its first recovery pass runs BEFORE the channel restores its queues (a logged
        COMMIT still to finish removes queue rows that restore would otherwise load and deliver again)."""
        from router.jms.transport import open_transport
        from router.mapping.stomp_codec import StompCodec, node_codecs
        from router.routing.t2.transactions import NodeTransactions

        def transport() -> Any:
            return open_transport(self.broker_url, codec=StompCodec(), username=self.broker_login,
                                  password=self.broker_passcode)

        from router.telemetry import T2Telemetry

        t2 = NodeTransactions(self.s.node_id, self.s.state_dir, self.db, self.pg_dsn, transport=transport,
                              observer=T2Telemetry(), ledger_hops=self.s.ledger.enabled, epoch=self._live_epoch,
                              codecs=node_codecs(), dead_letter=self.broker_settings().dead_letter)
        report = t2.start()
        if report.committed or report.rolled_back or report.resent or report.errors:
            log.info("T2 recovery at start: committed %d, rolled back %d, re-sent %d, %d problem(s)",
                     len(report.committed), len(report.rolled_back), len(report.resent), len(report.errors))
        return t2

    def _build_bridges(self, only: set[int] | None = None) -> None:
        from router.bridge.bridge import BridgeFactoryImpl
        from router.bridge.store import BridgeStore
        from router.jms.transport import open_transport

        settings = self.broker_settings()

        def transport(url: str, **opts: Any) -> Any:
            return open_transport(url, codec=settings.codec, **opts)     # the codec the bridges map with

        self.bridge_store = BridgeStore()
        self.bridges = BridgeFactoryImpl(self.factory, self.bridge_store, settings, transport,
                                         self.s.node_id)
        self.bridges.activate()
        self.bridges.restore(only)

    def broker_settings(self) -> Any:
        """The bridges' BrokerSettings: the broker, and the node's one event size limit (``node.max_event_bytes``)
        for JMS -> channel events and message bodies; a topic source's heart-beat from the cluster lease."""
        from router.bridge.bridge import BrokerSettings
        from router.bridge.brokerlink import subscriber_heartbeat_ms
        from router.mapping.stomp_codec import StompCodec

        return BrokerSettings(self.broker_url, self.broker_login, self.broker_passcode,
                              max_event_bytes=self.s.max_event_bytes, amq_dupl_id=self.s.broker_amq_dupl_id,
                              codec=StompCodec(), sub_heartbeat_ms=subscriber_heartbeat_ms(self.s.cluster_expiry_s))

    def _install_stop_signals(self) -> None:
        """SIGTERM/SIGINT end :meth:`wait` (only the main thread may set handlers; elsewhere call :meth:`stop`)."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self._stopped.set())

    def wait(self) -> None:
        """Block until SIGTERM/SIGINT (handlers installed by :meth:`start`) or :meth:`stop`."""
        while not self._stopped.wait(0.5):
            pass

    def stop(self, *, start_failed: bool = False) -> None:
        """Release everything this node started; a node that never got the state directory's lock touches nothing.

        ``start_failed``: undo a failed :meth:`start` — an embedded service it adopted (found running, left by a
        killed node) keeps running for the next start; only services this start launched are stopped."""
        self._stopped.set()
        if self._db_facts is not None:
            self._db_facts.stop()
        if self._switch_interval_before is not None:
            sys.setswitchinterval(self._switch_interval_before)
            self._switch_interval_before = None
        if self._lock is None:
            return
        for watch in self.watches:
            watch.stop()  # before the services stop: a watch would restart them
        if self._pg_probe is not None:
            self._pg_probe.close()
        if self.takeover is not None:
            self.takeover.stop()         # before the bridges: a takeover pass may be starting some
        if self.bridges is not None:
            self.bridges.shutdown()
        if self.runtime is not None:
            self.runtime.stop()
        if self.t2 is not None:
            self.t2.close()
        if self.orb is not None:
            try:
                self.orb.shutdown(True)
                self.orb.destroy()
            except Exception:
                log.debug("ORB shutdown", exc_info=True)
        if self.membership is not None:
            self.membership.stop()       # leaves: a survivor may claim this node's work at once
        if self.db is not None:
            self.db.close()
        for svc in reversed(self.services):
            if start_failed and getattr(svc, "reused", False):
                log.warning("leaving the running %s (pid %s) for the next start", type(svc).__name__, svc.pid)
                continue
            try:
                svc.stop()
            except Exception:
                log.exception("stopping %s", type(svc).__name__)
        for name in ("endpoints.json", "status.json"):
            try:
                (self.s.state_dir / name).unlink()
            except FileNotFoundError:
                pass
        self._lock.release()
        self._lock = None
