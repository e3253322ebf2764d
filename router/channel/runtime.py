"""The channel runtime: ORB, persistent POA, store, id formats and background threads.

Object references are persistent (NS 2.5.5.1, ConnectionReliability): servants live in a PERSISTENT/USER_ID POA
on a fixed endpoint, with object ids derived from the NS ids (``ch/<channel>``, ``ch/<c>/<side>/<admin>``,
``ch/<c>/<side>/<admin>/<proxy>``), so a reference handed out before a restart names the same object after it.
The factory is activated in omniORB's INS POA under the key ``NotifyEventChannelFactory`` so that
``corbaloc::HOST:PORT/NotifyEventChannelFactory`` resolves.

The persistent POA has a servant manager (:class:`router.cluster.forward.Forwarder`, USE_SERVANT_MANAGER with
RETAIN): an id that is not active here is answered from its owner in a cluster (``LOCATION_FORWARD`` to the node
that runs it, ``TRANSIENT`` while nobody does), else ``OBJECT_NOT_EXIST`` as before (docs/cluster.md).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from omniORB import CORBA, PortableServer

from router.channel.boundary import DEFAULT_MAX_EVENT_BYTES
from router.channel.deadletters import DeadLetterStore
from router.channel.delivered import DeliveredJournals
from router.channel.groupcommit import MAX_WAIT_S, GroupCommit
from router.channel.store import Store
from router.cluster.forward import Forwarder
from router.db import Database, StoreError
from router.quotas import NodeLimits
from router.routing.registry import LocalEndpoints, T2Host

if TYPE_CHECKING:
    from router.cluster.local import OwnerRecorder

__all__ = ["FACTORY_KEY", "Runtime", "admin_oid", "channel_oid", "proxy_oid"]

log = logging.getLogger("nsjms.channel")

FACTORY_KEY = "NotifyEventChannelFactory"


def channel_oid(cid: int) -> str:
    return f"ch/{cid}"


def admin_oid(cid: int, side: str, aid: int) -> str:
    return f"ch/{cid}/{side}/{aid}"


def proxy_oid(cid: int, side: str, aid: int, pid: int) -> str:
    return f"ch/{cid}/{side}/{aid}/{pid}"


class Runtime:
    """Shared services for every servant of one node."""

    def __init__(self, orb: CORBA.ORB, db: Database, store: Store | None = None, *, push_timeout_ms: int = 10_000,
                 max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES, delivered: DeliveredJournals | None = None) -> None:
        self.orb = orb
        self.db = db                                # the node's pool: callers open units of work on it
        self.store = store if store is not None else Store()
        self.dead_letters = DeadLetterStore()       # events the channel gave up on (router.channel.deadletters)
        self.push_timeout_ms = push_timeout_ms
        self.max_event_bytes = max_event_bytes      # larger events are refused (IMP_LIMIT); 0 = no limit
        self.t2: T2Host | None = None               # NodeTransactions (router.routing.t2) of a node; None: no T2
        self.limits = NodeLimits()                  # [limits]: per-node quotas (router/quotas.py), set by the node
        self.delivered = delivered                  # push proxies' delivered-events journals; None: commit each
        self.owner: OwnerRecorder | None = None     # records this node as the owner of what it creates (cluster)
        self.accept_commits = GroupCommit(db, self.store, one_statement=True,   # accepted persistent events
                                          max_wait=float(getattr(db, "checkout_timeout", MAX_WAIT_S)))
        root = orb.resolve_initial_references("RootPOA")
        self.root_poa = root
        policies = [
            root.create_lifespan_policy(PortableServer.PERSISTENT),
            root.create_id_assignment_policy(PortableServer.USER_ID),
            root.create_request_processing_policy(PortableServer.USE_SERVANT_MANAGER),
        ]
        self.poa = root.create_POA("nsjms", root._get_the_POAManager(), policies)
        self.forwarder = Forwarder(orb)             # ids not active here: forwarded, retried or not found (cluster)
        self.poa.set_servant_manager(self.forwarder)
        self.ins_poa = orb.resolve_initial_references("omniINSPOA")
        self._seq = itertools.count(1)
        self._seq_lock = threading.Lock()
        self.shutting_down = threading.Event()
        self._threads: list[threading.Thread] = []
        #: this node's servants found by reference: bridge endpoints and their in-process ports (router.routing)
        self.endpoints = LocalEndpoints(self._local_servant)

    # -- ids and references --------------------------------------------------------------------------
    def set_seq_floor(self, floor: int) -> None:
        with self._seq_lock:
            self._seq = itertools.count(floor + 1)

    def raise_seq_floor(self, floor: int) -> None:
        """Like :meth:`set_seq_floor` but never lowers the next seq (a channel taken over from another node)."""
        with self._seq_lock:
            self._seq = itertools.count(max(next(self._seq), floor + 1))

    def next_seq(self) -> int:
        with self._seq_lock:
            return next(self._seq)

    def activate(self, oid: str, servant: PortableServer.Servant) -> Any:
        """Activate ``servant`` under ``oid`` (waiting out a request's incarnation of that id: Forwarder.activate)."""
        self.forwarder.activate(self.poa, oid.encode(), servant)
        return self.poa.id_to_reference(oid.encode())

    def reference(self, oid: str) -> Any:
        return self.poa.id_to_reference(oid.encode())

    def deactivate(self, oid: str) -> None:
        try:
            self.poa.deactivate_object(oid.encode())
        except PortableServer.POA.ObjectNotActive:
            pass

    def ior(self, obj: Any) -> str:
        return str(self.orb.object_to_string(obj))

    def resolve(self, ior: str) -> Any:
        return self.orb.string_to_object(ior)

    def _local_servant(self, ref: Any) -> object | None:
        """The servant behind ``ref`` if it lives in this node's persistent POA, else None (remote or inactive);
        callers ask :attr:`endpoints`."""
        if ref is None:
            return None
        try:
            servant: object = self.poa.reference_to_servant(ref)
            return servant
        except (PortableServer.POA.WrongAdapter, PortableServer.POA.ObjectNotActive, PortableServer.POA.WrongPolicy,
                CORBA.Exception):
            return None

    # -- threads --------------------------------------------------------------------------------------
    def spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """A daemon worker thread; exceptions are logged, never silently lost."""

        def run() -> None:
            try:
                target()
            except Exception:
                if not self.shutting_down.is_set():
                    log.exception("worker %s failed", name)

        t = threading.Thread(target=run, name=name, daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()]
        self._threads.append(t)
        t.start()
        return t

    def reap(self) -> int:
        """Delete the events queued by :meth:`Store.reap_later` in one statement; returns how many. When the unit
        of work fails the events are queued again (nothing depends on them meanwhile) and the error propagates."""
        ids = self.store.take_reap()
        if ids:
            try:
                with self.db.unit_of_work() as conn:
                    self.store.delete_events(conn, ids)
            except StoreError:
                self.store.reap_again(ids)
                raise
        return len(ids)

    def start_reaper(self, interval: float = 0.2) -> None:
        """Delete fully delivered persistent events in batches (see :meth:`Store.reap_later`)."""

        def loop() -> None:
            while not self.shutting_down.wait(interval):
                try:
                    self.reap()
                except Exception:
                    log.warning("could not delete delivered events; will retry", exc_info=True)
            self.reap()

        self.spawn("reaper", loop)

    def stop(self, timeout: float = 5.0) -> None:
        self.shutting_down.set()
        for t in list(self._threads):
            t.join(timeout / max(1, len(self._threads)))
